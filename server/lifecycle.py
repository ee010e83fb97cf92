"""How a run is chosen, stopped and ended: the statuses of :class:`~geofl.storage.RunStatus`.

- **Choosing**: a coordinator started on ``run.name`` resumes the newest run of that name
  when it is resumable (``running`` after a crash, ``interrupted`` after SIGINT/SIGTERM)
  and has the same configuration; a name whose newest run ended (or has another
  configuration) is an error unless the operator asks for a new run (``--new-run``):
  never a silent second run under the same name.
- **Stopping**: :class:`StopSwitch` is what ``geofl runs stop`` flips; the engines look
  at it between rounds, so the current round ends first.
- **Ending**: :func:`final_status` turns what happened into the run's status.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from geofl.server.config.errors import ConfigError
from geofl.server.nodes.clock import Clock
from geofl.server.rounds.observers import RoundObserver
from geofl.server.rounds.records import RoundRecord
from geofl.server.rounds.writer import InlineWriter, Writer
from geofl.storage import Database, Run, RunStatus, queries

__all__ = ["RoundEvents", "StopSwitch", "choose_run", "final_status"]


def choose_run(session: Session, name: str, config_sha256: str, *, new_run: bool) -> Run | None:
    """The run to resume, or ``None`` to create a new one.

    Raises
    ------
    ConfigError
        If ``name``'s newest run cannot be resumed (it ended, or it was started with
        another configuration) and ``new_run`` is not set; the message says what to do.
    """
    latest = queries.latest_run_named(session, name)
    if latest is None or new_run:
        return None
    status = RunStatus(latest.status)
    where = f"run {latest.id} '{name}'"
    if not status.resumable:
        raise ConfigError.single(
            name,
            f"{where} already ended ({status.value}, {latest.last_committed_round} round(s) "
            "committed); start with --new-run for another run of that name, or choose "
            "another run.name",
            path="run.name",
        )
    if latest.config_sha256 != config_sha256:
        raise ConfigError.single(
            name,
            f"{where} ({status.value}, resumable after round {latest.last_committed_round}) "
            "was started with another configuration (config SHA-256 "
            f"{latest.config_sha256[:12]}..., this one {config_sha256[:12]}...): start it with "
            "the same configuration to resume it, or with --new-run for a new run of that name",
            path="run.name",
        )
    return latest


def final_status(
    committed_rounds: int, stop_reason: str | None, error: str | None = None
) -> tuple[RunStatus, str | None]:
    """How a run whose engine returned (or gave up with ``error``) ended: status and error.

    An operator's stop wins (``cancelled``: the engine may have given up waiting for
    clients because of it); then an ``error`` (``failed``); a run that committed no round
    ``failed`` too (every round failed); else it ``completed``.
    """
    if stop_reason is not None:
        return RunStatus.CANCELLED, stop_reason
    if error is not None:
        return RunStatus.FAILED, error
    if committed_rounds == 0:
        return RunStatus.FAILED, "no round committed (every round failed)"
    return RunStatus.COMPLETED, None


@dataclass
class StopSwitch:
    """An operator's request to stop the run after its current round.

    Flipped from the coordinator's event loop (the control API serves there), read by the
    engines between rounds: a plain attribute, no lock needed.
    """

    reason: str | None = None

    def request(self, reason: str) -> bool:
        """Ask the run to stop; whether this was the first request."""
        if self.reason is not None:
            return False
        self.reason = reason
        return True

    def requested(self) -> bool:
        """Whether a stop was asked for (the engines' check between rounds)."""
        return self.reason is not None


class RoundEvents(RoundObserver):
    """Writes each round's end to the run's events, so ``geofl runs logs`` shows progress."""

    def __init__(
        self, db: Database, run_id: int, clock: Clock, writer: Writer | None = None
    ) -> None:
        """``writer`` runs the write (:mod:`geofl.server.rounds.writer`; None: at once)."""
        self._db = db
        self._run_id = run_id
        self._clock = clock
        self._writer = writer if writer is not None else InlineWriter()

    def round_ended(self, record: RoundRecord, status: str) -> None:
        """One ``round.committed`` or ``round.failed`` event with the round's figures."""
        committed = status == "committed"
        ok = sum(1 for _, outcome in record.outcomes if outcome.status == "ok")
        data: dict[str, object] = {"tasks": len(record.outcomes), "ok": ok}
        if record.train_loss is not None:
            data["train_loss"] = record.train_loss
        data.update({f"eval_{k}": v for k, v in record.eval_metrics.items()})
        message = f"round {record.number} {status}: {ok}/{len(record.outcomes)} tasks ok"
        when = self._clock.now()
        self._writer.submit(
            lambda: self._db.transact(
                lambda session: queries.add_event(
                    session,
                    "round.committed" if committed else "round.failed",
                    message,
                    run_id=self._run_id,
                    round=record.number,
                    data=data,
                    now=when,
                )
            )
        )
