"""The Flower 1.42 side of the WAN-scheduling benchmark (:mod:`benchmarks.wan_schedule`).

``server_app`` runs stock message-API FedAvg: each round it samples ``per-round`` of the
``num-clients`` virtual SuperNodes uniformly (Flower's own sampling), trains, aggregates,
and evaluates the global model on the 10,000 Fashion-MNIST test images with geofl's
:func:`examples.fashion_mnist.task.server_evaluate` (Flower's ``evaluate_fn``, before
round 1 and after every round). It appends JSON-lines events to the run config's
``timing-file``: ``round_replies`` with the partition id and trained samples of every
client that replied, ``server_eval`` with the accuracy, ``done`` at the end.

Flower's simulation has no notion of links, so it has no simulated time of its own: the
benchmark computes each round's duration afterwards from the same link model geofl's
virtual clock uses (the slowest sampled client's download + compute + upload), from the
replies logged here.

``client_app`` wraps geofl's own CNN client (:func:`examples.fashion_mnist.task.client_app`):
it builds the geofl :class:`~geofl.client.app.ClientContext` a geofl worker would give the
node (``partition-id``, ``num-partitions``, the partition file, one torch thread) and calls
the same ``fit``, so both frameworks train the same code on the same shares.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from benchmarks.flower_bridge import fit_config, int_setting, log_event, train_config
from examples.fashion_mnist.task import client_app as fashion_client_app
from examples.fashion_mnist.task import make_model, server_evaluate
from geofl.client.app import ClientContext
from geofl.client.partition import PARTITION_FILE_KEY
from geofl.protocols.types import Scalar
from geofl.server.simulation.workers import trained_samples

__all__ = [
    "ROUND_KEYS",
    "WanFedAvg",
    "client_app",
    "geofl_context",
    "server_app",
]

server_app = ServerApp()
client_app = ClientApp()
#: Run-config keys (with ``-``) sent to the clients as geofl's round config keys (with ``_``).
ROUND_KEYS = ("local_epochs", "lr", "batch_size")


def _metric_int(metrics: MetricRecord, key: str) -> int:
    value = metrics[key]
    if not isinstance(value, int | float):
        raise ValueError(f"reply metric {key} must be a number, got {value!r}")
    return int(value)


class WanFedAvg(FedAvg):
    """Stock FedAvg sampling ``per_round`` of ``clients`` nodes, logging who replied."""

    def __init__(self, timing_file: str, clients: int, per_round: int) -> None:
        super().__init__(
            fraction_train=per_round / clients,
            fraction_evaluate=0.0,
            min_train_nodes=per_round,
            min_available_nodes=clients,
        )
        self.timing_file = timing_file

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Log each replying client's partition id and samples, then aggregate (FedAvg)."""
        received = list(replies)
        clients = [
            [_metric_int(metrics, "partition-id"), _metric_int(metrics, "samples")]
            for msg in received
            if not msg.has_error()
            for metrics in [msg.content.metric_records["metrics"]]
        ]
        errors = sum(1 for msg in received if msg.has_error())
        log_event(
            self.timing_file, "round_replies", round=server_round, clients=clients, errors=errors
        )
        return super().aggregate_train(server_round, received)


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """FedAvg for ``num-rounds`` rounds with server-side evaluation after each."""
    cfg = dict(context.run_config)
    timing = str(cfg["timing-file"])
    strategy = WanFedAvg(timing, int_setting(cfg, "num-clients"), int_setting(cfg, "per-round"))

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        weights = {name: arr.numpy() for name, arr in arrays.items()}
        loss, metrics = server_evaluate(weights)
        accuracy = float(metrics["accuracy"])
        log_event(timing, "server_eval", round=server_round, accuracy=accuracy, loss=loss)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    initial = ArrayRecord({name: Array(value) for name, value in make_model().items()})
    strategy.start(
        grid=grid,
        initial_arrays=initial,
        num_rounds=int_setting(cfg, "num-rounds"),
        train_config=train_config(cfg, ROUND_KEYS),
        evaluate_fn=evaluate,
    )
    log_event(timing, "done")


def geofl_context(context: Context) -> ClientContext:
    """The geofl client context a geofl worker would give this node.

    ``partition-id``/``num-partitions`` come from Flower's node config; the partition file
    and ``max-train-samples`` (0: all) from the run config; torch uses one thread, as in
    geofl's workers.
    """
    node = context.node_config
    partition_id = int(str(node["partition-id"]))
    node_config: dict[str, Scalar] = {
        "partition-id": partition_id,
        "num-partitions": int(str(node["num-partitions"])),
        "torch-threads": 1,
        "max-train-samples": int(str(context.run_config.get("max-train-samples", 0))),
        PARTITION_FILE_KEY: str(context.run_config["partition-file"]),
    }
    return ClientContext(
        node_id=context.node_id, node_name=f"flower-node-{partition_id}", node_config=node_config
    )


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """Run geofl's CNN client's ``fit``; reply with its weights, examples and samples."""
    received = msg.content.array_records["arrays"]
    weights = {name: arr.numpy() for name, arr in received.items()}
    geofl_ctx = geofl_context(context)
    config = fit_config(dict(msg.content.config_records["config"]), ROUND_KEYS)
    trained, num_examples, metrics = fashion_client_app(geofl_ctx).fit(weights, config)
    arrays = ArrayRecord({name: Array(np.asarray(value)) for name, value in trained.items()})
    reply = MetricRecord(
        {
            "num-examples": num_examples,
            "partition-id": int(str(geofl_ctx.node_config["partition-id"])),
            "samples": trained_samples(num_examples, metrics, dict(config)),
        }
    )
    return Message(content=RecordDict({"arrays": arrays, "metrics": reply}), reply_to=msg)
