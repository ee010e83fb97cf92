"""The task runner: hands tasks out through the registry, waits for them, and settles them.

Every engine gives its tasks out and takes their outcomes back through one
:class:`TaskRunner`, so a settled task is handled in one place (:meth:`TaskRunner.record`):
it joins the round's record, the observers hear of it, and the scheduler learns from it.
A task ends in one of three ways, each an :class:`Outcome`: the node's result, a failure
the registry saw (dropped, rejected), or the deadline (``late``, settled here).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from geofl.protocols.codecs import CodecError
from geofl.protocols.compression import UploadPlan
from geofl.protocols.types import Metrics, Scalar, WeightsView
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.config.compression import CompressionConfig
from geofl.server.nodes.clock import Clock
from geofl.server.nodes.outcomes import DeltaUpdate, Outcome
from geofl.server.nodes.registry import NodeSession, Registry, TaskKindName, TaskRecord
from geofl.server.rounds.observers import RoundObserver
from geofl.server.rounds.records import RoundRecord
from geofl.server.scheduling.scheduler import Scheduler
from geofl.server.strategies import Strategy, UpdateCheck, UpdateRejected

#: What an engine does with a good result before it is recorded (fold it, feed SecAgg+).
TakeResult = Callable[[TaskRecord, Outcome], Awaitable[Outcome]]
#: Where a settled task goes: usually :meth:`TaskRunner.record` into the round's record.
NoteOutcome = Callable[[TaskRecord, Outcome], None]
#: A secure-aggregation stage input per node.
StageInput = Callable[[NodeSession], pb.SecAggTask]


class TaskRunner:
    """Dispatch, wait, settle and record the tasks of one engine over the registry.

    Parameters
    ----------
    registry
        The nodes and their mailboxes.
    observer
        Hears of every settled task.
    clock
        Dates deadlines.
    deadline_s
        A task's deadline unless the caller gives another.
    compression
        The run's upload compression per region (None: uncompressed uploads).
    scheduler
        Learns from every settled task and may adapt each client's upload plan.
    on_release
        Called with each task once its result is taken (an engine drops model versions
        no task holds any more).
    """

    def __init__(
        self,
        registry: Registry,
        observer: RoundObserver,
        *,
        clock: Clock,
        deadline_s: float,
        compression: CompressionConfig | None = None,
        scheduler: Scheduler | None = None,
        on_release: Callable[[TaskRecord], None] = lambda task: None,
    ) -> None:
        self.registry = registry
        self.clock = clock
        self.deadline_s = deadline_s
        #: Tasks handed out and not yet taken back, by id.
        self.in_flight: dict[int, TaskRecord] = {}
        #: How many of those train on each model version (versions still needed).
        self.holders: Counter[int] = Counter()
        self._observer = observer
        self._compression = compression
        self._scheduler = scheduler
        self._on_release = on_release
        self._changed = asyncio.Event()
        self._unsubscribe: Callable[[], None] | None = None

    # ------------------------------------------------------------ the registry's changes

    def open(self) -> None:
        """Start listening to the registry's changes (nodes joining, leaving, freed)."""
        if self._unsubscribe is None:
            self._unsubscribe = self.registry.changes.subscribe(self._changed.set)

    def close(self) -> None:
        """Stop listening (the engine is done; a relay starts a new one per task)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def forget_changes(self) -> None:
        """Only changes from now on wake :meth:`wait_for_change`."""
        self._changed.clear()

    async def wait_for_change(self, timeout: float | None) -> None:
        """Until the registry changes (since :meth:`forget_changes`) or ``timeout``.

        ``asyncio.timeout``, not ``wait_for``: on Python 3.11 ``wait_for`` swallows a
        cancellation that arrives as the event is set (a node joining as SIGTERM cancels
        the run), and the server went on waiting for clients instead of stopping.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()

    def change_waiter(self) -> asyncio.Future[Any]:
        """A future that completes at the next change; cancel it when done with it."""
        return asyncio.ensure_future(self._changed.wait())

    # ------------------------------------------------------------ handing out

    def deadline(self, deadline_s: float | None = None) -> float:
        """The absolute deadline of a task handed out now."""
        return self.clock.time() + (deadline_s or self.deadline_s)

    def assign(
        self,
        session: NodeSession,
        kind: TaskKindName,
        round_id: int,
        version: int,
        config: dict[str, Scalar],
        deadline: float,
        *,
        server_round: int | None = None,
        upload: UploadPlan | None = None,
        secagg: pb.SecAggTask | None = None,
    ) -> TaskRecord:
        """One task for ``session`` on model ``version``; ``server_round`` defaults to the round.

        ``round_id`` is the task's round (a secure group's own number, which its key
        agreement binds); ``server_round`` in the config is the round it helps build.
        """
        number = round_id if server_round is None else server_round
        task = self.registry.assign(
            session,
            kind,
            round_id,
            version,
            {**config, "server_round": number},
            deadline,
            upload=upload,
            secagg=secagg,
        )
        self.in_flight[task.task_id] = task
        self.holders[version] += 1
        return task

    def dispatch(
        self,
        sessions: Sequence[NodeSession],
        kind: TaskKindName,
        number: int,
        version: int,
        config: dict[str, Scalar],
        *,
        inputs: StageInput | None = None,
        deadline_s: float | None = None,
    ) -> list[TaskRecord]:
        """One task per session, with one deadline; plain fits get their upload plan."""
        deadline = self.deadline(deadline_s)
        plain_fit = kind == "fit" and inputs is None
        return [
            self.assign(
                s,
                kind,
                number,
                version,
                config,
                deadline,
                upload=self.upload_plan(s) if plain_fit else None,
                secagg=inputs(s) if inputs is not None else None,
            )
            for s in sessions
        ]

    def upload_plan(self, session: NodeSession) -> UploadPlan | None:
        """How ``session`` compresses its fit: its region's chain, or what its uplink carries."""
        default = self._compression.upload_plan(session.region) if self._compression else None
        if self._scheduler is None:
            return default
        return self._scheduler.upload_plan(session, default)

    # ------------------------------------------------------------ waiting

    async def until_downloaded(self, tasks: Sequence[TaskRecord]) -> None:
        """Until every task's node holds its model, or has settled, or the first deadline."""
        waits = [
            asyncio.ensure_future(_first(t.downloaded.wait(), asyncio.shield(t.future)))
            for t in tasks
        ]
        timeout = max(0.0, min(t.deadline for t in tasks) - self.clock.time()) if tasks else 0.0
        _, pending = await asyncio.wait(waits, timeout=timeout)
        for waiter in pending:
            waiter.cancel()

    def take(self, task: TaskRecord) -> Outcome:
        """A settled task's outcome; the task is no longer in flight."""
        if self.in_flight.pop(task.task_id, None) is not None:
            self.holders[task.model_version] -= 1
        self._on_release(task)
        return task.future.result()

    async def settle(
        self,
        tasks: Sequence[TaskRecord],
        note: NoteOutcome,
        *,
        take_ok: TakeResult | None = None,
        late_reason: str = "no result before the round deadline",
        keep_ok: list[tuple[TaskRecord, Outcome]] | None = None,
    ) -> list[Outcome]:
        """Settle every task (result, failure or deadline) and ``note`` each as it settles.

        Good results pass through ``take_ok`` first. With ``keep_ok`` given, results still
        good after it are kept there unnoted (a secure group's fits are recorded once the
        fate of the group's sum is known). Returns the good results.
        """
        deadline = max((t.deadline for t in tasks), default=self.clock.time())
        successes: list[Outcome] = []
        pending = {t.future: t for t in tasks}
        while pending:
            done, _ = await asyncio.wait(
                pending,
                timeout=max(deadline - self.clock.time(), 0.0),
                return_when=asyncio.FIRST_COMPLETED,
            )
            if not done:
                for task in pending.values():
                    task.settle(Outcome("late", late_reason))
                continue
            for future in done:
                task = pending.pop(future)
                outcome = self.take(task)
                if outcome.status == "ok" and take_ok is not None:
                    outcome = await take_ok(task, outcome)
                if outcome.status == "ok":
                    successes.append(outcome)
                if outcome.status == "ok" and keep_ok is not None:
                    keep_ok.append((task, outcome))
                else:
                    note(task, outcome)
        return successes

    def record(self, record: RoundRecord, task: TaskRecord, outcome: Outcome) -> None:
        """The one place a settled task is handled: recorded, observed, learned from."""
        record.outcomes.append((task, outcome))
        self._observer.task_settled(record.number, task, outcome)
        if self._scheduler is not None:
            self._scheduler.observe(task, outcome)


def weight_of(num_examples: int, cap: int | None) -> int:
    """A result's weight: its examples, at most ``cap`` (``strategy.max_examples_per_client``).

    The cap keeps one client from claiming the whole aggregate with a large report.
    """
    return num_examples if cap is None else min(num_examples, cap)


async def fold_update(
    outcome: Outcome,
    fold: Callable[[WeightsView, float], UpdateCheck | None],
    cap: int | None = None,
) -> Outcome:
    """Fold a fit's update into a running sum, weighted by its (capped) examples; free it.

    An update the strategy or its codec refuses makes the outcome ``rejected``; one a robust
    rule changed on arrival (clipped) stays ``ok`` and carries the rule's reason.
    """
    payload = outcome.payload
    if not isinstance(payload, DeltaUpdate):
        outcome.refuse("rejected", "a fit result without an update")
        return outcome
    try:
        weight = float(weight_of(outcome.num_examples, cap))
        check = await asyncio.to_thread(fold, payload.tensors, weight)
    except (UpdateRejected, CodecError) as rejected:
        outcome.status, outcome.reason = "rejected", str(rejected)
    else:
        if check is not None and check.reason is not None:
            outcome.reason = check.reason
    finally:
        outcome.release()
    return outcome


def summarise(
    strategy: Strategy, results: Sequence[Outcome], cap: int | None = None
) -> tuple[float | None, Metrics]:
    """The example-weighted (capped: :func:`weight_of`) loss and aggregate of the metrics."""
    pairs = [(weight_of(r.num_examples, cap), r.metrics) for r in results]
    metrics = strategy.aggregate_metrics(pairs) if pairs else {}
    losses = [(weight_of(r.num_examples, cap), r.loss) for r in results if r.loss is not None]
    total = sum(n for n, _ in losses)
    loss = sum(n * v for n, v in losses) / total if total else None
    return loss, metrics


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
    "NoteOutcome",
    "StageInput",
    "TakeResult",
    "TaskRunner",
    "fold_update",
    "summarise",
    "weight_of",
]
