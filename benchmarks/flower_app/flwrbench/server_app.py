"""ServerApp: stock message-API FedAvg over all nodes, logging round boundaries.

Round time is measured here, inside the ServerApp, from ``configure_train`` of round r
(after node sampling, so round 1 does not include waiting for SuperNodes to register) to
``configure_train`` of round r + 1; the last round ends when ``Strategy.start`` returns.
Events go as JSON lines to the ``timing-file`` run-config path, with wall-clock times so
the harness can attribute proxy byte counts to rounds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

__all__ = ["TimedFedAvg", "app", "initial_model"]

app = ServerApp()


class TimedFedAvg(FedAvg):
    """Stock FedAvg over all ``clients`` nodes (no federated evaluation) that appends a
    ``round_start`` event when a round's messages are built."""

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
        self.log_event("round_start", round=server_round, nodes=len(messages))
        return messages


def initial_model(params: int) -> np.ndarray:
    """Seeded standard-normal float32 values.

    Not zeros: Flower splits arrays into 5 MiB content-addressed chunks and deduplicates
    them, so a constant-valued model would upload and download only a couple of distinct
    chunks per client and the benchmark would understate the bytes moved.
    """
    return np.random.default_rng(0).standard_normal(params, dtype=np.float32)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run FedAvg on a ``num-params`` float32 model (one tensor ``w``); log the final shift.

    ``final_shift`` = mean(final - initial) in float64; with every client adding
    ``1 + partition-id`` at weight 1 it must equal ``rounds * (1 + (clients - 1) / 2)``.
    """
    cfg = context.run_config
    strategy = TimedFedAvg(str(cfg["timing-file"]), int(cfg["num-clients"]))
    strategy.log_event("main_start")
    start = initial_model(int(cfg["num-params"]))
    initial = ArrayRecord({"w": Array(start)})
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=int(cfg["num-rounds"]))
    shift = result.arrays["w"].numpy().astype(np.float64) - start.astype(np.float64)
    strategy.log_event("end", final_shift=float(shift.mean()))
