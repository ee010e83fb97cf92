"""ServerApp: legacy FedAvg in ``DefaultWorkflow``, with or without ``SecAggPlusWorkflow``.

This is how Flower 1.42 runs SecAgg+ (it raises ``TypeError`` outside ``LegacyContext``),
and the plain case uses the same path so that the two differ only by the protocol.

Everything measured is appended as JSON lines to the ``timing-file`` run-config path:

* ``round_start`` after FedAvg sampled the round's clients (so round 1 does not include
  waiting for nodes to register), ``round_end`` when FedAvg's ``aggregate_fit`` returns,
  with the partition ids whose updates were aggregated. A SecAgg+ round that the workflow
  halts (too few clients left) has no ``round_end``.
* ``exchange`` for every server <-> client message exchange (SecAgg+ has four per round,
  plain FedAvg one): stage, messages, error replies, and payload bytes each way as Flower's
  ``RecordDict`` counts them (``count_bytes``, the figure its ``message_size_mod`` logs:
  array and config bytes, without protobuf or HTTP framing).
* ``end`` with the final model's mean shift against the shift the aggregated clients imply.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.common import FitIns, FitRes, Parameters, Scalar, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
from flwr.server import Grid, LegacyContext, ServerConfig
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_PARAMS_RECORD
from flwr.serverapp import ServerApp

from flwrsecagg.common import PLAIN_STAGE, client_shift, initial_model, validate_drop_stage

__all__ = [
    "CountingGrid",
    "EventLog",
    "RecordingFedAvg",
    "app",
    "build_workflow",
    "payload_bytes",
    "record_bytes",
]

app = ServerApp()


class EventLog:
    """Append-only JSON-lines file of timestamped events (wall-clock seconds)."""

    def __init__(self, path: str) -> None:
        if not path:
            raise ValueError("the run config must name a timing-file")
        self.path = path

    def write(self, event: str, **fields: Any) -> None:
        """Append one event with the current wall time."""
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")


def _value_bytes(value: Any) -> int:
    """One config/metric value as Flower's ``count_bytes`` sizes it."""
    if isinstance(value, bool):
        return 1
    if isinstance(value, int | float):
        return 8
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, bytes):
        return len(value)
    raise TypeError(f"unexpected record value of type {type(value).__name__}")


def record_bytes(record: ArrayRecord | ConfigRecord | MetricRecord) -> int:
    """Bytes of one record, counted like Flower's ``count_bytes`` (values plus keys).

    Flower's own ``ConfigRecord.count_bytes`` raises ``IndexError`` on an empty list (the
    SecAgg+ unmask message carries one when no client dropped), hence this copy of its rule.
    """
    if isinstance(record, ArrayRecord):
        return sum(len(array.data) + len(key) for key, array in record.items())
    total = 0
    for key, value in record.items():
        values = value if isinstance(value, list) else [value]
        total += len(key) + sum(_value_bytes(v) for v in values)
    return total


def payload_bytes(content: RecordDict) -> int:
    """Bytes of a message's records (arrays, configs, metrics), without any framing."""
    return sum(record_bytes(record) for record in content.values())


def _record_sizes(content: RecordDict) -> dict[str, int]:
    """Bytes per record of one message: what a stage's messages are made of."""
    return {name: record_bytes(record) for name, record in content.items()}


def _stage_of(messages: list[Message]) -> str:
    if not messages:
        return "none"
    configs = messages[0].content.config_records.get(RECORD_KEY_CONFIGS)
    if configs is None or Key.STAGE not in configs:
        return PLAIN_STAGE
    return str(configs[Key.STAGE])


class CountingGrid(Grid):
    """A :class:`Grid` that forwards to Flower's and logs each ``send_and_receive`` exchange.

    Sizes are read before sending (the grid may consume the messages) and from the replies
    after; error replies carry no content and count zero bytes.
    """

    def __init__(self, inner: Grid, log: EventLog) -> None:
        self._inner = inner
        self._log = log

    def set_run(self, run: Any) -> None:
        """Forwarded."""
        self._inner.set_run(run)

    @property
    def run(self) -> Any:
        """Forwarded."""
        return self._inner.run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """Forwarded."""
        return self._inner.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        """Forwarded."""
        return self._inner.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Forwarded."""
        return self._inner.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Forwarded."""
        return self._inner.pull_messages(message_ids)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Forwarded; logs stage, round, counts and payload bytes each way."""
        outgoing = list(messages)
        stage = _stage_of(outgoing)
        group = outgoing[0].metadata.group_id if outgoing else ""
        down = sum(payload_bytes(m.content) for m in outgoing)
        started = time.time()
        replies = list(self._inner.send_and_receive(outgoing, timeout=timeout))
        errors = sum(1 for m in replies if m.has_error())
        up = sum(payload_bytes(m.content) for m in replies if m.has_content())
        answered = [m for m in replies if m.has_content()]
        self._log.write(
            "exchange",
            round=int(group) if group.isdigit() else None,
            stage=stage,
            sent=len(outgoing),
            replies=len(replies),
            errors=errors,
            down_bytes=down,
            up_bytes=up,
            down_records=_record_sizes(outgoing[0].content) if outgoing else {},
            up_records=_record_sizes(answered[0].content) if answered else {},
            started=started,
        )
        return replies


class RecordingFedAvg(FedAvg):
    """Legacy FedAvg over all ``clients`` (no evaluation) that logs round start and end."""

    def __init__(self, log: EventLog, clients: int, start: np.ndarray) -> None:
        super().__init__(
            fraction_fit=1.0,
            fraction_evaluate=0.0,
            min_fit_clients=clients,
            min_available_clients=clients,
            initial_parameters=ndarrays_to_parameters([start]),
        )
        self.log = log
        self.expected_shift = 0.0

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Sample (FedAvg), then mark the round start."""
        chosen = super().configure_fit(server_round, parameters, client_manager)
        self.log.write("round_start", round=server_round, nodes=len(chosen))
        return chosen

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Aggregate (FedAvg), then log who was aggregated and what that should add."""
        aggregated = super().aggregate_fit(server_round, results, failures)
        contributors = sorted(int(res.metrics["partition-id"]) for _, res in results)
        if aggregated[0] is not None and contributors:
            self.expected_shift += float(np.mean([client_shift(p) for p in contributors]))
        self.log.write(
            "round_end",
            round=server_round,
            results=len(results),
            failures=len(failures),
            contributors=contributors,
        )
        return aggregated


def build_workflow(cfg: dict[str, Any]) -> DefaultWorkflow:
    """``DefaultWorkflow`` with Flower's SecAgg+ fit workflow when ``secure`` is set."""
    if not bool(cfg["secure"]):
        return DefaultWorkflow()
    secagg = SecAggPlusWorkflow(
        num_shares=int(cfg["num-shares"]), reconstruction_threshold=int(cfg["threshold"])
    )
    return DefaultWorkflow(fit_workflow=secagg)


def _final_errors(legacy: LegacyContext, start: np.ndarray, expected: float) -> dict[str, float]:
    final = legacy.state.array_records[MAIN_PARAMS_RECORD].to_numpy_ndarrays()[0]
    error = final.astype(np.float64) - start.astype(np.float64) - expected
    return {
        "final_shift": float(error.mean() + expected),
        "expected_shift": expected,
        "max_abs_error": float(np.abs(error).max()),
    }


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run ``num-rounds`` rounds on a ``num-params`` float32 model; log times and bytes."""
    cfg = dict(context.run_config)
    validate_drop_stage(str(cfg["drop-stage"]), bool(cfg["secure"]))
    log = EventLog(str(cfg["timing-file"]))
    log.write("main_start")
    start = initial_model(int(cfg["num-params"]))
    strategy = RecordingFedAvg(log, int(cfg["num-clients"]), start)
    legacy = LegacyContext(
        context=context,
        config=ServerConfig(num_rounds=int(cfg["num-rounds"])),
        strategy=strategy,
    )
    build_workflow(cfg)(CountingGrid(grid, log), legacy)
    log.write("end", **_final_errors(legacy, start, strategy.expected_shift))
