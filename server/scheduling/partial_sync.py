"""Which layers a partial-sync round sends after which segment of local steps.

A round with ``N`` sync points sends layer group ``k`` after segment ``k`` of the
client's H local steps; groups ``1 ... N-1`` travel while training goes on, group ``N``
after the last step. Two things pull on the grouping (DreamDDP's trade-off):

* **bytes per sync**: a group's transfer hides behind the remaining segments only if it
  is not much larger than the others, so groups are cut to near-equal bytes;
* **divergence**: a layer sent early leaves the rest of the round's progress on it to
  the client's next upload, so the layers that moved least in the last outer steps
  (relative change ``||w_new - w_old|| / ||w_old||``, smoothed) are sent first and the
  fast-moving ones last, when they are freshest.

An explicit schedule (``schedule.partial_sync.groups``) replaces the planning; it is
checked against the model before the first round, so a layer it would never
synchronize is an error, not a silent hole.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping, Sequence

import numpy as np

from geofl.protocols import partial_sync
from geofl.protocols.errors import GeoflError
from geofl.protocols.partial_sync import Groups
from geofl.protocols.tensors import ModelSpec
from geofl.protocols.types import Config, Scalar, WeightsView

__all__ = ["LayerSyncPlanner", "PartialSyncError", "balanced_groups", "resolve_groups"]

#: Weight of the newest observation in the smoothed drift.
DRIFT_SMOOTHING = 0.5


class PartialSyncError(GeoflError, ValueError):
    """A partial-sync schedule that cannot work for this model."""


def balanced_groups(
    spec: ModelSpec,
    points: int,
    drift: Mapping[str, float],
    setting: str = "schedule.partial_sync.sync_points",
) -> Groups:
    """``points`` groups of near-equal bytes, least-drifting tensors first.

    Tensors are ordered by drift (unknown drift counts as 0; ties keep model order) and
    the order is cut greedily: a group closes once it reaches its fair share of the bytes
    still unassigned, and never takes tensors the remaining groups need. With no drift
    the groups are consecutive runs of the model's tensors. ``setting`` names the
    configuration key an error message points to.

    Raises
    ------
    PartialSyncError
        If the model has fewer tensors than ``points``.
    """
    if points < 1:
        raise PartialSyncError(f"sync points must be >= 1, got {points}")
    if len(spec) < points:
        raise PartialSyncError(
            f"the model has {len(spec)} tensors, too few for {points} sync groups; "
            f"set {setting} to at most {len(spec)}"
        )
    order = sorted(range(len(spec)), key=lambda i: (drift.get(spec[i].name, 0.0), i))
    remaining_bytes = sum(t.nbytes for t in spec)
    groups: list[tuple[str, ...]] = []
    current: list[str] = []
    current_bytes = 0
    for position, index in enumerate(order):
        tensor = spec[index]
        current.append(tensor.name)
        current_bytes += tensor.nbytes
        groups_left = points - len(groups)
        tensors_left = len(order) - position - 1
        share = remaining_bytes / groups_left
        must_close = tensors_left == groups_left - 1
        if groups_left > 1 and (current_bytes >= share or must_close):
            groups.append(tuple(current))
            remaining_bytes -= current_bytes
            current, current_bytes = [], 0
    groups.append(tuple(current))
    return tuple(groups)


def resolve_groups(
    spec: ModelSpec,
    patterns: Sequence[Sequence[str]],
    setting: str = "schedule.partial_sync.groups",
) -> Groups:
    """Explicit groups of name patterns, resolved against the model's tensors.

    ``setting`` names the configuration key an error message points to.

    Raises
    ------
    PartialSyncError
        If a pattern matches no tensor, a tensor matches two groups, or a tensor matches
        none (the schedule would never synchronize it).
    """
    names = [tensor.name for tensor in spec]
    owner: dict[str, int] = {}
    for index, group in enumerate(patterns):
        for pattern in group:
            matched = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
            if not matched:
                raise PartialSyncError(
                    f"{setting}[{index}]: pattern {pattern!r} matches no "
                    f"tensor of the model (tensors: {names})"
                )
            for name in matched:
                if owner.get(name, index) != index:
                    raise PartialSyncError(
                        f"{setting}: tensor {name!r} matches groups "
                        f"{owner[name]} and {index}; each tensor is synced once per round"
                    )
                owner[name] = index
    never = [name for name in names if name not in owner]
    if never:
        raise PartialSyncError(
            f"{setting} never synchronizes tensors {never}: add them "
            "to a group (or leave groups out to have them planned)"
        )
    return tuple(
        tuple(name for name in names if owner[name] == index) for index in range(len(patterns))
    )


class LayerSyncPlanner:
    """The groups of each round: explicit, or re-planned from the observed drift.

    Parameters
    ----------
    points
        Sync points per round (groups).
    patterns
        Explicit groups of tensor-name patterns, or None to plan.
    keep_local
        Whether clients keep what a layer learns after it was sent, for their next upload.
    tail_steps
        Steps between the sync points at the end of the round
        (:func:`~geofl.protocols.partial_sync.tail_segments`); None splits H evenly.
    """

    def __init__(
        self,
        points: int,
        patterns: Sequence[Sequence[str]] | None = None,
        *,
        keep_local: bool = True,
        tail_steps: int | None = None,
    ) -> None:
        if patterns is not None and len(patterns) != points:
            raise PartialSyncError(f"{len(patterns)} explicit groups for {points} sync points")
        self.points = points
        self.keep_local = keep_local
        self.tail_steps = tail_steps
        self._patterns = patterns
        self._drift: dict[str, float] = {}

    @property
    def drift(self) -> dict[str, float]:
        """Smoothed relative change per tensor over the observed outer steps."""
        return dict(self._drift)

    def groups(self, spec: ModelSpec) -> Groups:
        """This round's groups for a model of ``spec``."""
        if self._patterns is not None:
            return resolve_groups(spec, self._patterns)
        return balanced_groups(spec, self.points, self._drift)

    def round_config(self, spec: ModelSpec, base_config: Mapping[str, Scalar]) -> Config:
        """The config keys of a partially synchronized round (groups, steps, keep-local).

        Raises
        ------
        PartialSyncError
            If the base config has no integer ``local_steps`` or too few for the segments.
        """
        config: Config = {
            partial_sync.CONFIG_KEY: partial_sync.encode_groups(self.groups(spec)),
            partial_sync.KEEP_LOCAL_KEY: self.keep_local,
        }
        if self.tail_steps is not None:
            steps = base_config.get("local_steps")
            if isinstance(steps, bool) or not isinstance(steps, int):
                raise PartialSyncError(f"partial sync needs integer local_steps, got {steps!r}")
            try:
                segments = partial_sync.tail_segments(steps, self.points, self.tail_steps)
            except ValueError as exc:
                raise PartialSyncError(str(exc)) from exc
            config[partial_sync.STEPS_KEY] = json.dumps(segments)
        return config

    def observe(self, old: WeightsView, new: WeightsView) -> None:
        """Learn each tensor's relative change from one outer step."""
        for name, before in old.items():
            if name not in new or np.asarray(before).dtype.kind != "f":
                continue
            base = np.asarray(before, dtype=np.float64)
            change = float(np.linalg.norm(np.asarray(new[name], dtype=np.float64) - base))
            relative = change / (float(np.linalg.norm(base)) + 1e-12)
            previous = self._drift.get(name)
            self._drift[name] = (
                relative
                if previous is None
                else DRIFT_SMOOTHING * relative + (1 - DRIFT_SMOOTHING) * previous
            )
