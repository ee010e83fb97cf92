"""The engines' persistence: an observer writing rounds, participations and checkpoints."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.orm import Session

from geofl.protocols.types import WeightsView
from geofl.server.nodes.clock import WALL_CLOCK, Clock
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import TaskRecord
from geofl.server.rounds.observers import RoundObserver
from geofl.server.rounds.records import Phase, RoundRecord
from geofl.server.rounds.writer import InlineWriter, Writer
from geofl.server.scheduling.measurements import LinkEstimate
from geofl.storage import CheckpointRecord, CheckpointStore, Database, queries


def _utc(unix_s: float | None) -> dt.datetime | None:
    return None if unix_s is None else dt.datetime.fromtimestamp(unix_s, dt.UTC)


def _write_pending(
    session: Session, round_ids: dict[int, int], pending: Sequence[tuple[int, dict[str, Any]]]
) -> None:
    """Record the waiting participations, grouped by round number (a retried unit writes
    them again: rows are keyed by task and attempt, so nothing is doubled)."""
    by_round: dict[int, list[dict[str, Any]]] = {}
    for number, values in pending:
        by_round.setdefault(number, []).append(values)
    for number, rows in by_round.items():
        queries.record_participations(session, round_ids[number], rows)


class DatabaseRecorder(RoundObserver):
    """Writes what the engine does; the commit is one transaction."""

    def __init__(
        self,
        db: Database,
        store: CheckpointStore,
        run_id: int,
        keep: int | None = None,
        clock: Clock = WALL_CLOCK,
        epsilon_after: Callable[[int], float] | None = None,
        writer: Writer | None = None,
    ) -> None:
        """``epsilon_after(n)``: the privacy spent after round ``n``, recorded with its
        commit in the same transaction (None: the run has no privacy accounting).

        ``writer`` runs the database work (:mod:`geofl.server.rounds.writer`; None: at
        once, on the caller's thread). With a :class:`SerialWriter` the round ids are
        only known on its thread, so every unit of work looks them up there.
        """
        self._writer = writer if writer is not None else InlineWriter()
        self._clock = clock
        self._epsilon_after = epsilon_after
        #: Participations (round number, row) wait here and are written in one
        #: transaction at the next phase change, commit or failure: a thousand clients
        #: settling in a round would otherwise be a thousand transactions.
        self._pending: list[tuple[int, dict[str, Any]]] = []
        self._db = db
        self._store = store
        self._run_id = run_id
        self._keep = keep
        self._round_ids: dict[int, int] = {}

    def round_started(self, number: int, cohort_target: int) -> None:
        now = self._clock.now()

        def start(session: Session) -> int:
            return queries.start_round(session, self._run_id, number, cohort_target, now=now).id

        def write() -> None:
            self._round_ids[number] = self._db.transact(start)

        self._writer.submit(write)

    def _take_pending(self) -> list[tuple[int, dict[str, Any]]]:
        """The participations waiting so far (handed to one unit of work)."""
        pending, self._pending = self._pending, []
        return pending

    def phase(self, number: int, phase: Phase, seconds_in_previous: float | None) -> None:
        if phase is Phase.FAILED:
            return
        pending = self._take_pending()

        def write(session: Session) -> None:
            _write_pending(session, self._round_ids, pending)
            queries.set_round_phase(
                session,
                self._round_ids[number],
                phase.value,
                seconds_in_previous_phase=seconds_in_previous,
            )

        self._writer.submit(lambda: self._db.transact(write))

    def task_settled(self, number: int, task: TaskRecord, outcome: Outcome) -> None:
        finished = _utc(task.settled_at) or self._clock.now()
        started = _utc(task.started_at or task.issued_at)
        values = queries.participation_values(
            task.node_id,
            task_id=task.task_id,
            kind=task.kind,
            status=outcome.status,
            reason=outcome.reason,
            num_examples=outcome.num_examples,
            bytes_up=outcome.bytes_up,
            bytes_down=task.bytes_down,
            bytes_up_raw=outcome.bytes_up_raw,
            bytes_down_raw=task.bytes_down_raw,
            compute_s=outcome.compute_s,
            duration_s=(finished - started).total_seconds() if started else None,
            loss=outcome.loss,
            metrics=dict(outcome.metrics),
            started_at=started,
            finished_at=finished,
        )
        self._pending.append((number, values))

    def task_revised(self, number: int, task: TaskRecord, outcome: Outcome) -> None:
        """Write the participation again: rows are keyed by task and attempt, so the
        revised status and reason replace the ones recorded when the task settled."""
        self.task_settled(number, task, outcome)

    async def round_committed(
        self, record: RoundRecord, weights: WeightsView, state: WeightsView
    ) -> None:
        checkpoint = await asyncio.to_thread(
            self._store.save, self._run_id, record.number, weights, state
        )
        spent = None
        if self._epsilon_after is not None:  # ~0.2 s with sampling: off the event loop
            spent = await asyncio.to_thread(self._epsilon_after, record.number)
        pending, now = self._take_pending(), self._clock.now()

        def commit(session: Session) -> None:
            _write_pending(session, self._round_ids, pending)
            queries.commit_round(
                session,
                self._round_ids[record.number],
                checkpoint=checkpoint,
                train_loss=record.train_loss,
                fit_metrics=dict(record.fit_metrics),
                eval_loss=record.eval_loss,
                eval_metrics=dict(record.eval_metrics),
                server_eval_loss=record.server_eval_loss,
                server_eval_metrics=dict(record.server_eval_metrics),
                epsilon=spent,
                now=now,
            )

        await self._writer.call(lambda: self._db.transact(commit))
        if self._keep is not None:
            keep = self._keep
            await self._writer.call(lambda: self._prune(keep))

    def plan(self, number: int, message: str, data: dict[str, Any]) -> None:
        now = self._clock.now()
        self._writer.submit(
            lambda: self._db.transact(
                lambda session: queries.add_event(
                    session,
                    "round.plan",
                    message,
                    run_id=self._run_id,
                    round=number,
                    data=data,
                    now=now,
                )
            )
        )

    def measurements(self, number: int, estimates: Sequence[LinkEstimate]) -> None:
        if not estimates:
            return

        def write() -> None:
            round_id = self._round_ids.get(number)
            if round_id is not None:
                self._db.transact(
                    lambda session: queries.record_measurements(session, round_id, estimates)
                )

        self._writer.submit(write)

    def _prune(self, keep: int) -> None:
        """Delete checkpoint files beyond the newest ``keep`` (rows stay as history)."""
        rows = self._db.transact(
            lambda session: [
                CheckpointRecord.from_row(r) for r in queries.checkpoints_of(session, self._run_id)
            ]
        )
        kept = {r.sha256 for r in rows[:keep]}
        for record in rows[keep:]:
            if record.sha256 not in kept:
                self._store.delete(record)

    def round_failed(self, record: RoundRecord, reason: str) -> None:
        pending, now = self._take_pending(), self._clock.now()

        def fail(session: Session) -> None:
            _write_pending(session, self._round_ids, pending)
            queries.fail_round(session, self._round_ids[record.number], reason, now=now)

        self._writer.submit(lambda: self._db.transact(fail))


__all__ = ["DatabaseRecorder"]
