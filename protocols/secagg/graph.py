"""The SecAgg+ communication graph: a Harary graph over a seeded permutation of the cohort.

Bell et al. (CCS 2020, "Secure Single-Server Aggregation with (Poly)Logarithmic
Overhead") replace the complete graph of Bonawitz et al. (CCS 2017) by a random
``k``-regular graph with ``k = O(log n)``: each client shares keys and masks only with
its ``k`` neighbours.  We place the cohort on a ring in an order given by
``SHA-256(seed || node id)`` and join every client to the ``k/2`` nearest on each
side (and, for odd ``k``, the opposite client).  Anyone with the seed can recompute
the graph, so a client checks that the server's roster is really its neighbourhood.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cryptography.hazmat.primitives import hashes

from geofl.protocols.secagg.errors import SecAggError

#: Seeds shorter than this make the permutation guessable.
MIN_SEED_BYTES = 16


def graph_degree(cohort_size: int, degree: int) -> int:
    """The degree every node actually gets for a requested ``degree``.

    ``degree >= cohort_size - 1`` is the complete graph.  An odd degree over an odd
    number of nodes cannot be regular (the degree sum would be odd), so it is
    rounded up to the next even number.  Degree 1 is refused for more than two
    clients: the graph would fall apart into pairs, and the server learns the sum of
    every connected component (degree >= 2 gives a connected, 2-connected graph).
    """
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise SecAggError(f"degree must be an int >= 1, got {degree!r}")
    if degree >= cohort_size - 1:
        return cohort_size - 1
    if degree == 1:
        raise SecAggError(
            f"degree 1 splits {cohort_size} clients into pairs, and the server would learn "
            "each pair's sum: use degree >= 2"
        )
    if degree % 2 and cohort_size % 2:
        return degree + 1
    return degree


def _ring_order(cohort: Sequence[int], seed: bytes) -> list[int]:
    def rank(node: int) -> tuple[bytes, int]:
        digest = hashes.Hash(hashes.SHA256())
        digest.update(seed + node.to_bytes(8, "big"))
        return digest.finalize(), node

    return sorted(cohort, key=rank)


def check_cohort(cohort: Sequence[int]) -> None:
    """A clear error unless ``cohort`` holds at least two distinct ids in 1..2**64-1."""
    for node in cohort:
        if isinstance(node, bool) or not isinstance(node, int) or not 0 < node < 1 << 64:
            raise SecAggError(f"node id {node!r} must be an int in 1..2**64-1")
    if len(set(cohort)) != len(cohort):
        duplicates = sorted({node for node in cohort if list(cohort).count(node) > 1})
        raise SecAggError(f"duplicate node ids in the cohort: {duplicates}")
    if len(cohort) < 2:
        raise SecAggError("a cohort needs at least 2 clients")


def neighbours(cohort: Sequence[int], degree: int, seed: bytes) -> dict[int, frozenset[int]]:
    """Each node's neighbours (itself excluded) in the seeded Harary graph."""
    check_cohort(cohort)
    if not isinstance(seed, bytes) or len(seed) < MIN_SEED_BYTES:
        raise SecAggError(f"graph_seed must be at least {MIN_SEED_BYTES} bytes")
    size = len(cohort)
    actual = graph_degree(size, degree)
    if actual == size - 1:
        everyone = frozenset(cohort)
        return {node: everyone - {node} for node in cohort}
    order = _ring_order(cohort, seed)
    offsets = list(range(1, actual // 2 + 1))
    offsets += [-offset for offset in offsets]
    if actual % 2:
        offsets.append(size // 2)
    return {
        node: frozenset(order[(index + offset) % size] for offset in offsets)
        for index, node in enumerate(order)
    }


def recommended_degree(cohort_size: int) -> int:
    """A neighbourhood size ``k`` for ``cohort_size`` clients: ``2 * ceil(1.5 * log2 n)``.

    Bell et al. prove that ``k = O(log n)`` keeps the protocol secure and correct
    against a constant fraction of corrupt and dropped clients; the constant depends on
    the security and correctness parameters and on those fractions, and their concrete
    parameters are larger for strong guarantees (about 3 % of 10**4 clients in the
    semi-malicious setting with 5 % corrupt and 5 % dropped).  This heuristic (about
    ``3 log2 n``, even, at most ``n - 1``) targets moderate dropout in the
    honest-but-curious setting; pass an explicit degree when a proven bound is needed.
    """
    if isinstance(cohort_size, bool) or not isinstance(cohort_size, int) or cohort_size < 2:
        raise SecAggError(f"cohort size must be an int >= 2, got {cohort_size!r}")
    return min(cohort_size - 1, 2 * math.ceil(1.5 * math.log2(cohort_size)))


def recommended_threshold(degree: int, fraction: float = 0.5) -> int:
    """Shares needed to reconstruct: more than ``fraction`` of the ``degree + 1`` holders.

    Every client shares its secrets with its ``degree`` neighbours and itself.  A
    strict majority (``fraction = 1/2``) is the usual honest-but-curious choice; a
    larger fraction (e.g. 2/3) guards better against a server that lies about who
    dropped, at the cost of tolerating fewer dropouts.  The result is clamped to
    ``2 .. degree + 1``.
    """
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise SecAggError(f"degree must be an int >= 1, got {degree!r}")
    if not 0.0 < fraction < 1.0:
        raise SecAggError(f"fraction must be in (0, 1), got {fraction!r}")
    return max(2, min(degree + 1, math.floor(fraction * (degree + 1)) + 1))


__all__ = [
    "MIN_SEED_BYTES",
    "check_cohort",
    "graph_degree",
    "neighbours",
    "recommended_degree",
    "recommended_threshold",
]
