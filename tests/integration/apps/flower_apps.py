"""NumPy-only Flower 1.42 client apps, written as Flower users write them.

Every client of partition ``p`` reports ``10 * (p + 1)`` examples, so aggregates are known
exactly (as in ``geofl_testapp``):

* ``legacy_app`` / ``client_fn``: a ``NumPyClient`` through ``ClientApp(client_fn=...)``
  or as a bare ``client_fn``; ``fit`` adds ``(i + 1) * (p + 1)`` to the ``i``-th array (so
  the list order shows), ``evaluate`` reports loss ``mean(arrays[0])`` and
  ``accuracy = 0.5 + 0.1 p``. ``legacy_secagg_app`` is the same with Flower's
  ``secaggplus_mod``, which geofl takes out.
* ``counting_app``: a message-API app counting its train calls in ``context.state``;
  node config ``behaviour=raise`` makes its train handler raise.
* ``dp_app``: a message-API app under ``LocalDpMod`` (app-level mod) whose train
  handler adds 10 to every weight; with ``sensitivity=0`` no noise is added, so the
  update the server receives is exactly clipped to norm :data:`DP_CLIP`.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.client import Client, NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import LocalDpMod

DP_CLIP = 1.0


def make_model() -> dict[str, np.ndarray]:
    return {"w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32)}


def _partition(context: Context) -> int:
    return int(context.node_config.get("partition-id", 0))


class ShiftClient(NumPyClient):
    def __init__(self, partition: int) -> None:
        self.partition = partition

    def fit(self, parameters, config):
        shift = self.partition + 1
        new = [p + (i + 1) * shift for i, p in enumerate(parameters)]
        return new, 10 * shift, {"train_loss": float(self.partition)}

    def evaluate(self, parameters, config):
        return float(parameters[0].mean()), 5, {"accuracy": 0.5 + 0.1 * self.partition}


def client_fn(context: Context) -> Client:
    return ShiftClient(_partition(context)).to_client()


def unannotated_client_fn(context):
    """A client_fn without annotations, returning a NumPyClient (Flower warns, and accepts)."""
    return ShiftClient(int(context.node_config.get("partition-id", 0)))


legacy_app = ClientApp(client_fn=client_fn)
legacy_secagg_app = ClientApp(client_fn=client_fn, mods=[secaggplus_mod])


def _reply(msg: Message, arrays: ArrayRecord | None, metrics: dict[str, float]) -> Message:
    records: dict[str, ArrayRecord | MetricRecord] = {"metrics": MetricRecord(metrics)}
    if arrays is not None:
        records["arrays"] = arrays
    return Message(RecordDict(records), reply_to=msg)


counting_app = ClientApp()


@counting_app.train()
def count_train(msg: Message, context: Context) -> Message:
    if context.node_config.get("behaviour") == "raise":
        raise ValueError("deliberate failure in a Flower train handler")
    calls = int(context.state.get("calls", MetricRecord({"train": 0}))["train"]) + 1
    context.state["calls"] = MetricRecord({"train": calls})
    arrays = ArrayRecord({k: Array(v.numpy() + 1.0) for k, v in msg.content["arrays"].items()})
    return _reply(msg, arrays, {"num-examples": 10 * (_partition(context) + 1), "calls": calls})


@counting_app.evaluate()
def count_evaluate(msg: Message, context: Context) -> Message:
    mean = float(msg.content["arrays"]["w"].numpy().mean())
    return _reply(msg, None, {"eval_loss": mean, "num-examples": 5})


dp_app = ClientApp(
    mods=[LocalDpMod(clipping_norm=DP_CLIP, sensitivity=0.0, epsilon=1.0, delta=1e-5)]
)


@dp_app.train()
def dp_train(msg: Message, context: Context) -> Message:
    arrays = ArrayRecord({k: Array(v.numpy() + 10.0) for k, v in msg.content["arrays"].items()})
    return _reply(msg, arrays, {"num-examples": 10 * (_partition(context) + 1)})
