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
* COMMIT hands the round to the observers (the database recorder checkpoints it
  and records it in one transaction).

Under secure aggregation the SecAgg+ stages (:mod:`geofl.server.rounds.secure`) wrap the
broadcast and the fit: ADVERTISE -> SHARE -> BROADCAST -> FIT -> UNMASK. From the second
secure round on, clients that unmasked the previous one sent their keys ahead in their
unmask answer and skip ADVERTISE.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from functools import partial

from geofl.protocols.secagg import SecAggAbortError, SecAggError
from geofl.protocols.tensors import spec_of
from geofl.protocols.types import Weights
from geofl.server.models.staging import ResumedUpdate, load_resumed
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import NodeSession, TaskKindName, TaskRecord
from geofl.server.rounds.aggregation import Aggregation
from geofl.server.rounds.evaluation import Evaluation
from geofl.server.rounds.parts import EngineParts
from geofl.server.rounds.records import (
    EngineSettings,
    NoClientsError,
    Phase,
    PhaseClock,
    RoundFailedError,
    RoundRecord,
    secagg_abort_reason,
)
from geofl.server.rounds.secure import KeysAhead, SecureRound
from geofl.server.rounds.tasks import StageInput, TakeResult, fold_update, summarise
from geofl.server.strategies import StrategyError

log = logging.getLogger(__name__)

#: Seconds selection waits for the full target once ``min_clients`` are available.
SELECT_GRACE_S = 3.0


class SyncEngine:
    """Runs rounds ``start_round..rounds`` of one run, each round a cohort's fits."""

    def __init__(self, settings: EngineSettings, parts: EngineParts) -> None:
        self._cfg = settings
        self._parts = parts
        self._clock = parts.clock
        self._strategy = parts.strategy
        self._models = parts.models
        self._observer = parts.observer
        self._runner = parts.task_runner(settings.deadline_s)
        self._evaluation = Evaluation(settings, self._runner, parts.strategy, parts.server_evaluate)
        #: Secure rounds: the keys survivors sent ahead for their next round.
        self._keys_ahead = KeysAhead()
        self.weights: Weights = parts.weights

    async def run(self) -> None:
        """Every remaining round; raises :class:`NoClientsError` if clients never come."""
        self._runner.open()
        try:
            await self._models.publish(self._parts.start_round - 1, self.weights)
            for number in range(self._parts.start_round, self._cfg.rounds + 1):
                if self._parts.stop_requested():  # an operator's stop: after a whole round
                    break
                await self._run_round(number)
        finally:
            self._runner.close()

    async def evaluate_only(self, number: int) -> RoundRecord:
        """Federated evaluation of the engine's weights as model version ``number``, no fit.

        How a relay forwards its coordinator's evaluation task to its region. Waits for
        clients like a round's selection (:class:`NoClientsError` if they never come).
        """
        record = RoundRecord(number)
        self._runner.open()
        try:
            await self._select(number)
            await self._models.publish(number, self.weights)
            await self._evaluate(record, self.weights)
        finally:
            self._runner.close()
        return record

    async def _run_round(self, number: int) -> None:
        record = RoundRecord(number)
        self._observer.round_started(number, self._cfg.clients_per_round)
        try:
            await self._round(record)
        except RoundFailedError as failure:
            log.warning("round %d failed: %s", number, failure)
            self._observer.round_failed(record, str(failure))
            self._observer.round_ended(record, f"failed: {failure}")
            await self._models.publish(number, self.weights)
        else:
            self._observer.round_ended(record, "committed")
        scheduler = self._parts.scheduler
        if scheduler is not None:
            seen = [e for e in scheduler.estimates() if e.last_round == number]
            self._observer.measurements(number, seen)
        self._models.drop(number - 1)

    async def _round(self, record: RoundRecord) -> None:
        clock = PhaseClock(record, self._observer, self._clock)
        clock.enter(Phase.SELECT)
        resumed = self._resumed(record.number)
        cohort = await self._select(record.number, skip={u.record.node_id for u in resumed})
        if self._parts.secure is not None:
            fit_results, aggregation = await self._secure_fit(record, cohort, clock)
        else:
            fit_results, aggregation = await self._plain_fit(record, cohort, clock, resumed)
        try:
            new_weights = await self._aggregate(record, clock, fit_results, aggregation)
        finally:
            aggregation.close()  # a robust rule's spilled updates, whatever became of the round
        del aggregation
        await self._models.publish(record.number, new_weights)
        clock.enter(Phase.EVALUATE)
        await self._evaluate(record, new_weights)
        clock.enter(Phase.COMMIT)
        await self._observer.round_committed(record, new_weights, self._strategy.state())
        self.weights = new_weights
        clock.stop()

    async def _aggregate(
        self,
        record: RoundRecord,
        clock: PhaseClock,
        fit_results: list[Outcome],
        aggregation: Aggregation,
    ) -> Weights:
        """AGGREGATE: the round's mean (or robust aggregate), its verdicts recorded, and the
        server step; a round short of ``min_clients`` results fails here."""
        if len(fit_results) < self._cfg.min_clients:
            clock.enter(Phase.FAILED)
            tried = sum(1 for task, _ in record.outcomes if task.kind == "fit")
            raise RoundFailedError(
                f"{len(fit_results)} of {tried} clients succeeded, "
                f"min_clients is {self._cfg.min_clients}"
            )
        clock.enter(Phase.AGGREGATE)
        record.train_loss, record.fit_metrics = summarise(
            self._strategy, fit_results, self._cfg.max_examples_per_client
        )
        try:
            mean = await asyncio.to_thread(aggregation.mean)
            aggregation.revise(record.number, self._observer)
            aggregation.close()  # its float64 sums are twice the model: free them before the step
            return await asyncio.to_thread(self._strategy.apply, self.weights, mean, record.number)
        except StrategyError as exc:  # e.g. an aggregate that overflows float16
            clock.enter(Phase.FAILED)
            raise RoundFailedError(f"aggregation failed: {exc}") from exc

    # ----------------------------------------------------------- fit

    def _resumed(self, number: int) -> Sequence[ResumedUpdate]:
        """The staged updates of a round interrupted by a restart (only its first round)."""
        if number != self._parts.start_round or self._parts.secure is not None:
            return ()
        return self._parts.resumed

    async def _plain_fit(
        self,
        record: RoundRecord,
        cohort: list[NodeSession],
        clock: PhaseClock,
        resumed: Sequence[ResumedUpdate] = (),
    ) -> tuple[list[Outcome], Aggregation]:
        """Broadcast and fit, folding each update into the running mean as it arrives.

        Updates staged before a restart are folded first; their nodes are not in
        ``cohort``. With every update staged, there is nothing to broadcast.
        """
        clock.enter(Phase.BROADCAST)
        aggregation = Aggregation(self._strategy.begin_round(self.weights))
        cap = self._cfg.max_examples_per_client
        results = [await self._refold(record, update, aggregation) for update in resumed]
        results = [outcome for outcome in results if outcome.status == "ok"]

        async def fold(task: TaskRecord, outcome: Outcome) -> Outcome:
            return await fold_update(outcome, aggregation.folder(task, outcome), cap)

        if not cohort:
            clock.enter(Phase.FIT)
            return results, aggregation
        results += await self._fit_tasks(record, clock, cohort, None, fold)
        return results, aggregation

    async def _refold(
        self, record: RoundRecord, update: ResumedUpdate, aggregation: Aggregation
    ) -> Outcome:
        """Fold one staged update again (its file's digest checked first) and record it."""
        task, outcome = await load_resumed(update)
        if outcome.status == "ok":
            fold = aggregation.folder(task, outcome)
            outcome = await fold_update(outcome, fold, self._cfg.max_examples_per_client)
        record.outcomes.append((task, outcome))
        self._observer.task_settled(record.number, task, outcome)
        log.info(
            "round %d: update of node %d staged before the restart folded again (%s)",
            record.number,
            task.node_id,
            outcome.status,
        )
        return outcome

    async def _secure_fit(
        self, record: RoundRecord, cohort: list[NodeSession], clock: PhaseClock
    ) -> tuple[list[Outcome], Aggregation]:
        """The SecAgg+ stages around the fit: only the survivors' sum is ever unmasked.

        A stage that leaves fewer clients than the threshold aborts the round (recorded,
        nothing applied). A client whose stage input is malformed is rejected, like a bad
        update in a plain round.
        """
        assert self._parts.secure is not None
        settings = self._parts.secure
        try:
            secure = SecureRound(
                settings, record.number, cohort, spec_of(self.weights), self._keys_ahead
            )
        except SecAggError as exc:  # e.g. a cohort too small to share secrets
            clock.enter(Phase.FAILED)
            raise RoundFailedError(f"secure aggregation cannot start: {exc}") from exc
        fit_results: list[Outcome] = []

        async def stage(
            sessions: Sequence[NodeSession],
            kind: TaskKindName,
            inputs: StageInput,
            take: TakeResult,
        ) -> None:
            tasks = self._runner.dispatch(
                sessions,
                kind,
                record.number,
                record.number - 1,
                {},
                inputs=inputs,
                deadline_s=settings.stage_deadline_s,
            )
            await self._runner.settle(tasks, partial(self._runner.record, record), take_ok=take)

        async def masked_fit(
            sessions: Sequence[NodeSession],
            kind: TaskKindName,
            inputs: StageInput,
            take: TakeResult,
        ) -> None:
            clock.enter(Phase.BROADCAST)
            fit_results.extend(await self._fit_tasks(record, clock, sessions, inputs, take))

        try:
            mean, weight = await secure.run(stage, masked_fit, clock.enter)
        except SecAggAbortError as abort:
            clock.enter(Phase.FAILED)
            raise RoundFailedError(secagg_abort_reason(abort.stage, abort.reason)) from abort
        accumulator = self._strategy.begin_round(self.weights)
        await asyncio.to_thread(accumulator.add, mean, weight)
        return fit_results, Aggregation(accumulator)

    async def _fit_tasks(
        self,
        record: RoundRecord,
        clock: PhaseClock,
        cohort: Sequence[NodeSession],
        inputs: StageInput | None,
        take: TakeResult,
    ) -> list[Outcome]:
        """Hand out the fits (BROADCAST), wait for the downloads, then settle them (FIT)."""
        runner = self._runner
        config = self._strategy.configure_fit(record.number, self._cfg.round_config)
        tasks = runner.dispatch(
            cohort, "fit", record.number, record.number - 1, config, inputs=inputs
        )
        await runner.until_downloaded(tasks)
        self._models.release_encoded(record.number - 1)  # stragglers get it re-encoded
        clock.enter(Phase.FIT)
        return await runner.settle(tasks, partial(runner.record, record), take_ok=take)

    # ----------------------------------------------------------- select, evaluate

    async def _select(
        self, number: int, skip: set[int] | frozenset[int] = frozenset()
    ) -> list[NodeSession]:
        """Sample the cohort among the available nodes not in ``skip``.

        ``skip`` are the nodes whose updates of the round are already in hand (staged
        before a restart): they count towards the minimum and the target.
        """
        need = max(self._cfg.min_clients - len(skip), 0)
        registry, runner = self._parts.registry, self._runner
        deadline = self._clock.monotonic() + self._cfg.wait_for_clients_s

        def candidates() -> list[NodeSession]:
            return [s for s in registry.available() if s.node_id not in skip]

        while True:
            registry.expire()
            available = candidates()
            if len(available) >= need:
                break
            if self._parts.stop_requested():  # no point waiting for a run that is ending
                raise NoClientsError(f"round {number}: stopped while waiting for clients")
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                raise NoClientsError(
                    f"round {number}: {len(available)} clients available after waiting "
                    f"{self._cfg.wait_for_clients_s:g} s, {need} needed"
                )
            runner.forget_changes()
            await runner.wait_for_change(min(remaining, 1.0))
        target = max(need, round(self._cfg.clients_per_round * self._cfg.over_select) - len(skip))
        if target <= 0:
            return []
        available = await self._grace_for_target(available, target, deadline, candidates)
        rng = random.Random(self._cfg.seed * 1_000_003 + number)
        scheduler = self._parts.scheduler
        if scheduler is None:
            return rng.sample(available, min(target, len(available)))
        choice = scheduler.choose(available, target, number, rng)
        event = choice.event()
        if event is not None:
            self._observer.plan(number, *event)
        return choice.sessions

    async def _grace_for_target(
        self,
        available: list[NodeSession],
        target: int,
        deadline: float,
        candidates: Callable[[], list[NodeSession]],
    ) -> list[NodeSession]:
        """Once the minimum is there, give the rest of the target a short while to connect.

        Without this the first round of a run would start with whoever joined first.
        """
        registry, runner = self._parts.registry, self._runner
        grace_end = min(deadline, self._clock.monotonic() + SELECT_GRACE_S)
        while len(available) < target and self._clock.monotonic() < grace_end:
            runner.forget_changes()
            await runner.wait_for_change(grace_end - self._clock.monotonic())
            registry.expire()
            available = candidates()
        return available

    async def _evaluate(self, record: RoundRecord, weights: Weights) -> None:
        if self._evaluation.due(record.number):
            await self._evaluation.on_clients(record, self._parts.registry.available())
        await self._evaluation.on_server(record, weights)


__all__ = ["SELECT_GRACE_S", "SyncEngine"]
