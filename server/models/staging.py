"""Durable uploads: an accepted fit update is on disk and in the database before its ack.

The spool (:mod:`geofl.server.models.spool`) holds an upload while it streams in and is
checked; that is memory or an unnamed file, gone with the process. For a round to survive
a SIGKILL, every update the server *acknowledges* must outlive it, so the servicer hands
each accepted fit to :meth:`DurableUploads.stage` before it answers the client: the
decoded update is written to a safetensors file (fsynced, renamed into place, as a
checkpoint is) under ``<checkpoints>/staged`` and recorded with its CRC-32 in
``staged_updates``, beside the figures its participation will carry. A CRC, not SHA-256:
this runs for every update before its ack, and SHA-256 was most of its CPU.

A coordinator restarted in the middle of round N reads :meth:`DurableUploads.resumed` for
N: each staged update whose file still has its recorded checksum is folded again, and its
node is not asked to train again. When a round commits or fails its staged rows and files
go (:meth:`DurableUploads.clear`), and on start every round but the one being resumed is
cleared, so nothing staged is ever folded into two rounds. A run that ends for good drops
what it still has staged (:meth:`DurableUploads.close`), and a starting coordinator the
files a killed one wrote but never recorded (:meth:`DurableUploads.discard_partial_writes`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from sqlalchemy.orm import Session

from geofl.protocols.types import Weights
from geofl.server.nodes.clock import WALL_CLOCK, Clock
from geofl.server.nodes.outcomes import DeltaUpdate, Outcome
from geofl.server.nodes.registry import TaskRecord
from geofl.storage import (
    CheckpointCorruptError,
    CheckpointStore,
    Database,
    queries,
)
from geofl.storage.queries import StagedUpdateRecord

log = logging.getLogger(__name__)

#: Folder of the staged updates, inside the checkpoint directory.
STAGED_DIRECTORY = "staged"

__all__ = ["STAGED_DIRECTORY", "DurableUploads", "ResumedUpdate", "load_resumed", "resumed_task"]


@dataclass(frozen=True)
class ResumedUpdate:
    """A staged update of the round being resumed; ``load`` re-checks its checksum first."""

    record: StagedUpdateRecord
    load: Callable[[], Weights]


class DurableUploads:
    """Stages accepted fit updates of one run on disk and in its database.

    Parameters
    ----------
    db
        The run's database (``staged_updates``).
    checkpoints
        The run's checkpoint directory; the files go to its ``staged`` folder.
    run_id
        The run the updates belong to.
    clock
        Dates the rows (a virtual clock in simulations).
    """

    def __init__(
        self, db: Database, checkpoints: Path, run_id: int, clock: Clock = WALL_CLOCK
    ) -> None:
        self._db = db
        self._files = CheckpointStore(checkpoints / STAGED_DIRECTORY)
        self._run_id = run_id
        self._clock = clock
        #: Set by :meth:`close`; read on the staging threads too.
        self._closed = threading.Event()

    def discard_partial_writes(self) -> int:
        """Delete the staged files a killed coordinator left: half-written ones (see
        :meth:`geofl.storage.CheckpointStore.discard_partial_writes`), and this run's files
        that no row names (killed after the file was in place, before its row was).

        Call it before any upload is staged: a file being staged has no row yet.
        """
        recorded = self._db.transact(
            lambda session: {r.file.path for r in queries.staged_updates(session, self._run_id)}
        )
        return self._files.discard_partial_writes() + self._files.discard_run_files(
            self._run_id, keep=recorded
        )

    async def stage(self, task: TaskRecord, outcome: Outcome) -> None:
        """Write ``task``'s accepted update to disk and record it; return once both are durable.

        The update is decoded here (a compressed one once: the decoded tensors stay cached
        for the fold). Raises :class:`geofl.protocols.codecs.CodecError` for an update that
        does not decode, which the caller refuses like any bad upload. Once the run has
        ended (:meth:`close`) nothing is staged: no round will fold it.
        """
        payload = outcome.payload
        if not isinstance(payload, DeltaUpdate):
            raise TypeError("only a plain fit's DELTA update is staged")
        tensors = dict(payload.tensors)
        started = task.started_at or task.issued_at
        describe = partial(
            StagedUpdateRecord,
            run_id=self._run_id,
            round=task.round,
            node_id=task.node_id,
            task_id=task.task_id,
            model_version=task.model_version,
            num_examples=outcome.num_examples,
            loss=outcome.loss,
            metrics=dict(outcome.metrics),
            compute_s=outcome.compute_s,
            bytes_up=outcome.bytes_up,
            bytes_up_raw=outcome.bytes_up_raw,
            bytes_down=task.bytes_down,
            bytes_down_raw=task.bytes_down_raw,
            started_at=dt.datetime.fromtimestamp(started, dt.UTC) if started else None,
            created_at=self._clock.now(),
        )
        await asyncio.to_thread(self._save_and_record, task, tensors, describe)

    def _save_and_record(
        self,
        task: TaskRecord,
        tensors: Weights,
        describe: partial[StagedUpdateRecord],
    ) -> None:
        """The file, then its row (``describe`` given the file), on one thread: an upload
        cancelled meanwhile (its client gone, the server stopping) cannot leave a file
        without its row."""
        if self._closed.is_set():
            return
        file = self._files.save(self._run_id, task.round, tensors, checksum="crc32")
        record = describe(file=file)
        self._db.transact(lambda session: queries.stage_update(session, record))
        # The run ended while this was written: close() may have swept before the row was in.
        if self._closed.is_set():
            self.clear_tasks([task.task_id])

    def close(self) -> None:
        """The run ended for good (completed, failed, cancelled): drop everything staged.

        No round will fold its staged updates any more: an update that arrived after the
        last version, one a restart left over, one whose row was never recorded. Every row
        and file of the run goes, and later uploads are not staged (one being written
        now removes itself once its row is in).
        """
        self._closed.set()
        self.clear()
        self._files.discard_run_files(self._run_id)

    def resumed(self, number: int, version: int) -> list[ResumedUpdate]:
        """Round ``number``'s staged updates trained on ``version``; every other round cleared.

        Updates trained on another model version cannot be folded into this round's
        aggregate; they are dropped with the other rounds' (and logged).
        """
        self.clear(keep_round=number)
        records = self._db.transact(
            lambda session: queries.staged_updates(session, self._run_id, number)
        )
        usable = [r for r in records if r.model_version == version]
        for stale in (r for r in records if r.model_version != version):
            log.warning(
                "staged update of node %d trained on version %d, round %d starts from %d: dropped",
                stale.node_id,
                stale.model_version,
                number,
                version,
            )
        return [ResumedUpdate(r, self._loader(r)) for r in usable]

    def buffered(self) -> list[ResumedUpdate]:
        """FedBuff: every staged update no committed version has used, oldest first.

        A buffered run's updates belong to no one round: one handed out for version v
        may arrive after v was applied and go into a later buffer, and extra arrivals
        wait for the next one. So nothing is cleared by round here: only updates whose
        participation a committed version recorded (killed before their rows were
        cleared) are dropped, with their files. The engine judges each one's staleness.
        """

        def read(session: Session) -> tuple[list[StagedUpdateRecord], list[StagedUpdateRecord]]:
            everything = queries.staged_updates(session, self._run_id)
            used = queries.consumed_tasks(session, self._run_id)
            queries.clear_staged_tasks(session, self._run_id, used)
            return [r for r in everything if r.task_id not in used], [
                r for r in everything if r.task_id in used
            ]

        usable, used = self._db.transact(read)
        self._delete_unused_files(used, usable)
        return [ResumedUpdate(r, self._loader(r)) for r in usable]

    def clear_tasks(self, task_ids: Collection[int]) -> None:
        """These tasks' staged updates were folded into a version or refused: drop them."""
        wanted = set(task_ids)
        if not wanted:
            return

        def clear(session: Session) -> tuple[list[StagedUpdateRecord], list[StagedUpdateRecord]]:
            everything = queries.staged_updates(session, self._run_id)
            queries.clear_staged_tasks(session, self._run_id, wanted)
            return [r for r in everything if r.task_id in wanted], [
                r for r in everything if r.task_id not in wanted
            ]

        gone, kept = self._db.transact(clear)
        self._delete_unused_files(gone, kept)

    def _delete_unused_files(
        self, gone: list[StagedUpdateRecord], kept: list[StagedUpdateRecord]
    ) -> None:
        """Delete the files of ``gone`` that no row in ``kept`` still names (a SHA-256 file
        written before revision 0009 is content-addressed: two rows may share it)."""
        still_used = {r.file.path for r in kept}
        for record in gone:
            if record.file.path not in still_used:
                self._files.delete(record.file)

    def _loader(self, record: StagedUpdateRecord) -> Callable[[], Weights]:
        def load() -> Weights:
            weights, _ = self._files.load(record.file)  # verifies size and CRC-32
            return weights

        return load

    def clear(self, *, keep_round: int | None = None) -> None:
        """Delete staged rows and files of every round but ``keep_round`` (None: all)."""

        def clear(session: Session) -> tuple[list[StagedUpdateRecord], list[StagedUpdateRecord]]:
            everything = queries.staged_updates(session, self._run_id)
            queries.clear_staged(session, self._run_id, keep_round=keep_round)
            return (
                [r for r in everything if r.round != keep_round],
                [r for r in everything if r.round == keep_round],
            )

        self._delete_unused_files(*self._db.transact(clear))

    def clear_round(self, number: int) -> None:
        """Round ``number`` committed or failed: its staged updates are no longer needed."""

        def clear(session: Session) -> tuple[list[StagedUpdateRecord], list[StagedUpdateRecord]]:
            gone = queries.staged_updates(session, self._run_id, number)
            queries.clear_staged_round(session, self._run_id, number)
            return gone, queries.staged_updates(session, self._run_id)

        self._delete_unused_files(*self._db.transact(clear))


def resumed_task(
    update: ResumedUpdate, loop: asyncio.AbstractEventLoop
) -> tuple[TaskRecord, Outcome]:
    """The settled fit task and the outcome a staged update stands for (payload not loaded).

    The task keeps its original id and timings, so the participation recorded again after
    the restart is the one the node earned before it.
    """
    record = update.record
    future: asyncio.Future[Outcome] = loop.create_future()
    outcome = Outcome(
        "ok",
        num_examples=record.num_examples,
        loss=record.loss,
        metrics=dict(record.metrics),
        compute_s=record.compute_s,
        bytes_up=record.bytes_up,
        bytes_up_raw=record.bytes_up_raw,
    )
    future.set_result(outcome)
    started = record.started_at.timestamp() if record.started_at else None
    task = TaskRecord(
        task_id=record.task_id,
        node_id=record.node_id,
        kind="fit",
        round=record.round,
        model_version=record.model_version,
        config={},
        deadline=record.created_at.timestamp(),
        future=future,
        issued_at=started or record.created_at.timestamp(),
        started_at=started,
        bytes_down=record.bytes_down,
        bytes_down_raw=record.bytes_down_raw,
        settled_at=record.created_at.timestamp(),
    )
    return task, outcome


async def load_resumed(update: ResumedUpdate) -> tuple[TaskRecord, Outcome]:
    """The task and outcome a staged update stands for, its tensors loaded for the fold.

    The file's checksum is checked first; an unusable file makes the outcome a rejected
    participation with its reason (the engines fold only ``ok`` outcomes).
    """
    task, outcome = resumed_task(update, asyncio.get_running_loop())
    try:
        tensors = await asyncio.to_thread(update.load)
    except CheckpointCorruptError as exc:
        outcome.status, outcome.reason = "rejected", f"staged update unusable: {exc}"
    else:
        outcome.payload = DeltaUpdate(tensors)
    return task, outcome
