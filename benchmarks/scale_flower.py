"""The Flower 1.42 side of the scale benchmark (:mod:`benchmarks.scale`).

``server_app`` runs stock message-API FedAvg, sampling ``per-round`` of ``num-clients``
virtual SuperNodes each round, and appends JSON-lines timing events to the run config's
``timing-file``: ``round_start`` when a round's messages are built (after sampling),
``round_replies`` when its replies reach aggregation, ``rounds_done`` when
``Strategy.start`` returns, and ``done`` with the final model's test accuracy (computed
after ``rounds_done``, so it is not part of any round).

``client_app`` is a thin adapter around geofl's own client,
:func:`examples.fashion_mnist.task.mlp_client_app`: it builds the geofl
:class:`~geofl.client.app.ClientContext` from Flower's node config (``partition-id``,
``num-partitions``) plus the run's partition file, calls the same ``fit`` a geofl worker
calls, and replies with the trained weights, so both frameworks run the same training
code on the same data. The harness generates the app's ``pyproject.toml`` with these two
objects as its components and puts the repository root on ``PYTHONPATH``.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from benchmarks.flower_bridge import fit_config, int_setting, log_event, train_config
from examples.fashion_mnist.task import make_mlp_model, mlp_client_app, mlp_server_evaluate
from geofl.client.app import ClientContext
from geofl.client.partition import PARTITION_FILE_KEY
from geofl.protocols.types import Metrics, Scalar

__all__ = [
    "ScaleFedAvg",
    "client_app",
    "geofl_context",
    "numeric_metrics",
    "server_app",
]

server_app = ServerApp()
client_app = ClientApp()
#: Run-config keys the round config carries to the clients, as geofl's ``round_config``.
ROUND_KEYS = ("local_steps", "batch_size", "lr")


class ScaleFedAvg(FedAvg):
    """Stock FedAvg that samples ``per_round`` of ``clients`` nodes and logs round events.

    ``fraction_train = per_round / clients``; ``min_train_nodes`` is ``min_clients`` (a
    floor on the sample, geofl's ``strategy.min_clients``), and ``min_available_nodes`` is
    the whole pool, so no round starts before every virtual SuperNode is registered.
    """

    def __init__(self, timing_file: str, clients: int, per_round: int, min_clients: int) -> None:
        super().__init__(
            fraction_train=per_round / clients,
            fraction_evaluate=0.0,
            min_train_nodes=min_clients,
            min_available_nodes=clients,
        )
        self.timing_file = timing_file

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample and build the round's messages (FedAvg), then mark the round start."""
        messages = list(super().configure_train(server_round, arrays, config, grid))
        log_event(self.timing_file, "round_start", round=server_round, nodes=len(messages))
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Count the replies and their errors, then aggregate them (FedAvg)."""
        received = list(replies)
        errors = sum(1 for msg in received if msg.has_error())
        log_event(
            self.timing_file,
            "round_replies",
            round=server_round,
            replies=len(received),
            errors=errors,
        )
        return super().aggregate_train(server_round, received)


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """FedAvg over the sampled nodes for ``num-rounds`` rounds; log timings and accuracy."""
    cfg = dict(context.run_config)
    timing = str(cfg["timing-file"])
    strategy = ScaleFedAvg(
        timing,
        int_setting(cfg, "num-clients"),
        int_setting(cfg, "per-round"),
        int_setting(cfg, "min-clients"),
    )
    log_event(timing, "main_start")
    initial = ArrayRecord({name: Array(value) for name, value in make_mlp_model().items()})
    result = strategy.start(
        grid=grid,
        initial_arrays=initial,
        num_rounds=int_setting(cfg, "num-rounds"),
        train_config=train_config(cfg, ROUND_KEYS),
    )
    log_event(timing, "rounds_done")
    final = {name: arr.numpy() for name, arr in result.arrays.items()}
    _loss, metrics = mlp_server_evaluate(final)
    accuracy = metrics.get("accuracy")
    log_event(timing, "done", accuracy=float(accuracy) if isinstance(accuracy, float) else -1.0)


def geofl_context(context: Context) -> ClientContext:
    """The geofl client context a geofl worker would give this node.

    ``partition-id``/``num-partitions`` come from Flower's node config, the partition file
    from the run config; torch is held to one thread, as in geofl's workers.
    """
    node = context.node_config
    partition_id = int(str(node["partition-id"]))
    node_config: dict[str, Scalar] = {
        "partition-id": partition_id,
        "num-partitions": int(str(node["num-partitions"])),
        "torch-threads": 1,
    }
    partition_file = str(context.run_config.get("partition-file", ""))
    if partition_file:
        node_config[PARTITION_FILE_KEY] = partition_file
    return ClientContext(
        node_id=context.node_id,
        node_name=f"flower-node-{partition_id}",
        node_config=node_config,
    )


def numeric_metrics(metrics: Metrics) -> dict[str, int | float]:
    """The int and float metrics (a Flower MetricRecord holds nothing else)."""
    return {
        key: value
        for key, value in metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """Run geofl's MLP client's ``fit`` on the received model; reply with its weights."""
    received = msg.content.array_records["arrays"]
    weights = {name: arr.numpy() for name, arr in received.items()}
    client = mlp_client_app(geofl_context(context))
    config = fit_config(dict(msg.content.config_records["config"]), ROUND_KEYS)
    trained, num_examples, metrics = client.fit(weights, config)
    arrays = ArrayRecord({name: Array(np.asarray(value)) for name, value in trained.items()})
    reply = MetricRecord({**numeric_metrics(metrics), "num-examples": num_examples})
    return Message(content=RecordDict({"arrays": arrays, "metrics": reply}), reply_to=msg)
