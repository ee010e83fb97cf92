"""The parameters every participant of one secure-aggregation round agrees on."""

from __future__ import annotations

import math
from dataclasses import dataclass

from geofl.protocols.secagg.errors import SecAggError
from geofl.protocols.secagg.graph import check_cohort, graph_degree, neighbours
from geofl.protocols.secagg.ring import RingQuantizer, check_ring_bits

_U64_LIMIT = 1 << 64


def _check_u64(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _U64_LIMIT:
        raise SecAggError(f"{name} must be an int in 0..2**64-1, got {value!r}")


@dataclass(frozen=True)
class SecAggParams:
    """One round's SecAgg+ configuration, sent by the server to every selected client.

    ``cohort`` holds the selected node ids (stored sorted; duplicates are an error).
    ``degree`` is the requested neighbourhood size (``>= len(cohort) - 1``: complete
    graph; see :func:`~geofl.protocols.secagg.graph.graph_degree`).  ``threshold`` is
    how many of a client's share holders (its neighbours and itself) must reveal to
    reconstruct its secrets: ``2 .. effective_degree + 1``.  ``clip`` and
    ``ring_bits`` configure the :class:`RingQuantizer`.
    """

    run_id: int
    round: int
    cohort: tuple[int, ...]
    threshold: int
    degree: int
    graph_seed: bytes
    clip: float
    ring_bits: int

    def __post_init__(self) -> None:
        _check_u64("run_id", self.run_id)
        _check_u64("round", self.round)
        if not isinstance(self.cohort, tuple | list):
            raise SecAggError(f"cohort must be a tuple of node ids, got {type(self.cohort)}")
        check_cohort(self.cohort)
        object.__setattr__(self, "cohort", tuple(sorted(self.cohort)))
        check_ring_bits(self.ring_bits)
        if not isinstance(self.clip, int | float) or not math.isfinite(self.clip):
            raise SecAggError(f"clip must be a finite number, got {self.clip!r}")
        object.__setattr__(self, "clip", float(self.clip))
        self.quantizer()  # checks clip > 0 and that the cohort fits in the ring
        self.neighbourhoods()  # checks node ids, duplicates, degree and the seed
        self._check_threshold()

    def _check_threshold(self) -> None:
        holders = self.effective_degree + 1
        valid = isinstance(self.threshold, int) and not isinstance(self.threshold, bool)
        if not valid or not 2 <= self.threshold <= holders:
            raise SecAggError(
                f"threshold must be an int in 2..{holders} (degree {self.effective_degree} "
                f"neighbours + the client itself), got {self.threshold!r}"
            )

    @property
    def effective_degree(self) -> int:
        """How many neighbours each client really has."""
        return graph_degree(len(self.cohort), self.degree)

    def neighbourhoods(self) -> dict[int, frozenset[int]]:
        """Every cohort member's neighbours (itself excluded)."""
        return neighbours(self.cohort, self.degree, self.graph_seed)

    def quantizer(self) -> RingQuantizer:
        """The fixed-point encoding shared by clients and server."""
        return RingQuantizer(self.clip, self.ring_bits, len(self.cohort))


__all__ = ["SecAggParams"]
