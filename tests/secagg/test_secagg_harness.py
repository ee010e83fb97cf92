"""An in-process SecAgg+ round: real clients and server, dropouts per stage (no tests here).

``drops`` maps a stage to the nodes that vanish there:

- ``"advertise"``: never advertise keys;
- ``"share"``: advertised, never send shares;
- ``"receive"``: sent shares, gone before receiving the inbox;
- ``"mask"``: received shares, never upload a masked vector;
- ``"unmask"``: uploaded, never reveal.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from geofl.client.secagg import SecAggClient
from geofl.protocols.secagg import SecAggParams
from geofl.server.rounds.secagg import SecAggServer

DROP_STAGES = ("advertise", "share", "receive", "mask", "unmask")
SEED = bytes(range(32))


def make_params(
    size: int, degree: int, threshold: int, *, ring_bits: int = 24, clip: float = 1.0
) -> SecAggParams:
    """Parameters for nodes 101..100+size, with a fixed graph seed."""
    return SecAggParams(
        run_id=9,
        round=4,
        cohort=tuple(range(101, 101 + size)),
        threshold=threshold,
        degree=degree,
        graph_seed=SEED,
        clip=clip,
        ring_bits=ring_bits,
    )


def make_vectors(
    params: SecAggParams, length: int, seed: int = 0
) -> dict[int, npt.NDArray[np.float64]]:
    """Per node, a vector partly beyond ``clip`` so that clipping matters."""
    rng = np.random.default_rng(seed)
    return {node: rng.normal(0.0, params.clip, length) for node in params.cohort}


@dataclass
class Round:
    """What one simulated round produced."""

    clients: dict[int, SecAggClient]
    server: SecAggServer
    survivors: frozenset[int] = frozenset()
    dropped: frozenset[int] = frozenset()
    total: npt.NDArray[np.float64] | None = None
    trace: list[str] = field(default_factory=list)


def _gone(drops: Mapping[str, Collection[int]], *stages: str) -> set[int]:
    return {node for stage in stages for node in drops.get(stage, ())}


def run_round(
    params: SecAggParams,
    vectors: Mapping[int, npt.NDArray[np.float64]],
    drops: Mapping[str, Collection[int]] | None = None,
) -> Round:
    """Drive every stage; SecAggAbortError from the server propagates to the caller."""
    drops = drops or {}
    clients = {n: SecAggClient(n, params, rng=np.random.default_rng(n)) for n in params.cohort}
    result = Round(clients, SecAggServer(params))
    server = result.server
    for node, client in clients.items():
        if node not in _gone(drops, "advertise"):
            server.add_keys(node, client.advertise())
    for node, roster in server.close_advertise().items():
        if node not in _gone(drops, "share"):
            server.add_shares(node, clients[node].share_keys(roster))
    for node, inbox in server.close_sharing().items():
        if node in _gone(drops, "receive"):
            continue
        clients[node].receive_shares(inbox)
        if node not in _gone(drops, "mask"):
            server.add_masked(node, clients[node].mask(vectors[node]))
    result.survivors, result.dropped = server.close_masking()
    for node in sorted(result.survivors - _gone(drops, "unmask")):
        server.add_reveal(node, clients[node].reveal(result.survivors, result.dropped))
    result.total = server.finish()
    return result


def clipped_sum(
    params: SecAggParams, vectors: Mapping[int, npt.NDArray[np.float64]], nodes: Collection[int]
) -> npt.NDArray[np.float64]:
    """The exact sum the protocol approximates."""
    total = np.zeros_like(next(iter(vectors.values())))
    for node in nodes:
        total += np.clip(vectors[node], -params.clip, params.clip)
    return total
