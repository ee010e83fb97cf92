"""ServerApp: stock message-API FedAvg over all nodes, logging round boundaries and bytes.

Round time is measured here, inside the ServerApp, from ``configure_train`` of round r
(after node sampling, so round 1 does not include waiting for SuperNodes to register) to
``configure_train`` of round r + 1; the last round ends when ``Strategy.start`` returns.
Events go as JSON lines to the ``timing-file`` run-config path, with wall-clock times so
the harness can attribute proxy byte counts to rounds. Each round also records the
serialized array bytes of the messages it sent (``bytes_down``) and of the replies it
aggregated (``bytes_up``): Flower's own payload, the only byte count a simulation has.

The ``task`` run-config value picks the model: ``echo`` (one seeded tensor ``w`` of
``num-params`` values; the end event carries the final model's mean shift) or
``mlp-digits`` / ``cnn-fashion`` (the shared digits MLP, Fashion-MNIST CNN; the end event
carries its test accuracy).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from types import ModuleType

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

__all__ = ["TimedFedAvg", "app", "array_bytes", "initial_model"]

app = ServerApp()


def array_bytes(messages: Iterable[Message]) -> int:
    """Serialized bytes of every array in the messages' ``arrays`` records."""
    total = 0
    for msg in messages:
        if msg.has_content() and "arrays" in msg.content.array_records:
            total += sum(len(arr.data) for arr in msg.content.array_records["arrays"].values())
    return total


class TimedFedAvg(FedAvg):
    """Stock FedAvg over all ``clients`` nodes (no federated evaluation) that appends a
    ``round_start`` event when a round's messages are built and a ``round_replies`` event
    when its replies reach aggregation."""

    def __init__(self, timing_file: str, clients: int) -> None:
        super().__init__(
            fraction_train=1.0,
            fraction_evaluate=0.0,
            min_train_nodes=clients,
            min_available_nodes=clients,
        )
        self.timing_file = timing_file

    def log_event(self, event: str, **fields: float | int | str) -> None:
        """Append one JSON event line with the current wall time."""
        with open(self.timing_file, "a", encoding="utf-8") as out:
            out.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Build the round's messages (FedAvg), then mark the round start."""
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self.log_event(
            "round_start", round=server_round, nodes=len(messages), bytes_down=array_bytes(messages)
        )
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Record the replies' payload, then aggregate them (FedAvg)."""
        received = list(replies)
        self.log_event(
            "round_replies",
            round=server_round,
            replies=len(received),
            bytes_up=array_bytes(received),
        )
        return super().aggregate_train(server_round, received)


def initial_model(params: int) -> np.ndarray:
    """Seeded standard-normal float32 values.

    Not zeros: Flower splits arrays into 5 MiB content-addressed chunks and deduplicates
    them, so a constant-valued model would upload and download only a couple of distinct
    chunks per client and the benchmark would understate the bytes moved.
    """
    return np.random.default_rng(0).standard_normal(params, dtype=np.float32)


def _run_echo(strategy: TimedFedAvg, grid: Grid, cfg: Mapping[str, object]) -> None:
    """Echo task; ``final_shift`` = mean(final - initial) in float64.

    With every client adding ``1 + partition-id`` at weight 1 it must equal
    ``rounds * (1 + (clients - 1) / 2)``.
    """
    start = initial_model(int(str(cfg["num-params"])))
    initial = ArrayRecord({"w": Array(start)})
    result = strategy.start(
        grid=grid, initial_arrays=initial, num_rounds=int(str(cfg["num-rounds"]))
    )
    shift = result.arrays["w"].numpy().astype(np.float64) - start.astype(np.float64)
    strategy.log_event("end", final_shift=float(shift.mean()))


def _run_training(
    strategy: TimedFedAvg, grid: Grid, cfg: Mapping[str, object], task: ModuleType
) -> None:
    """A shared training task (``digits_mlp``, ``fashion_cnn``); the final global model's
    test accuracy goes into the end event."""
    initial = ArrayRecord({k: Array(v) for k, v in task.initial_weights().items()})
    result = strategy.start(
        grid=grid, initial_arrays=initial, num_rounds=int(str(cfg["num-rounds"]))
    )
    final = {name: arr.numpy() for name, arr in result.arrays.items()}
    strategy.log_event("end", accuracy=task.accuracy(final))


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run FedAvg for the configured task and log its outcome."""
    cfg = dict(context.run_config)
    strategy = TimedFedAvg(str(cfg["timing-file"]), int(str(cfg["num-clients"])))
    strategy.log_event("main_start")
    task = str(cfg["task"])
    if task == "echo":
        _run_echo(strategy, grid, cfg)
    elif task == "mlp-digits":
        from benchmarks.apps import digits_mlp

        _run_training(strategy, grid, cfg, digits_mlp)
    elif task == "cnn-fashion":
        from benchmarks.apps import fashion_cnn

        _run_training(strategy, grid, cfg, fashion_cnn)
    else:
        raise ValueError(
            f"unknown task {task!r} in the run config; expected echo, mlp-digits or cnn-fashion"
        )
