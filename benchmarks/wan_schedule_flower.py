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

import json
import time
from collections.abc import Iterable, Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from examples.fashion_mnist.task import client_app as fashion_client_app
from examples.fashion_mnist.task import make_model, server_evaluate
from geofl.client.app import ClientContext
from geofl.client.partition import PARTITION_FILE_KEY
from geofl.protocols.types import Config, Scalar
from geofl.server.simulation.workers import trained_samples

__all__ = [
    "ROUND_KEYS",
    "WanFedAvg",
    "client_app",
    "fit_config",
    "geofl_context",
    "log_event",
    "server_app",
    "train_config",
]

server_app = ServerApp()
client_app = ClientApp()
#: Run-config keys (with ``-``) sent to the clients as geofl's round config keys (with ``_``).
ROUND_KEYS = ("local_epochs", "lr", "batch_size")


def log_event(path: str, event: str, **fields: object) -> None:
    """Append one JSON event line with the current wall time to ``path``."""
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")


def _int_setting(run_config: Mapping[str, object], key: str) -> int:
    value = run_config[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"run config {key} must be an integer, got {value!r}")
    return value


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


def train_config(run_config: Mapping[str, object]) -> ConfigRecord:
    """The per-round training settings of the run config, under geofl's key names."""
    record = ConfigRecord()
    for key in ROUND_KEYS:
        value = run_config[key.replace("_", "-")]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"run config {key.replace('_', '-')} must be a number, got {value!r}")
        record[key] = value
    return record


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """FedAvg for ``num-rounds`` rounds with server-side evaluation after each."""
    cfg = dict(context.run_config)
    timing = str(cfg["timing-file"])
    strategy = WanFedAvg(timing, _int_setting(cfg, "num-clients"), _int_setting(cfg, "per-round"))

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
        num_rounds=_int_setting(cfg, "num-rounds"),
        train_config=train_config(cfg),
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


def fit_config(sent: Mapping[str, object]) -> Config:
    """geofl's fit config from Flower's train config: the round keys plus ``server_round``."""
    config: Config = {}
    for key in ROUND_KEYS:
        value = sent.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            config[key] = value
    config["server_round"] = int(str(sent["server-round"]))
    return config


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """Run geofl's CNN client's ``fit``; reply with its weights, examples and samples."""
    received = msg.content.array_records["arrays"]
    weights = {name: arr.numpy() for name, arr in received.items()}
    geofl_ctx = geofl_context(context)
    config = fit_config(dict(msg.content.config_records["config"]))
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
