"""Rules that need every update of the round before aggregating: spilled to disk.

Each update is validated and written to its own memory-mapped file as it arrives
(:mod:`geofl.server.strategies.robust.spill`); :meth:`SpilledAccumulator.mean` runs the rule
over the files block by block, fills in every update's
:class:`~geofl.server.strategies.checks.UpdateCheck`, and returns the aggregate.

Every update counts once, whatever ``num_examples`` it claims: a weight is the client's own
word, and a robust rule must not let one client buy a majority. The rules act on every
coordinate, integer counters included (they are rounded back afterwards); norms and
distances in the reasons are over the whole update.

Breakdown points (``n`` updates, ``f`` of them Byzantine): median and trimmed mean need
``2f < n``; Krum ``n > 2f + 2``; multi-Krum also ``m <= n - f``; centered clipping is
analysed for ``f < n / 2`` (Karimireddy et al. 2021), and that is what is checked.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np

from geofl.protocols.types import Config, Weights, WeightsView
from geofl.server.strategies._numeric import F64Array
from geofl.server.strategies.checks import UpdateCheck
from geofl.server.strategies.errors import StrategyError, UpdateRejected
from geofl.server.strategies.robust import kernels
from geofl.server.strategies.robust.rule import RobustRule, state_vector
from geofl.server.strategies.robust.spill import ModelLayout, SpilledUpdates
from geofl.server.strategies.server_opt import check_range
from geofl.server.strategies.streaming import StreamingMean, TensorSpecLike

__all__ = [
    "CenteredClip",
    "CoordinateMedian",
    "DeferredRule",
    "Krum",
    "MultiKrum",
    "SpilledAccumulator",
    "TrimmedMean",
]

_INF = float("inf")


class DeferredRule(RobustRule):
    """A rule over all of a round's updates, read back from their files.

    Parameters
    ----------
    byzantine
        ``f``: how many of a round's updates may be malicious; the rule refuses to
        aggregate fewer updates than its breakdown point needs (:meth:`min_updates`).
    spill_dir
        Where the round's directory of update files is made; None: the system's temp dir.
    """

    def __init__(self, byzantine: int, spill_dir: Path | None = None) -> None:
        if isinstance(byzantine, bool) or not isinstance(byzantine, int) or byzantine < 0:
            raise ValueError(f"byzantine must be an integer >= 0, got {byzantine!r}")
        self.byzantine = byzantine
        self.spill_dir = spill_dir

    def accumulator(self, spec: Mapping[str, TensorSpecLike]) -> SpilledAccumulator:
        """An accumulator spilling each update to disk, aggregated by this rule."""
        return SpilledAccumulator(spec, self, self.spill_dir)

    def hyperparameters(self) -> Config:
        """``{"byzantine": f}``."""
        return {"byzantine": self.byzantine}

    @abstractmethod
    def aggregate(self, spill: SpilledUpdates, checks: Sequence[UpdateCheck]) -> F64Array:
        """The aggregate of the spilled updates as a flat float64 vector; fills ``checks``
        (one per update, in file order) with what the rule made of each."""


class SpilledAccumulator(StreamingMean):
    """A round's accumulator for a :class:`DeferredRule`: validate, spill, aggregate at the end.

    The running float64 sums of :class:`StreamingMean` are allocated (validation uses its
    spec) but never written, so their pages are never touched and cost no memory.
    """

    def __init__(
        self, spec: Mapping[str, TensorSpecLike], rule: DeferredRule, parent: Path | None
    ) -> None:
        super().__init__(spec)
        self._rule = rule
        self._spill = SpilledUpdates(ModelLayout(spec), parent)
        self._checks: dict[int, UpdateCheck] = {}

    @property
    def directory(self) -> Path:
        """Where this round's update files are."""
        return self._spill.directory

    def add(self, update: WeightsView, weight: float) -> UpdateCheck:
        """Validate one update and write it to its file; its check is filled in at :meth:`mean`.

        Raises
        ------
        UpdateRejected
            As :meth:`StreamingMean.add`; nothing is written then.
        """
        self.validate(update, weight)
        check = UpdateCheck(self._rule.name)
        try:
            index = self._spill.append(update)
        except OSError as exc:  # the server's disk, not the client: the round goes on
            raise UpdateRejected(f"the server could not spill the update to disk: {exc}") from exc
        with self._lock:
            self._checks[index] = check
            self.count += 1
            self.total_weight += 1.0
        return check

    def mean(self) -> Weights:
        """The rule's aggregate of every update written so far, in the model's dtypes.

        Raises
        ------
        StrategyError
            If fewer updates arrived than the rule's breakdown point needs.
        """
        with self._lock:
            n, needed = len(self._checks), self._rule.min_updates()
            if n != len(self._spill):
                raise StrategyError(f"{n} updates checked but {len(self._spill)} spilled")
            if n < needed:
                raise StrategyError(
                    f"{self._rule.name} with byzantine={self._rule.byzantine} needs at least "
                    f"{needed} updates, the round has {n}"
                )
            checks = [self._checks[i] for i in range(n)]
            vector = self._rule.aggregate(self._spill, checks)
            return self._spill.layout.unflatten(vector)

    def close(self) -> None:
        """Delete the round's update files."""
        self._spill.close()


def _square_norms(spill: SpilledUpdates) -> F64Array:
    """Each update's squared L2 norm (one pass over the files)."""
    norms = np.zeros(len(spill), dtype=np.float64)
    for part in spill.parts():
        block = spill.block(part)
        norms += np.einsum("ij,ij->i", block, block)
    return norms


class _Trimming(DeferredRule):
    """Coordinate-wise rules: a reduction of each coordinate over the updates."""

    def aggregate(self, spill: SpilledUpdates, checks: Sequence[UpdateCheck]) -> F64Array:
        n = len(spill)
        trim = self._trim(n)
        out = np.empty(spill.layout.size, dtype=np.float64)
        cut = np.zeros(n, dtype=np.int64)
        norms = np.zeros(n, dtype=np.float64)
        for part in spill.parts():
            block = spill.block(part)
            out[part] = self._reduce(block, trim)
            cut += kernels.cut_counts(block, trim)
            norms += np.einsum("ij,ij->i", block, block)
        size = max(spill.layout.size, 1)
        for check, count, square in zip(checks, cut, norms, strict=True):
            check.norm = float(np.sqrt(square))
            if count:
                share = f"{count / size:.0%}"
                check.reason = f"{self.name}: {self._cut_words(trim)} in {share} of coordinates"
        return out

    @abstractmethod
    def _trim(self, n: int) -> int:
        """Values dropped from each end of a coordinate, for ``n`` updates."""

    @abstractmethod
    def _reduce(self, block: F64Array, trim: int) -> F64Array:
        """The block's reduction to one value per coordinate."""

    @abstractmethod
    def _cut_words(self, trim: int) -> str:
        """How a reason says the update's value was not used."""

    def min_updates(self) -> int:
        """``2f + 1``: a majority of honest values in every coordinate."""
        return 2 * self.byzantine + 1


class CoordinateMedian(_Trimming):
    """The coordinate-wise median (Yin et al. 2018). Memory: one block; disk ``8 P n``."""

    name: ClassVar[str] = "median"

    def _trim(self, n: int) -> int:
        return (n - 1) // 2

    def _reduce(self, block: F64Array, trim: int) -> F64Array:
        return kernels.coordinate_median(block)

    def _cut_words(self, trim: int) -> str:
        return "not a middle value"


class TrimmedMean(_Trimming):
    """The coordinate-wise mean after dropping the ``f`` largest and ``f`` smallest values
    (Yin et al. 2018). Memory: one block; disk ``8 P n``."""

    name: ClassVar[str] = "trimmed_mean"

    def _trim(self, n: int) -> int:
        return self.byzantine

    def _reduce(self, block: F64Array, trim: int) -> F64Array:
        return kernels.trimmed_mean(block, trim)

    def _cut_words(self, trim: int) -> str:
        return f"cut as one of the {trim} largest or smallest values"


class MultiKrum(DeferredRule):
    """Multi-Krum (Blanchard et al. 2017; El Mhamdi et al. 2018): average the ``select``
    updates with the lowest Krum scores; the others are left out of the round.

    Parameters
    ----------
    byzantine
        ``f``, as in :class:`DeferredRule`.
    select
        ``m``: how many updates to average; None means ``n - f`` of the round's ``n``.

    Memory: the ``n x n`` distance matrix plus one block; disk ``8 P n``; two passes.
    """

    name: ClassVar[str] = "multi_krum"

    def __init__(
        self, byzantine: int, select: int | None = None, spill_dir: Path | None = None
    ) -> None:
        super().__init__(byzantine, spill_dir)
        if select is not None and (isinstance(select, bool) or select < 1):
            raise ValueError(f"select must be an integer >= 1 or null, got {select!r}")
        self.select = select

    def hyperparameters(self) -> Config:
        """``byzantine``, and ``select`` when it is set (left out: ``n - f``)."""
        params = super().hyperparameters()
        if self.select is not None:
            params["select"] = self.select
        return params

    def min_updates(self) -> int:
        """``max(2f + 3, m + f)``: Krum's ``n > 2f + 2``, and ``m`` of the ``n - f`` honest."""
        return max(2 * self.byzantine + 3, (self.select or 1) + self.byzantine)

    def aggregate(self, spill: SpilledUpdates, checks: Sequence[UpdateCheck]) -> F64Array:
        n = len(spill)
        distances = np.zeros((n, n), dtype=np.float64)
        for part in spill.parts():
            kernels.accumulate_square_distances(spill.block(part), distances)
        scores = kernels.krum_scores(distances, self.byzantine)
        select = self.select or n - self.byzantine
        chosen = kernels.krum_selection(scores, select)
        ranks = np.argsort(np.argsort(scores, kind="stable"), kind="stable") + 1
        for index, check in enumerate(checks):
            if index not in chosen:
                check.leave_out(
                    f"{self.name}: not selected, score {scores[index]:.4g} ranks "
                    f"{ranks[index]} of {n} (the {select} lowest are averaged)"
                )
        out = np.empty(spill.layout.size, dtype=np.float64)
        for part in spill.parts():
            out[part] = spill.block(part, chosen).mean(axis=0)
        for check, square in zip(checks, _square_norms(spill), strict=True):
            check.norm = float(np.sqrt(square))
        return out


class Krum(MultiKrum):
    """Krum (Blanchard et al. 2017): the one update with the lowest score is the aggregate."""

    name: ClassVar[str] = "krum"

    def __init__(self, byzantine: int, spill_dir: Path | None = None) -> None:
        super().__init__(byzantine, select=1, spill_dir=spill_dir)

    def hyperparameters(self) -> Config:
        """``{"byzantine": f}``."""
        return {"byzantine": self.byzantine}


class CenteredClip(DeferredRule):
    """Centered clipping (Karimireddy et al. 2021, "Learning from History for Byzantine
    Robust Optimization"): starting from the previous round's aggregate ``v``, repeat
    ``v <- v + mean_i(clip(x_i - v, radius))``.

    Each update can pull the centre at most ``radius / n`` per iteration, so a group of
    small colluding perturbations ("a little is enough") is bounded as much as one large
    one; the history (the centre carried over from round to round, checkpointed) is what
    the paper shows is needed against such time-coupled attacks.

    Parameters
    ----------
    radius
        ``tau``: the clipping radius around the centre, > 0.
    iterations
        ``L``: clipping iterations per round, >= 1.
    byzantine
        ``f``, as in :class:`DeferredRule` (checked against ``f < n / 2``).

    Memory: two model-sized float64 vectors (centre and next centre) plus one block;
    disk ``8 P n``; ``2 L`` passes over the files.
    """

    name: ClassVar[str] = "centered_clip"
    STATE_KEY: ClassVar[str] = "center"

    def __init__(
        self,
        radius: float,
        iterations: int = 3,
        byzantine: int = 0,
        spill_dir: Path | None = None,
    ) -> None:
        super().__init__(byzantine, spill_dir)
        self.radius = check_range("radius", radius, 0.0, _INF, low_open=True, high_open=True)
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
            raise ValueError(f"iterations must be an integer >= 1, got {iterations!r}")
        self.iterations = iterations
        self._center: F64Array | None = None
        self._layout: ModelLayout | None = None

    def accumulator(self, spec: Mapping[str, TensorSpecLike]) -> SpilledAccumulator:
        """As :class:`DeferredRule`; remembers the layout to keep the centre in."""
        self._layout = ModelLayout(spec)
        return super().accumulator(spec)

    def hyperparameters(self) -> Config:
        """``radius``, ``iterations`` and ``byzantine``."""
        return {"radius": self.radius, "iterations": self.iterations, **super().hyperparameters()}

    def min_updates(self) -> int:
        """``2f + 1``: an honest majority."""
        return 2 * self.byzantine + 1

    def aggregate(self, spill: SpilledUpdates, checks: Sequence[UpdateCheck]) -> F64Array:
        center = self._start(spill.layout.size)
        factors = np.ones(len(spill), dtype=np.float64)
        distances = np.zeros(len(spill), dtype=np.float64)
        for _ in range(self.iterations):
            distances = self._distances(spill, center)
            factors = kernels.clip_factors(distances, self.radius)
            moved = np.empty_like(center)
            for part in spill.parts():
                offsets = spill.block(part) - center[part]
                moved[part] = center[part] + (offsets * factors[:, None]).mean(axis=0)
            center = moved
        for check, square, distance, factor in zip(
            checks, _square_norms(spill), distances, factors, strict=True
        ):
            check.norm = float(np.sqrt(square))
            if factor < 1.0:
                check.shrink(
                    float(factor),
                    f"{self.name}: {distance:.4g} from the centre, clipped to radius "
                    f"{self.radius:.4g} (weight {factor:.3g})",
                )
        return center

    def _start(self, size: int) -> F64Array:
        """The centre the round starts from: the last aggregate, or zero."""
        if self._center is None:
            return np.zeros(size, dtype=np.float64)
        if self._center.size != size:
            raise StrategyError(
                f"{self.name}: the saved centre has {self._center.size} values, the model {size}"
            )
        return self._center.copy()

    @staticmethod
    def _distances(spill: SpilledUpdates, center: F64Array) -> F64Array:
        square = np.zeros(len(spill), dtype=np.float64)
        for part in spill.parts():
            offsets = spill.block(part) - center[part]
            square += np.einsum("ij,ij->i", offsets, offsets)
        return np.asarray(np.sqrt(square), dtype=np.float64)

    def commit(self, mean_delta: WeightsView) -> None:
        """The applied aggregate is the next round's centre (the rule's history)."""
        if self._layout is not None:
            self._center = self._layout.flatten(mean_delta)

    def state(self) -> Weights:
        """``{"center": v}`` once a round was applied."""
        return {} if self._center is None else {self.STATE_KEY: self._center.copy()}

    def load_state(self, state: WeightsView) -> None:
        """Resume from the saved centre (``{}``: from zero)."""
        self._center = state_vector(state, self.STATE_KEY)
