"""Buffered asynchronous rounds (FedBuff; Nguyen et al., AISTATS 2022).

Clients train all the time: ``schedule.fedbuff.concurrency`` fit tasks are in flight,
each on the model version that was current when it was handed out, and whenever one
settles another idle client (a seeded choice) gets a task on the current version. An
arriving update is folded into the buffer of the next version at once, weighted by
``num_examples x discount(s)`` where the staleness ``s`` is how many versions were
applied since its task was handed out; an update more than ``staleness.max`` versions
behind is recorded ``late`` and not folded. After ``buffer_size`` (K) accepted updates
the strategy takes its server step from

    delta = sum_i n_i d(s_i) delta_i / sum_i n_i

that is, FedBuff's discount is absolute: the weight a stale update loses goes to a zero
delta (the current model), so a buffer of stale updates moves the model less, instead of
being renormalised away. The new version is published and recorded as round ``v``:

    FIT (the buffer filling) -> AGGREGATE -> BROADCAST (publishing v) -> EVALUATE -> COMMIT

An update never waits for a cohort. A failed, rejected, dropped or timed-out task is
recorded and its slot goes to another client; a client whose task failed, was
rejected or was dropped sits out until the next version (so a client that fails at once,
or flaps off and on, cannot be handed task after task in no time).
If every idle client has failed in the current version and nothing is in flight, the
version's round fails as a synchronous round does: nothing applied, the model is
republished under the next number.

Secure aggregation runs over the buffer in groups: K clients run the SecAgg+ stages
together (advertise, share, a masked fit on one model version, unmask), so the server
learns only the group's sum; the group's sum is the buffer of one version and the
discount of its single staleness applies to that sum. ``concurrency // K`` groups are in
flight (at least one).

See docs/async.md for the design, the recorded rows and what relays need (nothing).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geofl.protocols.compression import UploadPlan
from geofl.protocols.secagg import SecAggError
from geofl.protocols.tensors import spec_of
from geofl.protocols.types import Scalar, Weights, WeightsView
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.config.schedule import AsyncConfig, StalenessConfig
from geofl.server.models.staging import ResumedUpdate, load_resumed
from geofl.server.nodes.outcomes import Outcome, OutcomeStatus
from geofl.server.nodes.registry import NodeSession, TaskKindName, TaskRecord
from geofl.server.rounds.evaluation import Evaluation
from geofl.server.rounds.parts import EngineParts
from geofl.server.rounds.records import (
    EngineSettings,
    NoClientsError,
    Phase,
    PhaseClock,
    RoundFailedError,
    RoundRecord,
)
from geofl.server.rounds.secure import SecureRound, round_params
from geofl.server.rounds.tasks import (
    StageInput,
    TakeResult,
    fold_update,
    summarise,
    weight_of,
)
from geofl.server.strategies import FlowerReplies, StrategyError, StreamingMean

log = logging.getLogger(__name__)

#: Fit metric the engine adds to every fit result it judges: versions behind.
STALENESS_METRIC = "staleness"

_PAST_DEADLINE = "no result before the task deadline"

__all__ = ["STALENESS_METRIC", "FedBuffEngine", "staleness_discount"]


def staleness_discount(staleness: int, config: StalenessConfig) -> float:
    """How much an update ``staleness`` versions behind counts, in ``(0, 1]``.

    ``constant``: 1. ``polynomial``: ``(1 + s)^-exponent`` (FedBuff's choice, exponent
    0.5). ``hinge``: 1 up to ``hinge_at``, then ``1 / (1 + exponent (s - hinge_at))``.
    Each is 1 at ``s = 0`` and non-increasing in ``s``.

    Raises
    ------
    ValueError
        If ``staleness`` is negative.
    """
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {staleness}")
    if config.function == "constant":
        return 1.0
    if config.function == "polynomial":
        return float((1.0 + staleness) ** -config.exponent)
    if staleness <= config.hinge_at:
        return 1.0
    return 1.0 / (1.0 + config.exponent * (staleness - config.hinge_at))


@dataclass
class _Buffer:
    """The updates of the version being built."""

    accumulator: StreamingMean
    #: Undiscounted weight of what was accepted (the discount's denominator).
    weight: float = 0.0
    results: list[Outcome] = field(default_factory=list)
    complete: bool = False


@dataclass(eq=False)
class _Group:
    """K clients running one secure aggregation together."""

    round_id: int
    members: list[NodeSession]
    version: int = -1  # the model version its masked fit trains on
    #: Accepted masked fits, recorded once the group's staleness is known.
    fits: list[tuple[TaskRecord, Outcome]] = field(default_factory=list)


@dataclass(frozen=True)
class _GroupSum:
    mean: Weights
    weight: float


class FedBuffEngine:
    """FedBuff over the registry; see the module docstring.

    Round numbers are model versions: round ``v`` is the buffer that produced version
    ``v``. The run ends after ``fedbuff.updates`` versions (``settings.rounds`` when null).

    Raises
    ------
    ValueError
        If secure aggregation is on and a group of ``buffer_size`` clients cannot run it.
    """

    def __init__(self, settings: EngineSettings, parts: EngineParts, fedbuff: AsyncConfig) -> None:
        self._cfg = settings
        self._parts = parts
        self._clock = parts.clock
        self._strategy = parts.strategy
        self._models = parts.models
        self._observer = parts.observer
        self._runner = parts.task_runner(
            settings.deadline_s, on_release=lambda task: self._drop_unused_versions()
        )
        self._evaluation = Evaluation(settings, self._runner, parts.strategy, parts.server_evaluate)
        self.weights: Weights = parts.weights
        self._fedbuff = fedbuff
        start = parts.start_round
        self._last = fedbuff.updates or settings.rounds
        self._concurrency = fedbuff.concurrency or settings.clients_per_round
        self._k = fedbuff.buffer_size
        self._rng = random.Random(settings.seed * 1_000_003 + start)
        self._version = start - 1
        self._record = RoundRecord(start)
        self._buffer: _Buffer | None = None
        self._fit_config: dict[str, Scalar] = {}
        self._fits: dict[asyncio.Future[Outcome], TaskRecord] = {}
        self._bench: set[int] = set()
        #: Nodes with a task recorded in the version being built (their estimates changed).
        self._noted: set[int] = set()
        self._groups: dict[asyncio.Task[_GroupSum], _Group] = {}
        self._finished_groups: list[asyncio.Task[_GroupSum]] = []
        self._reserved: set[int] = set()
        self._group_ids = itertools.count(1)
        #: Updates accepted before a restart, oldest first: they fill the first buffers.
        self._staged: list[ResumedUpdate] = list(parts.resumed)
        if parts.secure is not None:
            self._check_secure_groups()

    def _check_secure_groups(self) -> None:
        assert self._parts.secure is not None
        if self._k < 2:
            raise ValueError(
                "secure aggregation with schedule.mode: async needs "
                "schedule.fedbuff.buffer_size >= 2: a group's sum of one update reveals it"
            )
        try:
            round_params(self._parts.secure, 1, list(range(1, self._k + 1)))
        except SecAggError as exc:
            raise ValueError(
                f"secure aggregation cannot run over a buffer of {self._k} clients "
                f"(schedule.fedbuff.buffer_size): {exc}"
            ) from exc

    # ------------------------------------------------------------ the run

    async def run(self) -> None:
        """Versions ``start_round..updates``; :class:`NoClientsError` if clients never come."""
        self._runner.open()
        try:
            await self._models.publish(self._version, self.weights)
            for number in range(self._parts.start_round, self._last + 1):
                if self._parts.stop_requested():  # an operator's stop: after a whole version
                    break
                await self._version_round(number)
        finally:
            await self._stop_outstanding("the run stopped", record=False)
            self._runner.close()

    async def _version_round(self, number: int) -> None:
        self._open_round(number)
        await self._build_version(number)
        scheduler = self._parts.scheduler
        if scheduler is not None:  # the link estimates after the version, as sync does
            # Of every node noted in this version: a stale arrival's task was handed out
            # for an earlier version, so its estimate's last_round is not this one.
            seen = [e for e in scheduler.estimates() if e.node_id in self._noted]
            self._observer.measurements(number, seen)
        self._noted.clear()

    async def _build_version(self, number: int) -> None:
        record = self._record
        phases = PhaseClock(record, self._observer, self._clock, ordered=False)
        phases.enter(Phase.FIT)
        try:
            await self._fill_buffer()
            phases.enter(Phase.AGGREGATE)
            new_weights = await self._aggregate()
        except RoundFailedError as failure:
            phases.stop()
            await self._fail_round(record, str(failure))
            return
        except NoClientsError as missing:
            phases.stop()
            self._observer.round_failed(record, str(missing))
            self._observer.round_ended(record, f"failed: {missing}")
            raise
        phases.enter(Phase.BROADCAST)
        await self._advance(number, new_weights)
        phases.enter(Phase.EVALUATE)
        await self._evaluate_version(record, new_weights)
        phases.enter(Phase.COMMIT)
        await self._observer.round_committed(record, new_weights, self._strategy.state())
        phases.stop()
        self._observer.round_ended(record, "committed")

    def _open_round(self, number: int) -> None:
        self._record = RoundRecord(number)
        self._observer.round_started(number, self._k)
        self._buffer = _Buffer(self._strategy.begin_round(self.weights))
        self._fit_config = self._strategy.configure_fit(number, self._cfg.round_config)

    async def _advance(self, number: int, weights: Weights) -> None:
        """Publish version ``number``; every later task trains on it."""
        await self._models.publish(number, weights)
        self.weights, self._version = weights, number
        self._bench.clear()
        self._drop_unused_versions()
        if number == self._last:
            await self._stop_outstanding("the run's last version was applied before it arrived")

    async def _fail_round(self, record: RoundRecord, reason: str) -> None:
        """Nothing applied: the model is republished as the next version (as sync does)."""
        log.warning("version %d failed: %s", record.number, reason)
        await self._advance(record.number, self.weights)
        self._observer.round_failed(record, reason)
        self._observer.round_ended(record, f"failed: {reason}")

    # ------------------------------------------------------------ filling the buffer

    async def _fill_buffer(self) -> None:
        """Keep clients busy until the buffer holds K updates (or one group's sum)."""
        assert self._buffer is not None
        while self._staged and not self._buffer.complete:
            await self._refold(self._staged.pop(0))
        while not self._buffer.complete:
            self._runner.forget_changes()
            self._parts.registry.expire()
            self._start_work()
            if not self._fits and not self._groups:
                await self._wait_for_clients()
                continue
            await self._next_settlement()

    def _start_work(self) -> None:
        if self._parts.secure is None:
            self._dispatch_fits()
        else:
            self._start_groups()

    def _idle(self) -> list[NodeSession]:
        """Online clients without an open task, in join order, none in a secure group.

        A task that has settled counts as closed even before the registry's release
        callback has run (the engine may look first).
        """
        return [
            s
            for s in self._parts.registry.online()
            if self._parts.registry.selectable(s)
            and (s.current is None or s.current.future.done())
            and s.node_id not in self._reserved
        ]

    def _candidates(self) -> list[NodeSession]:
        """Idle clients that may get work now (none that failed in this version)."""
        return [s for s in self._idle() if s.node_id not in self._bench]

    def _dispatch_fits(self) -> None:
        free = self._concurrency - len(self._fits)
        if free <= 0:
            return
        candidates = self._candidates()
        for session in self._rng.sample(candidates, min(free, len(candidates))):
            upload = self._runner.upload_plan(session)
            task = self._assign(session, "fit", self._fit_config, upload=upload)
            self._fits[task.future] = task

    async def _wait_for_clients(self) -> None:
        """Nothing is in flight: wait for enough idle clients to start work.

        Raises
        ------
        RoundFailedError
            Idle clients are there, but every one of them failed in this version.
        NoClientsError
            Too few clients within ``wait_for_clients_s``.
        """
        need = 1 if self._parts.secure is None else self._k
        deadline = self._clock.monotonic() + self._cfg.wait_for_clients_s
        while len(self._candidates()) < need:
            idle = len(self._idle())
            if idle >= need:
                raise RoundFailedError(self._stuck_reason(idle))
            if self._parts.stop_requested():  # no point waiting for a run that is ending
                raise NoClientsError(
                    f"version {self._record.number}: stopped while waiting for clients"
                )
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                raise NoClientsError(
                    f"version {self._record.number}: {idle} idle clients after waiting "
                    f"{self._cfg.wait_for_clients_s:g} s, {need} needed"
                )
            self._runner.forget_changes()
            await self._runner.wait_for_change(min(remaining, 1.0))
            self._parts.registry.expire()

    def _stuck_reason(self, idle: int) -> str:
        assert self._buffer is not None
        accepted = len(self._buffer.results)
        return (
            f"{accepted} of {self._k} updates buffered and every one of the {idle} idle "
            "clients failed, was rejected or dropped in this version"
        )

    async def _next_settlement(self) -> None:
        """Wait for a task or group to settle (or the registry to change); take it in."""
        changed = self._runner.change_waiter()
        waiters: set[asyncio.Future[Any]] = {changed, *self._fits, *self._groups}
        try:
            await asyncio.wait(
                waiters, timeout=self._until_next_deadline(), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            changed.cancel()
        self._expire_overdue()
        await self._take_settled()

    def _until_next_deadline(self) -> float | None:
        if not self._fits:
            return None
        return max(0.0, min(t.deadline for t in self._fits.values()) - self._clock.time())

    def _expire_overdue(self) -> None:
        now = self._clock.time()
        for task in self._fits.values():
            if task.deadline <= now:
                task.settle(Outcome("late", _PAST_DEADLINE))

    async def _take_settled(self) -> None:
        """Take settled work in the order it settled, until the buffer is complete."""
        assert self._buffer is not None
        settled = sorted(
            (t for f, t in self._fits.items() if f.done()),
            key=lambda t: (t.settled_at or 0.0, t.task_id),
        )
        for task in settled:
            if self._buffer.complete:
                return
            await self._arrival(task)
        while self._finished_groups and not self._buffer.complete:
            await self._group_finished(self._finished_groups.pop(0))

    async def _arrival(self, task: TaskRecord) -> None:
        del self._fits[task.future]
        outcome = self._runner.take(task)
        if outcome.status == "ok":
            outcome = await self._admit(task, outcome)
        self._note(task, outcome)

    async def _admit(self, task: TaskRecord, outcome: Outcome) -> Outcome:
        """Fold a fit result into the buffer, discounted, unless it is too stale."""
        assert self._buffer is not None
        buffer = self._buffer
        staleness = self._version - task.model_version
        outcome.metrics = {**outcome.metrics, STALENESS_METRIC: staleness}
        if staleness > self._fedbuff.staleness.max:
            outcome.refuse("late", self._too_stale(staleness))
            return outcome
        discount = staleness_discount(staleness, self._fedbuff.staleness)

        def fold(update: WeightsView, weight: float) -> None:
            buffer.accumulator.add(update, weight * discount)

        cap = self._cfg.max_examples_per_client
        outcome = await fold_update(outcome, fold, cap)
        if outcome.status == "ok":
            buffer.weight += float(weight_of(outcome.num_examples, cap))
            buffer.results.append(outcome)
            buffer.complete = len(buffer.results) >= self._k
        return outcome

    async def _refold(self, update: ResumedUpdate) -> None:
        """Take in an update accepted before the restart as if it had just arrived.

        Its file's digest is checked first (a corrupt one is a rejected participation);
        its staleness counts from the version it trained on, like any arrival's. It keeps
        its task id, so its participation is the one its node earned before the restart.
        Its node is idle and may be given new work: that is a new task, not this one again.
        """
        task, outcome = await load_resumed(update)
        if outcome.status == "ok":
            outcome = await self._admit(task, outcome)
        self._record.outcomes.append((task, outcome))
        self._observer.task_settled(self._record.number, task, outcome)
        log.info(
            "version %d: update of node %d staged before the restart taken in again (%s)",
            self._record.number,
            task.node_id,
            outcome.status,
        )

    def _too_stale(self, staleness: int) -> str:
        return (
            f"staleness {staleness} (versions behind) is over "
            f"schedule.fedbuff.staleness.max = {self._fedbuff.staleness.max}"
        )

    # ------------------------------------------------------------ applying

    async def _aggregate(self) -> Weights:
        """The strategy's step from the discounted buffer (see the module docstring)."""
        assert self._buffer is not None
        buffer, record = self._buffer, self._record
        record.train_loss, record.fit_metrics = summarise(
            self._strategy, buffer.results, self._cfg.max_examples_per_client
        )
        try:
            await asyncio.to_thread(self._add_discount_remainder, buffer)
            mean = await asyncio.to_thread(buffer.accumulator.mean)
            self._buffer = None  # its float64 sums are twice the model: free them
            return await asyncio.to_thread(self._strategy.apply, self.weights, mean, record.number)
        except StrategyError as exc:
            raise RoundFailedError(f"aggregation failed: {exc}") from exc

    def _add_discount_remainder(self, buffer: _Buffer) -> None:
        """Give the weight the discounts took to a zero delta, so they stay absolute.

        Flower's strategies get each update weighted ``n d(s)`` only: a zero reply would
        be one more vote to their robust aggregators.
        """
        remainder = buffer.weight - buffer.accumulator.total_weight
        if remainder <= 0 or isinstance(buffer.accumulator, FlowerReplies):
            return
        zeros = {name: np.zeros(t.shape, t.dtype) for name, t in self.weights.items()}
        buffer.accumulator.add(zeros, remainder)

    async def _evaluate_version(self, record: RoundRecord, weights: Weights) -> None:
        """Every ``evaluation.every`` versions and at the last: clients, then the server.

        Federated evaluation goes to idle clients only (the others are training) and
        waits for them, as the synchronous engine does; arrivals meanwhile are taken in
        afterwards (no version is applied in between, so their staleness is the same).
        """
        every = self._cfg.evaluate_every
        scheduled = every > 0 and record.number % every == 0
        if not scheduled and record.number != self._last:
            return
        if scheduled and self._cfg.evaluate_clients:
            await self._evaluation.on_clients(record, self._idle())
        await self._evaluation.on_server(record, weights)

    # ------------------------------------------------------------ tasks

    def _assign(
        self,
        session: NodeSession,
        kind: TaskKindName,
        config: dict[str, Scalar],
        *,
        round_id: int | None = None,
        upload: UploadPlan | None = None,
        secagg: pb.SecAggTask | None = None,
        deadline_s: float | None = None,
    ) -> TaskRecord:
        """One task on the current version; its round is the version it helps build.

        ``round_id`` overrides the task's round (a secure group's own number, which its
        key agreement binds); ``server_round`` in the config stays the version's.
        """
        number = self._version + 1
        return self._runner.assign(
            session,
            kind,
            number if round_id is None else round_id,
            self._version,
            config,
            self._runner.deadline(deadline_s),
            server_round=number,
            upload=upload,
            secagg=secagg,
        )

    def _note(self, task: TaskRecord, outcome: Outcome) -> None:
        """Record a settled task in the round being built; failures sit out the version."""
        self._runner.record(self._record, task, outcome)
        self._noted.add(task.node_id)
        if outcome.status in ("failed", "rejected", "dropped"):
            self._bench.add(task.node_id)

    def _drop_unused_versions(self) -> None:
        holders = self._runner.holders
        for version, count in list(holders.items()):
            if count <= 0 and version != self._version:
                del holders[version]
                self._models.drop(version)
        if self._version - 1 not in holders:
            self._models.drop(self._version - 1)

    async def _stop_outstanding(self, reason: str, *, record: bool = True) -> None:
        """Settle whatever is still in flight as dropped; record it unless told not to."""
        groups = list(self._groups.items())
        for group_task, _ in groups:
            group_task.cancel()
        await asyncio.gather(*(g for g, _ in groups), return_exceptions=True)
        self._groups.clear()
        self._finished_groups.clear()
        self._reserved.clear()
        for task in list(self._runner.in_flight.values()):
            task.settle(Outcome("dropped", reason))
            outcome = self._runner.take(task)
            _discard(outcome, reason)
            if record:
                self._note(task, outcome)
        for _, group in groups:
            for task, outcome in group.fits:
                _discard(outcome, reason)
                if record:
                    self._note(task, outcome)
        self._fits.clear()

    # ------------------------------------------------------------ secure groups

    def _start_groups(self) -> None:
        slots = max(1, self._concurrency // self._k)
        while len(self._groups) < slots:
            candidates = self._candidates()
            if len(candidates) < self._k:
                return
            group = _Group(next(self._group_ids), self._rng.sample(candidates, self._k))
            self._reserved.update(s.node_id for s in group.members)
            work = asyncio.ensure_future(self._secure_group(group))
            work.add_done_callback(self._finished_groups.append)
            self._groups[work] = group

    async def _secure_group(self, group: _Group) -> _GroupSum:
        """SecAgg+ among the group: only the sum of its members' updates is unmasked."""
        assert self._parts.secure is not None
        stage_deadline_s = self._parts.secure.stage_deadline_s
        secure = SecureRound(
            self._parts.secure, group.round_id, group.members, spec_of(self.weights)
        )

        async def stage(
            sessions: Sequence[NodeSession],
            kind: TaskKindName,
            inputs: StageInput,
            take: TakeResult,
        ) -> None:
            tasks = [
                self._assign(
                    s,
                    kind,
                    {},
                    round_id=group.round_id,
                    secagg=inputs(s),
                    deadline_s=stage_deadline_s,
                )
                for s in sessions
            ]
            await self._runner.settle(tasks, self._note, take_ok=take, late_reason=_PAST_DEADLINE)

        async def masked_fit(
            sessions: Sequence[NodeSession],
            kind: TaskKindName,
            inputs: StageInput,
            take: TakeResult,
        ) -> None:
            group.version = self._version  # the members train on the current version
            config = self._strategy.configure_fit(self._version + 1, self._cfg.round_config)
            tasks = [
                self._assign(s, "fit", config, round_id=group.round_id, secagg=inputs(s))
                for s in sessions
            ]
            await self._runner.settle(
                tasks, self._note, take_ok=take, late_reason=_PAST_DEADLINE, keep_ok=group.fits
            )

        mean, weight = await secure.run(stage, masked_fit)
        return _GroupSum(mean, weight)

    async def _group_finished(self, work: asyncio.Task[_GroupSum]) -> None:
        """A group is done: its sum becomes the buffer, or it is recorded and replaced."""
        group = self._groups.pop(work)
        self._reserved.difference_update(s.node_id for s in group.members)
        try:
            total = work.result()
        except (SecAggError, ValueError) as exc:  # an abort: too few members left
            log.warning("secure group %d failed: %s", group.round_id, exc)
            self._record_group(group, None, "dropped", f"its secure group failed: {exc}")
            return
        staleness = self._version - group.version
        if staleness > self._fedbuff.staleness.max:
            self._record_group(group, staleness, "late", self._too_stale(staleness))
            return
        assert self._buffer is not None
        buffer = self._buffer
        discount = staleness_discount(staleness, self._fedbuff.staleness)
        await asyncio.to_thread(buffer.accumulator.add, total.mean, total.weight * discount)
        buffer.weight += total.weight
        buffer.results.extend(outcome for _, outcome in group.fits)
        buffer.complete = True
        self._record_group(group, staleness, "ok", None)

    def _record_group(
        self, group: _Group, staleness: int | None, status: OutcomeStatus, reason: str | None
    ) -> None:
        """Record the group's accepted fits once the fate of its sum is known."""
        for task, outcome in group.fits:
            if staleness is not None:
                outcome.metrics = {**outcome.metrics, STALENESS_METRIC: staleness}
            outcome.status, outcome.reason = status, reason
            self._note(task, outcome)
        group.fits.clear()


def _discard(outcome: Outcome, reason: str) -> None:
    """An unused good result: free what it holds and mark it dropped."""
    if outcome.status == "ok":
        outcome.refuse("dropped", reason)
