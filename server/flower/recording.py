"""A ServerApp's rounds in geofl's database, recorded like native ones.

A Flower ServerApp has no round object geofl could watch, so rounds are read off its
messages: a train or evaluate message belongs to the round its ``group_id`` names (the
legacy workflow sets it) or, failing that, the ``server-round`` of its ConfigRecord
(every strategy of ``flwr.serverapp.strategy`` sets it).  The first message of a
higher round commits the open one; the end of the ServerApp commits the last (or fails
it, if the app failed).  Each reply is a participation, with the bytes the node moved
and the ``num-examples``, loss and metrics of its MetricRecords.

Messages whose ``group_id`` is not a round number (a final evaluation sent as
``group_id="final"``) are no round's: each such group is recorded as one
``flower.group`` event when its last reply is in, and never merged into a round.

What a strategy computes on the server (:mod:`.strategy_results`) is recorded too: the
metrics its ``aggregate_train``/``aggregate_evaluate`` return go into the round's
``fit_metrics``/``eval_metrics`` (over geofl's example-weighted means of the replies,
which Flower's default aggregation equals), and its ``evaluate_fn`` results into the
round's ``server_eval_loss``/``server_eval_metrics``.  The evaluation before round 1
(round 0), or of a round already committed, becomes a ``flower.server_evaluation`` event.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from flwr.app import MetricRecord
from flwr.common.serde import recorddict_from_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoFlowerRecordDict

from geofl.protocols.types import Metrics
from geofl.server.nodes.outcomes import MessageReply, Outcome
from geofl.server.nodes.registry import TaskRecord
from geofl.server.rounds.observers import RoundObserver
from geofl.server.rounds.records import RoundRecord
from geofl.storage import Database, RoundPhase, RoundStatus, queries

__all__ = ["RoundBook", "ServerSource", "numeric_metrics", "reply_metrics", "weighted_summary"]

log = logging.getLogger(__name__)

RoundKind = Literal["fit", "evaluate"]
#: What a strategy computed on the server: its fit or evaluate aggregate, or evaluate_fn's.
ServerSource = Literal["fit", "evaluate", "server"]
_SOURCE_NAMES: dict[ServerSource, str] = {
    "fit": "aggregate_train",
    "evaluate": "aggregate_evaluate",
    "server": "evaluate_fn",
}

#: MetricRecord keys read as the participation's loss, by task kind, in order.
_LOSS_KEYS: dict[RoundKind, tuple[str, ...]] = {
    "fit": ("train_loss", "loss"),
    "evaluate": ("eval_loss", "loss"),
}
#: Where a reply's example count is: the key Flower's strategies weight by
#: (``weighted_by_key``'s default), then the legacy ``FitRes``/``EvaluateRes`` layout's.
NUM_EXAMPLES_KEYS = ("num-examples", "num_examples")
#: The legacy layout keeps a client's metrics in a ConfigRecord with this key suffix.
_LEGACY_METRICS_SUFFIX = ".metrics"


def reply_metrics(reply: MessageReply) -> dict[str, int | float]:
    """The numeric values of a reply's MetricRecords (lists are left out).

    Replies of the legacy ``NumPyClient`` path also carry their metrics in a
    ``fitres.metrics``/``evaluateres.metrics`` ConfigRecord; those are read too.
    """
    try:
        records = recorddict_from_proto(ProtoFlowerRecordDict.FromString(reply.content.records))
    except Exception:  # a malformed reply is the grid's to report; recording just skips it
        return {}
    values: dict[str, int | float] = {}
    for name, record in records.items():
        if isinstance(record, MetricRecord) or name.endswith(_LEGACY_METRICS_SUFFIX):
            for key, value in record.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    values[key] = value
    return values


def numeric_metrics(record: Mapping[str, object]) -> dict[str, int | float]:
    """The int and float values of a MetricRecord (lists, which geofl has none of, dropped)."""
    return {
        key: value
        for key, value in record.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


def _loss_of(values: Mapping[str, int | float], kind: RoundKind) -> float | None:
    loss = next((values[k] for k in _LOSS_KEYS[kind] if k in values), None)
    return None if loss is None else float(loss)


@dataclass
class _Group:
    """The messages of one non-round group (e.g. ``group_id="final"``) and their outcomes."""

    kind: RoundKind
    pushed: int = 0
    outcomes: list[Outcome] = field(default_factory=list)


def _read_reply(outcome: Outcome, kind: RoundKind) -> None:
    """Fill the outcome's examples, loss and metrics from its reply's MetricRecords."""
    if outcome.status != "ok" or not isinstance(outcome.payload, MessageReply):
        return
    values = reply_metrics(outcome.payload)
    counts = [values.pop(key) for key in NUM_EXAMPLES_KEYS if key in values]
    outcome.num_examples = max(0, int(counts[0])) if counts else 0
    outcome.loss = _loss_of(values, kind)
    outcome.metrics = dict(values)


def _weighted_mean(pairs: Sequence[tuple[float, float]]) -> float:
    total = sum(weight for weight, _ in pairs)
    return sum(weight * value for weight, value in pairs) / total


def weighted_summary(outcomes: Sequence[Outcome]) -> tuple[float | None, Metrics]:
    """Example-weighted mean loss and metrics of the successful outcomes.

    Weights are the outcomes' ``num_examples``; without any, every outcome weighs 1.
    """
    good = [o for o in outcomes if o.status == "ok"]
    weights = [float(o.num_examples) for o in good]
    if sum(weights) <= 0:
        weights = [1.0] * len(good)
    weighted = list(zip(weights, good, strict=True))
    losses = [(w, o.loss) for w, o in weighted if o.loss is not None]
    keys = sorted({k for o in good for k, v in o.metrics.items() if isinstance(v, int | float)})
    metrics: Metrics = {
        key: _weighted_mean(
            [(w, float(v)) for w, o in weighted if isinstance(v := o.metrics.get(key), int | float)]
        )
        for key in keys
    }
    return (_weighted_mean(losses) if losses else None), metrics


class RoundBook:
    """The open round of a ServerApp's run and its database rows; used on the event loop."""

    def __init__(
        self,
        db: Database,
        run_id: int,
        observer: RoundObserver | None = None,
    ) -> None:
        self._db = db
        self._run_id = run_id
        self._observer = observer or RoundObserver()
        self._round_ids: dict[int, int] = {}
        self._current: RoundRecord | None = None
        self._outcomes: dict[RoundKind, list[Outcome]] = {"fit": [], "evaluate": []}
        self._phase: RoundKind | None = None
        self._since = time.monotonic()
        #: The strategy's server-side results for the open round, by source.
        self._computed: dict[ServerSource, dict[str, int | float]] = {}
        self._computed_loss: dict[ServerSource, float] = {}
        self._groups: dict[tuple[str, RoundKind], _Group] = {}

    def pushed(self, number: int, kind: RoundKind, cohort: int = 0) -> int:
        """A train/evaluate message for round ``number`` (0: unknown) goes out; its round.

        A message naming an older round (or none) counts towards the open round.
        """
        current = self._current
        if current is None or number > current.number:
            if current is not None:
                self._close(current, None)
            current = self._open(max(number, 1), cohort)
        if kind != self._phase:
            self._enter(current, kind)
        return current.number

    def settled(self, number: int, kind: RoundKind, task: TaskRecord, outcome: Outcome) -> None:
        """A message task of round ``number`` settled: record its participation."""
        _read_reply(outcome, kind)
        round_id = self._round_ids.get(number)
        if round_id is None:
            return
        finished = dt.datetime.now(dt.UTC)
        started = dt.datetime.fromtimestamp(task.started_at or task.issued_at, dt.UTC)
        with self._db.session() as session:
            queries.record_participation(
                session,
                round_id,
                task.node_id,
                task_id=task.task_id,
                kind=kind,
                status=outcome.status,
                reason=outcome.reason,
                num_examples=outcome.num_examples,
                bytes_up=outcome.bytes_up,
                bytes_down=task.bytes_down,
                bytes_up_raw=outcome.bytes_up_raw,
                bytes_down_raw=task.bytes_down_raw,
                compute_s=outcome.compute_s,
                duration_s=(finished - started).total_seconds(),
                loss=outcome.loss,
                metrics=dict(outcome.metrics),
                started_at=started,
                finished_at=finished,
            )
        if self._current is not None and self._current.number == number:
            self._current.outcomes.append((task, outcome))
            self._outcomes[kind].append(outcome)

    def computed(
        self,
        number: int,
        source: ServerSource,
        metrics: Mapping[str, object],
        loss: float | None = None,
    ) -> None:
        """The strategy computed ``metrics`` (and ``loss``) on the server for round ``number``.

        Several reports for one round and source add up (the legacy workflow reports a
        central evaluation's loss and metrics separately).
        """
        values = numeric_metrics(metrics)
        current = self._current
        if current is not None and current.number == number:
            self._computed[source] = {**self._computed.get(source, {}), **values}
            if loss is not None:
                self._computed_loss[source] = loss
            return
        with self._db.session() as session:
            queries.add_event(
                session,
                "flower.server_evaluation" if source == "server" else "flower.aggregate",
                f"the strategy's {_SOURCE_NAMES[source]} result for round {number}",
                run_id=self._run_id,
                round=number,
                data={"source": source, "metrics": values, "loss": loss},
            )

    def group_pushed(self, group: str, kind: RoundKind) -> None:
        """A message of the non-round group ``group`` went to a node."""
        self._groups.setdefault((group, kind), _Group(kind)).pushed += 1

    def group_settled(self, group: str, kind: RoundKind, outcome: Outcome) -> None:
        """A message of ``group`` settled; the group is recorded once all have."""
        _read_reply(outcome, kind)
        entry = self._groups.get((group, kind))
        if entry is None:
            return
        entry.outcomes.append(outcome)
        if len(entry.outcomes) >= entry.pushed:
            del self._groups[(group, kind)]
            self._record_group(group, entry)

    def finish(self, error: str | None) -> None:
        """The ServerApp ended: commit the open round, or fail it with ``error``."""
        if self._current is not None:
            self._close(self._current, error)
            self._current = None
        for (group, _), entry in list(self._groups.items()):
            self._record_group(group, entry)
        self._groups.clear()

    # ------------------------------------------------------------ internals

    def _record_group(self, group: str, entry: _Group) -> None:
        loss, metrics = weighted_summary(entry.outcomes)
        ok = sum(1 for o in entry.outcomes if o.status == "ok")
        data = {
            "group_id": group,
            "kind": entry.kind,
            "messages": entry.pushed,
            "succeeded": ok,
            "failed": len(entry.outcomes) - ok,
            "loss": loss,
            "metrics": dict(metrics),
        }
        with self._db.session() as session:
            queries.add_event(
                session,
                "flower.group",
                f"{entry.kind} messages of group {group!r}: {ok}/{entry.pushed} ok",
                run_id=self._run_id,
                data=data,
            )

    def _open(self, number: int, cohort: int) -> RoundRecord:
        with self._db.session() as session:
            self._round_ids[number] = queries.start_round(session, self._run_id, number, cohort).id
        self._current = RoundRecord(number)
        self._outcomes = {"fit": [], "evaluate": []}
        self._computed, self._computed_loss = {}, {}
        self._phase = None
        self._since = time.monotonic()
        return self._current

    def _enter(self, record: RoundRecord, kind: RoundKind) -> None:
        phase = RoundPhase.FIT if kind == "fit" else RoundPhase.EVALUATE
        elapsed = self._elapsed(record)
        with self._db.session() as session:
            queries.set_round_phase(
                session, self._round_ids[record.number], phase, seconds_in_previous_phase=elapsed
            )
        self._phase = kind

    def _elapsed(self, record: RoundRecord) -> float:
        now = time.monotonic()
        elapsed, self._since = now - self._since, now
        key = self._phase or RoundPhase.SELECT.value
        record.phase_durations[key] = record.phase_durations.get(key, 0.0) + elapsed
        return elapsed

    def _close(self, record: RoundRecord, error: str | None) -> None:
        record.train_loss, record.fit_metrics = weighted_summary(self._outcomes["fit"])
        record.eval_loss, record.eval_metrics = weighted_summary(self._outcomes["evaluate"])
        self._apply_computed(record)
        elapsed = self._elapsed(record)
        round_id = self._round_ids[record.number]
        with self._db.session() as session:
            if error is None:
                queries.commit_round(
                    session,
                    round_id,
                    checkpoint=None,
                    train_loss=record.train_loss,
                    fit_metrics=dict(record.fit_metrics),
                    eval_loss=record.eval_loss,
                    eval_metrics=dict(record.eval_metrics),
                    server_eval_loss=record.server_eval_loss,
                    server_eval_metrics=dict(record.server_eval_metrics),
                    seconds_in_last_phase=elapsed,
                )
            else:
                queries.fail_round(session, round_id, error, status=RoundStatus.FAILED)
        self._observer.round_ended(record, "committed" if error is None else f"failed: {error}")

    def _apply_computed(self, record: RoundRecord) -> None:
        """The strategy's own aggregates over geofl's means; its evaluate_fn result."""
        fit, evaluate = self._computed.get("fit"), self._computed.get("evaluate")
        if fit is not None:
            record.fit_metrics = {**record.fit_metrics, **fit}
        if evaluate is not None:
            record.eval_metrics = {**record.eval_metrics, **evaluate}
        record.train_loss = self._computed_loss_of("fit", record.train_loss)
        record.eval_loss = self._computed_loss_of("evaluate", record.eval_loss)
        server = self._computed.get("server")
        if server is not None:
            record.server_eval_metrics = dict(server)
        record.server_eval_loss = self._computed_loss_of("server", record.server_eval_loss)

    def _computed_loss_of(self, source: ServerSource, otherwise: float | None) -> float | None:
        """The loss the strategy reported for ``source``, else one among its metrics."""
        if source in self._computed_loss:
            return self._computed_loss[source]
        loss = _loss_of(self._computed.get(source, {}), "fit" if source == "fit" else "evaluate")
        return otherwise if loss is None else loss
