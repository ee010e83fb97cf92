"""Which fragment of the model each Streaming DiLoCo round synchronizes.

The fragments are fixed for the run (each one's outer momentum and each client's local
copy are tied to its tensors): explicit groups of name patterns
(``schedule.streaming.groups``), or the model's tensors in order, cut into ``P`` runs of
near-equal bytes (the paper's sequential fragments). Round ``r`` synchronizes fragment
``(r - 1) mod P``, so every fragment has its outer step every ``P`` rounds, that is every
``H`` inner steps, staggered by ``H / P`` steps (:mod:`geofl.protocols.streaming`).
"""

from __future__ import annotations

from collections.abc import Sequence

from geofl.protocols import streaming
from geofl.protocols.errors import GeoflError
from geofl.protocols.partial_sync import Groups
from geofl.protocols.tensors import ModelSpec
from geofl.protocols.types import Config
from geofl.server.scheduling.partial_sync import PartialSyncError, balanced_groups, resolve_groups

__all__ = ["FragmentSchedule", "StreamingError"]


class StreamingError(GeoflError, ValueError):
    """A Streaming DiLoCo schedule that cannot work for this model."""


class FragmentSchedule:
    """The fragments of a run and the round config that names each round's one.

    Parameters
    ----------
    fragments
        P, the number of fragments (>= 1).
    stride
        Inner steps per round, H / P.
    overlap
        Inner steps trained while a fragment's upload is in flight (< stride).
    alpha
        Weight of the local values when the global fragment is merged, in [0, 1].
    patterns
        Explicit fragments as lists of tensor-name patterns, or None for sequential ones.
    """

    def __init__(
        self,
        fragments: int,
        stride: int,
        overlap: int,
        alpha: float,
        patterns: Sequence[Sequence[str]] | None = None,
    ) -> None:
        if fragments < 1 or stride < 1 or not 0 <= overlap < stride or not 0 <= alpha <= 1:
            raise StreamingError(
                f"streaming schedule needs fragments >= 1, stride >= 1, 0 <= overlap < "
                f"stride and alpha in [0, 1]; got {fragments}, {stride}, {overlap}, {alpha}"
            )
        if patterns is not None and len(patterns) != fragments:
            raise StreamingError(f"{len(patterns)} explicit fragments for {fragments} fragments")
        self.fragments = fragments
        self.stride = stride
        self.overlap = overlap
        self.alpha = alpha
        self._patterns = patterns
        self._planned: tuple[ModelSpec, Groups] | None = None

    def groups(self, spec: ModelSpec) -> Groups:
        """The run's fragments for a model of ``spec``; every tensor in exactly one.

        Raises
        ------
        StreamingError
            If explicit patterns miss, repeat or leave out tensors, or the model has
            fewer tensors than fragments.
        """
        if self._planned is not None and self._planned[0] == spec:
            return self._planned[1]
        try:
            if self._patterns is not None:
                groups = resolve_groups(spec, self._patterns, "schedule.streaming.groups")
            else:
                groups = balanced_groups(spec, self.fragments, {}, "schedule.streaming.fragments")
        except PartialSyncError as exc:
            raise StreamingError(str(exc)) from exc
        self._planned = (spec, groups)
        return groups

    def index(self, server_round: int) -> int:
        """The fragment round ``server_round`` (from 1) synchronizes."""
        return (server_round - 1) % self.fragments

    def fragment(self, spec: ModelSpec, server_round: int) -> tuple[str, ...]:
        """The tensor names round ``server_round`` synchronizes."""
        return self.groups(spec)[self.index(server_round)]

    def round_config(self, spec: ModelSpec, server_round: int) -> Config:
        """The config keys of round ``server_round`` (its fragment, the one to merge, steps)."""
        groups = self.groups(spec)
        merge = groups[self.index(server_round - 1)] if server_round > 1 else ()
        return {
            streaming.FRAGMENT_KEY: streaming.encode_names(groups[self.index(server_round)]),
            streaming.MERGE_KEY: streaming.encode_names(merge),
            streaming.OVERLAP_KEY: self.overlap,
            streaming.ALPHA_KEY: self.alpha,
            "local_steps": self.stride,
        }
