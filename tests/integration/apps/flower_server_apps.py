"""Flower 1.42 ServerApps and message-API ClientApps (NumPy only), as Flower users write them.

Client ``p`` (node config ``partition-id``) adds ``1 + p`` to every array it trains and
reports ``num-examples = 10 (p + 1)`` and ``train_loss = p``; its evaluation reports
``eval_loss = mean(w)``, ``accuracy = 0.5 + 0.1 p`` and ``num-examples = 5``.  With node
config ``behaviour=raise`` the train handler raises.

The ServerApps keep their strategy's :class:`Result` in :data:`RESULTS` so tests can
compare it with :func:`reference_run`, which runs the same ServerApp against
:class:`LocalGrid`: a grid that hands each message straight to the ClientApp in this
process, with no transport at all.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.client import Client, NumPyClient
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.compat.server import ServerAppComponents
from flwr.server import LegacyContext, ServerConfig
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAdam, FedMedian, Result
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

#: The last Result of each ServerApp, by name.
RESULTS: dict[str, Result] = {}
NUM_NODES = 3


def initial_arrays() -> ArrayRecord:
    return ArrayRecord(
        {"w": Array(np.zeros((4, 3), np.float32)), "b": Array(np.zeros(3, np.float32))}
    )


def _partition(context: Context) -> int:
    return int(context.node_config.get("partition-id", 0))


# ----------------------------------------------------------------- client apps

message_app = ClientApp()


@message_app.train()
def train(msg: Message, context: Context) -> Message:
    if context.node_config.get("behaviour") == "raise":
        raise ValueError("deliberate failure in a train handler")
    shift = 1 + _partition(context)
    arrays = msg.content.array_records["arrays"]
    trained = ArrayRecord({k: Array(v.numpy() + shift) for k, v in arrays.items()})
    metrics = MetricRecord({"train_loss": float(_partition(context)), "num-examples": 10 * shift})
    return Message(RecordDict({"arrays": trained, "metrics": metrics}), reply_to=msg)


@message_app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    w = msg.content.array_records["arrays"]["w"].numpy()
    metrics = MetricRecord(
        {
            "eval_loss": float(w.mean()),
            "accuracy": 0.5 + 0.1 * _partition(context),
            "num-examples": 5,
        }
    )
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


query_client_app = ClientApp()


@query_client_app.query()
def answer(msg: Message, context: Context) -> Message:
    reply = MetricRecord({"partition": _partition(context)})
    return Message(RecordDict({"answer": reply}), reply_to=msg)


class ShiftClient(NumPyClient):
    def __init__(self, partition: int) -> None:
        self.partition = partition

    def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
        return [np.zeros((4, 3), np.float32), np.zeros(3, np.float32)]

    def fit(self, parameters, config):
        shift = self.partition + 1
        return [p + shift for p in parameters], 10 * shift, {"train_loss": float(self.partition)}

    def evaluate(self, parameters, config):
        return float(parameters[0].mean()), 5, {"accuracy": 0.5 + 0.1 * self.partition}


def client_fn(context: Context) -> Client:
    return ShiftClient(_partition(context)).to_client()


legacy_client_app = ClientApp(client_fn=client_fn)


# ----------------------------------------------------------------- server apps


def _strategy_kwargs() -> dict[str, Any]:
    return {
        "fraction_train": 1.0,
        "fraction_evaluate": 1.0,
        "min_train_nodes": NUM_NODES,
        "min_evaluate_nodes": NUM_NODES,
        "min_available_nodes": NUM_NODES,
    }


fedadam_app = ServerApp()


@fedadam_app.main()
def fedadam_main(grid: Grid, context: Context) -> None:
    strategy = FedAdam(**_strategy_kwargs(), eta=0.1, beta_1=0.9, beta_2=0.99)
    RESULTS["fedadam"] = strategy.start(
        grid=grid,
        initial_arrays=initial_arrays(),
        num_rounds=int(context.run_config["num-server-rounds"]),
        train_config=ConfigRecord({"lr": float(context.run_config.get("lr", 0.1))}),
    )


fedmedian_app = ServerApp()


@fedmedian_app.main()
def fedmedian_main(grid: Grid, context: Context) -> None:
    strategy = FedMedian(**_strategy_kwargs())
    RESULTS["fedmedian"] = strategy.start(
        grid=grid,
        initial_arrays=initial_arrays(),
        num_rounds=int(context.run_config["num-server-rounds"]),
    )


def legacy_server_fn(context: Context) -> ServerAppComponents:
    strategy = LegacyFedAvg(
        min_fit_clients=NUM_NODES,
        min_evaluate_clients=NUM_NODES,
        min_available_clients=NUM_NODES,
    )
    rounds = int(context.run_config["num-server-rounds"])
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=rounds))


legacy_app = ServerApp(server_fn=legacy_server_fn)

uint64_app = ServerApp()


@uint64_app.main()
def uint64_main(grid: Grid, context: Context) -> None:
    """Sends arrays of a dtype geofl's wire does not carry."""
    arrays = ArrayRecord({"counts": Array(np.arange(4, dtype=np.uint64))})
    FedMedian(**_strategy_kwargs()).start(grid=grid, initial_arrays=arrays, num_rounds=1)


secagg_app = ServerApp()


@secagg_app.main()
def secagg_main(grid: Grid, context: Context) -> None:
    """Flower's legacy workflow with SecAgg+, which geofl's clients cannot take part in."""
    strategy = LegacyFedAvg(
        min_fit_clients=NUM_NODES, min_available_clients=NUM_NODES, fraction_evaluate=0.0
    )
    legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=1), strategy=strategy)
    secagg = SecAggPlusWorkflow(num_shares=NUM_NODES, reconstruction_threshold=2)
    DefaultWorkflow(fit_workflow=secagg)(grid, legacy)


query_app = ServerApp()


@query_app.main()
def query_main(grid: Grid, context: Context) -> None:
    """A custom main: one query per node, a message to a node that does not exist."""
    nodes = sorted(grid.get_node_ids())
    while len(nodes) < NUM_NODES:
        nodes = sorted(grid.get_node_ids())
    messages = [Message(RecordDict({"q": ConfigRecord({"x": 1})}), node, "query") for node in nodes]
    messages.append(Message(RecordDict(), 987_654_321, "query"))
    RESULTS["query"] = list(grid.send_and_receive(messages, timeout=30))  # type: ignore[assignment]


# ----------------------------------------------------------------- the reference


class LocalGrid(Grid):
    """Delivers each message to the ClientApp in this process: no transport at all."""

    def __init__(self, client_app: ClientApp, num_nodes: int, run_config: dict[str, Any]) -> None:
        self._app = client_app
        self._contexts = {
            node + 1: Context(
                run_id=0,
                node_id=node + 1,
                node_config={"partition-id": node, "num-partitions": num_nodes},
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for node in range(num_nodes)
        }
        self._replies: dict[str, Message] = {}

    def set_run(self, run: Run) -> None:
        pass

    @property
    def run(self) -> Run:
        return Run.create_empty(0)

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            message_id = uuid.uuid4().hex
            message.metadata.__dict__["_message_id"] = message_id
            context = self._contexts[message.metadata.dst_node_id]
            self._replies[message_id] = self._app(message, context)
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages, *, timeout=None):
        return self.pull_messages(list(self.push_messages(messages)))


def reference_run(server_app: ServerApp, client_app: ClientApp, run_config: dict[str, Any]) -> None:
    """Run ``server_app`` against :class:`LocalGrid` (its Result lands in RESULTS)."""
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 0, SUPERLINK_NODE_ID
    context = Context(
        run_id=0,
        node_id=SUPERLINK_NODE_ID,
        node_config={},
        state=RecordDict(),
        run_config=run_config,
    )
    server_app(LocalGrid(client_app, NUM_NODES, run_config), context)
