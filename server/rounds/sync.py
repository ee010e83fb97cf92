"""The synchronous round engine: an explicit state machine per round.

    SELECT -> BROADCAST -> FIT -> AGGREGATE -> EVALUATE -> COMMIT
       \\________\\__________\\________\\___________\\-> FAILED

* SELECT waits (up to ``schedule.wait_for_clients_s``) for ``min_clients``
  available nodes and samples the cohort (``clients_per_round * over_select``).
* BROADCAST hands each selected node a fit task; the node pulls the model in
  chunks.  The phase ends when every selected node has downloaded or settled.
* FIT folds each update into the strategy's running weighted sum as it
  arrives (memory O(model)); it ends when every task has settled or at the
  round deadline.  Fewer than ``min_clients`` successes fail the round: no model
  is applied and the next round starts from the last committed model.
* AGGREGATE applies the strategy's server step to the mean update.
* EVALUATE runs federated evaluation (every ``evaluation.every`` rounds) and
  the optional server-side evaluation.
* COMMIT writes the checkpoint and the round's record in one transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from geofl.protocols.codecs import CodecError
from geofl.protocols.compression import UploadPlan
from geofl.protocols.secagg import SecAggAbortError, SecAggError
from geofl.protocols.tensors import spec_of
from geofl.protocols.types import Metrics, Scalar, Weights, WeightsView
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.models.spool import SpooledUpdate
from geofl.server.models.store import ModelStore
from geofl.server.nodes.clock import WALL_CLOCK, Clock
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import NodeSession, Registry, TaskKindName, TaskRecord
from geofl.server.rounds.secagg import SecAggServer
from geofl.server.rounds.secure import (
    SecureSettings,
    keys_from_proto,
    mean_of_sum,
    roster_to_proto,
    round_params,
    setup_to_proto,
)
from geofl.server.scheduling.measurements import LinkEstimate
from geofl.server.scheduling.scheduler import Scheduler
from geofl.server.strategies import Strategy, StrategyError, StreamingMean, UpdateRejected

log = logging.getLogger(__name__)

#: Seconds selection waits for the full target once ``min_clients`` are available.
SELECT_GRACE_S = 3.0

ServerEvaluate = Callable[[WeightsView], tuple[float, dict[str, Scalar]]]


class Phase(enum.Enum):
    """States of one round (ADVERTISE, SHARE and UNMASK only under secure aggregation)."""

    SELECT = "select"
    ADVERTISE = "advertise"
    SHARE = "share"
    BROADCAST = "broadcast"
    FIT = "fit"
    UNMASK = "unmask"
    AGGREGATE = "aggregate"
    EVALUATE = "evaluate"
    COMMIT = "commit"
    FAILED = "failed"


_NEXT: dict[Phase, frozenset[Phase]] = {
    Phase.SELECT: frozenset({Phase.BROADCAST, Phase.ADVERTISE, Phase.FAILED}),
    Phase.ADVERTISE: frozenset({Phase.SHARE, Phase.FAILED}),
    Phase.SHARE: frozenset({Phase.BROADCAST, Phase.FAILED}),
    Phase.BROADCAST: frozenset({Phase.FIT, Phase.FAILED}),
    Phase.FIT: frozenset({Phase.AGGREGATE, Phase.UNMASK, Phase.FAILED}),
    Phase.UNMASK: frozenset({Phase.AGGREGATE, Phase.FAILED}),
    Phase.AGGREGATE: frozenset({Phase.EVALUATE, Phase.FAILED}),
    Phase.EVALUATE: frozenset({Phase.COMMIT, Phase.FAILED}),
    Phase.COMMIT: frozenset(),
    Phase.FAILED: frozenset(),
}


class RoundFailedError(Exception):
    """The round cannot complete; the reason is recorded and the run goes on."""


class NoClientsError(Exception):
    """Not enough clients connected within ``wait_for_clients_s``: the run fails."""


@dataclass(frozen=True)
class EngineSettings:
    """The parts of the run configuration the engine uses."""

    rounds: int
    clients_per_round: int
    min_clients: int
    over_select: float
    deadline_s: float
    wait_for_clients_s: float
    round_config: dict[str, Scalar]
    evaluate_every: int
    evaluate_clients: int
    evaluate_config: dict[str, Scalar]
    seed: int


@dataclass
class RoundRecord:
    """What a round produced, handed to the recorder at commit."""

    number: int
    phase_durations: dict[str, float] = field(default_factory=dict)
    outcomes: list[tuple[TaskRecord, Outcome]] = field(default_factory=list)
    train_loss: float | None = None
    fit_metrics: Metrics = field(default_factory=dict)
    eval_loss: float | None = None
    eval_metrics: Metrics = field(default_factory=dict)
    server_eval_loss: float | None = None
    server_eval_metrics: Metrics = field(default_factory=dict)


class Recorder:
    """Persistence hooks of the engine (the database and checkpoints)."""

    def round_started(self, number: int, cohort_target: int) -> None:
        """A round begins."""

    def phase(self, number: int, phase: Phase, seconds_in_previous: float | None) -> None:
        """The round entered ``phase`` after ``seconds_in_previous`` in the one before."""

    def participation(self, number: int, task: TaskRecord, outcome: Outcome) -> None:
        """One task settled."""

    async def commit(self, record: RoundRecord, weights: WeightsView, state: WeightsView) -> None:
        """Checkpoint and record the round in one step."""

    def round_failed(self, record: RoundRecord, reason: str) -> None:
        """The round failed; nothing was applied."""

    def plan(self, number: int, message: str, data: dict[str, Any]) -> None:
        """The scheduler's plan for round ``number``: predictions per client, any fallback."""

    def measurements(self, number: int, estimates: Sequence[LinkEstimate]) -> None:
        """The link estimates after round ``number``."""


class RoundEngine:
    """Runs rounds ``start_round..rounds`` of one run."""

    def __init__(
        self,
        settings: EngineSettings,
        registry: Registry,
        strategy: Strategy,
        models: ModelStore,
        recorder: Recorder,
        *,
        start_round: int,
        global_weights: Weights,
        server_evaluate: ServerEvaluate | None = None,
        on_round_end: Callable[[RoundRecord, str], None] = lambda r, s: None,
        upload_plan: Callable[[str | None], UploadPlan | None] = lambda region: None,
        secure: SecureSettings | None = None,
        clock: Clock = WALL_CLOCK,
        on_round_start: Callable[[int], None] = lambda number: None,
        on_task: Callable[[TaskRecord, Outcome], None] = lambda task, outcome: None,
        scheduler: Scheduler | None = None,
    ) -> None:
        self._cfg = settings
        self._scheduler = scheduler
        self._clock = clock
        self._on_round_start = on_round_start
        self._on_task = on_task
        self._registry = registry
        self._strategy = strategy
        self._models = models
        self._recorder = recorder
        self._start = start_round
        self.weights = global_weights
        self._server_evaluate = server_evaluate
        self._on_round_end = on_round_end
        self._upload_plan = upload_plan
        self._secure = secure
        self._changed = asyncio.Event()
        registry.on_change = self._changed.set

    async def run(self) -> None:
        """Every remaining round; raises :class:`NoClientsError` if clients never come."""
        await self._models.publish(self._start - 1, self.weights)
        for number in range(self._start, self._cfg.rounds + 1):
            record = RoundRecord(number)
            self._recorder.round_started(number, self._cfg.clients_per_round)
            self._on_round_start(number)
            try:
                await self._round(record)
            except RoundFailedError as failure:
                log.warning("round %d failed: %s", number, failure)
                self._recorder.round_failed(record, str(failure))
                self._on_round_end(record, f"failed: {failure}")
                await self._models.publish(number, self.weights)
            else:
                self._on_round_end(record, "committed")
            if self._scheduler is not None:
                seen = [e for e in self._scheduler.estimates() if e.last_round == number]
                self._recorder.measurements(number, seen)
            self._models.drop(number - 1)

    async def evaluate_only(self, number: int) -> RoundRecord:
        """Federated evaluation of the engine's weights as model version ``number``, no fit.

        How a relay forwards its coordinator's evaluation task to its region. Waits for
        clients like a round's selection (:class:`NoClientsError` if they never come).
        """
        record = RoundRecord(number)
        await self._select(number)
        await self._models.publish(number, self.weights)
        await self._evaluate(record, self.weights)
        return record

    async def _round(self, record: RoundRecord) -> None:
        clock = PhaseClock(record, self._recorder, self._clock)
        clock.enter(Phase.SELECT)
        cohort = await self._select(record.number)
        fit = self._secure_fit if self._secure is not None else self._plain_fit
        fit_results, accumulator = await fit(record, cohort, clock)
        if len(fit_results) < self._cfg.min_clients:
            clock.enter(Phase.FAILED)
            tried = sum(1 for task, _ in record.outcomes if task.kind == "fit")
            raise RoundFailedError(
                f"{len(fit_results)} of {tried} clients succeeded, "
                f"min_clients is {self._cfg.min_clients}"
            )
        clock.enter(Phase.AGGREGATE)
        record.train_loss, record.fit_metrics = self._summarise(fit_results)
        try:
            mean = await asyncio.to_thread(accumulator.mean)
            del accumulator  # its float64 sums are twice the model: free them before the step
            new_weights = await asyncio.to_thread(
                self._strategy.apply, self.weights, mean, record.number
            )
        except StrategyError as exc:  # e.g. an aggregate that overflows float16
            clock.enter(Phase.FAILED)
            raise RoundFailedError(f"aggregation failed: {exc}") from exc
        await self._models.publish(record.number, new_weights)
        clock.enter(Phase.EVALUATE)
        await self._evaluate(record, new_weights)
        clock.enter(Phase.COMMIT)
        await self._recorder.commit(record, new_weights, self._strategy.state())
        self.weights = new_weights
        clock.stop()

    async def _plain_fit(
        self, record: RoundRecord, cohort: list[NodeSession], clock: PhaseClock
    ) -> tuple[list[Outcome], StreamingMean]:
        """Broadcast and fit, folding each update into the running mean as it arrives."""
        clock.enter(Phase.BROADCAST)
        accumulator = self._strategy.begin_round(self.weights)
        tasks = self._dispatch(
            cohort,
            "fit",
            record.number,
            record.number - 1,
            self._strategy.configure_fit(record.number, self._cfg.round_config),
        )
        await self._until_downloaded(tasks)
        self._models.release_encoded(record.number - 1)  # stragglers get it re-encoded
        clock.enter(Phase.FIT)

        async def fold(task: TaskRecord, outcome: Outcome) -> Outcome:
            return await self._fold(accumulator.add, outcome)

        return await self._collect(record, tasks, on_ok=fold), accumulator

    async def _secure_fit(
        self, record: RoundRecord, cohort: list[NodeSession], clock: PhaseClock
    ) -> tuple[list[Outcome], StreamingMean]:
        """The SecAgg+ stages around the fit: only the survivors' sum is ever unmasked.

        A stage that leaves fewer clients than the threshold aborts the round (recorded,
        nothing applied). A client whose stage input is malformed is rejected, like a bad
        update in a plain round.
        """
        assert self._secure is not None
        settings = self._secure
        try:
            params = round_params(settings, record.number, [s.node_id for s in cohort])
        except SecAggError as exc:  # e.g. a cohort too small to share secrets
            clock.enter(Phase.FAILED)
            raise RoundFailedError(f"secure aggregation cannot start: {exc}") from exc
        server = SecAggServer(params)
        setup = setup_to_proto(params, settings)
        by_id = {s.node_id: s for s in cohort}
        try:
            clock.enter(Phase.ADVERTISE)
            await self._stage(
                record,
                cohort,
                "advertise",
                lambda s: pb.SecAggTask(setup=setup),
                lambda node, result: server.add_keys(node, keys_from_proto(result.keys)),
            )
            rosters = server.close_advertise()
            clock.enter(Phase.SHARE)
            await self._stage(
                record,
                [by_id[n] for n in rosters],
                "share",
                lambda s: pb.SecAggTask(setup=setup, roster=roster_to_proto(rosters[s.node_id])),
                lambda node, result: server.add_shares(node, dict(result.shares)),
            )
            inboxes = server.close_sharing()
            fit_results = await self._masked_fit(
                record, [by_id[n] for n in inboxes], clock, server, setup, inboxes
            )
            survivors, dropped = server.close_masking()
            clock.enter(Phase.UNMASK)
            reveal = pb.SecAggTask(
                setup=setup, survivors=sorted(survivors), dropped=sorted(dropped)
            )
            await self._stage(
                record,
                [by_id[n] for n in sorted(survivors)],
                "unmask",
                lambda s: reveal,
                lambda node, result: server.add_reveal(node, dict(result.revealed)),
            )
            total = await asyncio.to_thread(server.finish)
        except SecAggAbortError as abort:
            clock.enter(Phase.FAILED)
            raise RoundFailedError(
                f"secure aggregation aborted in stage {abort.stage}: {abort.reason}"
            ) from abort
        mean, weight = mean_of_sum(total, spec_of(self.weights), setup)
        accumulator = self._strategy.begin_round(self.weights)
        await asyncio.to_thread(accumulator.add, mean, weight)
        return fit_results, accumulator

    async def _masked_fit(
        self,
        record: RoundRecord,
        cohort: list[NodeSession],
        clock: PhaseClock,
        server: SecAggServer,
        setup: pb.SecAggSetup,
        inboxes: dict[int, dict[int, bytes]],
    ) -> list[Outcome]:
        clock.enter(Phase.BROADCAST)
        config = self._strategy.configure_fit(record.number, self._cfg.round_config)
        tasks = self._dispatch(
            cohort,
            "fit",
            record.number,
            record.number - 1,
            config,
            secagg=lambda s: pb.SecAggTask(setup=setup, inbox=inboxes[s.node_id]),
        )
        await self._until_downloaded(tasks)
        self._models.release_encoded(record.number - 1)
        clock.enter(Phase.FIT)

        async def fold(task: TaskRecord, outcome: Outcome) -> Outcome:
            vector, outcome.update = outcome.update, None
            try:
                await asyncio.to_thread(server.add_masked, task.node_id, vector)
            except SecAggError as rejected:
                outcome.status, outcome.reason = "rejected", str(rejected)
            return outcome

        return await self._collect(record, tasks, on_ok=fold)

    async def _stage(
        self,
        record: RoundRecord,
        sessions: Sequence[NodeSession],
        kind: TaskKindName,
        make_input: Callable[[NodeSession], pb.SecAggTask],
        accept: Callable[[int, pb.SecAggResult], None],
    ) -> None:
        """Hand every session one stage task; feed each result to ``accept``."""

        async def take(task: TaskRecord, outcome: Outcome) -> Outcome:
            try:
                if outcome.secagg is None:
                    raise SecAggError(f"{kind} result without secure-aggregation content")
                accept(task.node_id, outcome.secagg)
            except SecAggError as rejected:
                outcome.status, outcome.reason = "rejected", str(rejected)
            outcome.secagg = None
            return outcome

        assert self._secure is not None
        tasks = self._dispatch(
            sessions,
            kind,
            record.number,
            record.number - 1,
            {},
            secagg=make_input,
            deadline_s=self._secure.stage_deadline_s,
        )
        await self._collect(record, tasks, on_ok=take)

    # ----------------------------------------------------------- phases

    async def _select(self, number: int) -> list[NodeSession]:
        need = self._cfg.min_clients
        deadline = self._clock.monotonic() + self._cfg.wait_for_clients_s
        while True:
            self._registry.expire()
            available = self._registry.available()
            if len(available) >= need:
                break
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                raise NoClientsError(
                    f"round {number}: {len(available)} clients available after waiting "
                    f"{self._cfg.wait_for_clients_s:g} s, {need} needed"
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 1.0))
        target = max(need, round(self._cfg.clients_per_round * self._cfg.over_select))
        available = await self._grace_for_target(available, target, deadline)
        rng = random.Random(self._cfg.seed * 1_000_003 + number)
        if self._scheduler is None:
            return rng.sample(available, min(target, len(available)))
        choice = self._scheduler.choose(available, target, number, rng)
        event = choice.event()
        if event is not None:
            self._recorder.plan(number, *event)
        return choice.sessions

    async def _grace_for_target(
        self, available: list[NodeSession], target: int, deadline: float
    ) -> list[NodeSession]:
        """Once the minimum is there, give the rest of the target a short while to connect.

        Without this the first round of a run would start with whoever joined first.
        """
        grace_end = min(deadline, self._clock.monotonic() + SELECT_GRACE_S)
        while len(available) < target and self._clock.monotonic() < grace_end:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), grace_end - self._clock.monotonic())
            self._registry.expire()
            available = self._registry.available()
        return available

    def _dispatch(
        self,
        cohort: Sequence[NodeSession],
        kind: TaskKindName,
        number: int,
        version: int,
        config: dict[str, Scalar],
        *,
        secagg: Callable[[NodeSession], pb.SecAggTask] | None = None,
        deadline_s: float | None = None,
    ) -> list[TaskRecord]:
        deadline = self._clock.time() + (deadline_s or self._cfg.deadline_s)
        config = {**config, "server_round": number}
        plain_fit = kind == "fit" and secagg is None
        return [
            self._registry.assign(
                s,
                kind,
                number,
                version,
                dict(config),
                deadline,
                upload=self._plan_upload(s) if plain_fit else None,
                secagg=secagg(s) if secagg is not None else None,
            )
            for s in cohort
        ]

    def _plan_upload(self, session: NodeSession) -> UploadPlan | None:
        default = self._upload_plan(session.region)
        if self._scheduler is None:
            return default
        return self._scheduler.upload_plan(session, default)

    async def _until_downloaded(self, tasks: Sequence[TaskRecord]) -> None:
        waits = [
            asyncio.ensure_future(_first(t.downloaded.wait(), asyncio.shield(t.future)))
            for t in tasks
        ]
        timeout = max(0.0, min(t.deadline for t in tasks) - self._clock.time()) if tasks else 0.0
        _, pending = await asyncio.wait(waits, timeout=timeout)
        for waiter in pending:
            waiter.cancel()

    async def _collect(
        self,
        record: RoundRecord,
        tasks: Sequence[TaskRecord],
        on_ok: Callable[[TaskRecord, Outcome], Awaitable[Outcome]] | None = None,
    ) -> list[Outcome]:
        """Settle every task (result, failure or deadline); ``on_ok`` takes good results."""
        deadline = max((t.deadline for t in tasks), default=self._clock.time())
        successes: list[Outcome] = []
        pending = {t.future: t for t in tasks}
        while pending:
            timeout = deadline - self._clock.time()
            done, _ = await asyncio.wait(
                pending, timeout=max(timeout, 0.0), return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                for task in pending.values():
                    task.settle(Outcome("late", "no result before the round deadline"))
                continue
            for future in done:
                task = pending.pop(future)
                outcome = future.result()
                if outcome.status == "ok" and on_ok is not None:
                    outcome = await on_ok(task, outcome)
                record.outcomes.append((task, outcome))
                self._recorder.participation(record.number, task, outcome)
                if self._scheduler is not None:
                    self._scheduler.observe(task, outcome)
                self._on_task(task, outcome)
                if outcome.status == "ok":
                    successes.append(outcome)
        return successes

    async def _fold(self, fold: Callable[[WeightsView, float], None], outcome: Outcome) -> Outcome:
        update: SpooledUpdate = outcome.update
        try:
            await asyncio.to_thread(fold, update, float(outcome.num_examples))
        except (UpdateRejected, CodecError) as rejected:
            outcome.status, outcome.reason = "rejected", str(rejected)
        finally:
            update.close()
            outcome.update = None
        return outcome

    async def _evaluate(self, record: RoundRecord, weights: WeightsView) -> None:
        every = self._cfg.evaluate_every
        if every and record.number % every == 0 and self._cfg.evaluate_clients:
            await self._evaluate_on_clients(record, self._registry.available())
        await self._evaluate_on_server(record, weights)

    async def _evaluate_on_clients(
        self, record: RoundRecord, candidates: Sequence[NodeSession]
    ) -> None:
        """Federated evaluation by a seeded sample of ``candidates``; weighted means."""
        rng = random.Random(self._cfg.seed * 7_919 + record.number)
        cohort = rng.sample(list(candidates), min(self._cfg.evaluate_clients, len(candidates)))
        config = self._strategy.configure_evaluate(record.number, self._cfg.evaluate_config)
        tasks = self._dispatch(cohort, "evaluate", record.number, record.number, config)
        results = await self._collect(record, tasks)
        record.eval_loss, record.eval_metrics = self._summarise(results)

    async def _evaluate_on_server(self, record: RoundRecord, weights: WeightsView) -> None:
        """The configured server-side evaluation; a failure is logged, the model commits."""
        if self._server_evaluate is None:
            return
        try:
            loss, metrics = await asyncio.to_thread(self._server_evaluate, weights)
        except Exception:  # the user's evaluation failed: the model still commits
            log.exception("server-side evaluation failed for round %d", record.number)
        else:
            record.server_eval_loss, record.server_eval_metrics = float(loss), dict(metrics)

    def _summarise(self, results: Sequence[Outcome]) -> tuple[float | None, Metrics]:
        pairs = [(r.num_examples, r.metrics) for r in results]
        metrics = self._strategy.aggregate_metrics(pairs) if pairs else {}
        losses = [(r.num_examples, r.loss) for r in results if r.loss is not None]
        total = sum(n for n, _ in losses)
        loss = sum(n * v for n, v in losses) / total if total else None
        return loss, metrics


class PhaseClock:
    """Times each phase of a round; with ``ordered``, enforces the legal transitions.

    A buffered asynchronous version's phases need not follow the synchronous order.
    """

    def __init__(
        self, record: RoundRecord, recorder: Recorder, clock: Clock, *, ordered: bool = True
    ) -> None:
        self._record = record
        self._recorder = recorder
        self._clock = clock
        self._ordered = ordered
        self._phase: Phase | None = None
        self._since = clock.monotonic()

    def enter(self, phase: Phase) -> None:
        if self._ordered and self._phase is not None and phase not in _NEXT[self._phase]:
            raise RuntimeError(f"illegal round transition {self._phase.value} -> {phase.value}")
        elapsed = self.stop()
        self._phase = phase
        self._recorder.phase(self._record.number, phase, elapsed)

    def stop(self) -> float | None:
        """Close the current phase's timer; its seconds, if a phase was open."""
        now = self._clock.monotonic()
        elapsed = None
        if self._phase is not None:
            key = self._phase.value
            elapsed = now - self._since
            self._record.phase_durations[key] = self._record.phase_durations.get(key, 0.0) + elapsed
        self._since = now
        return elapsed


async def _first(*awaitables: Any) -> None:
    """Return when the first awaitable completes; cancel the rest."""
    futures = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in futures:
            if not future.done():
                future.cancel()


__all__ = [
    "EngineSettings",
    "NoClientsError",
    "Phase",
    "Recorder",
    "RoundEngine",
    "RoundFailedError",
    "RoundRecord",
]
