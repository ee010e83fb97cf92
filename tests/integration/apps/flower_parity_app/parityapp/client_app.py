"""A message-API ClientApp: adds 1 to ``w``, reports its partition, run id and examples."""

import time
from logging import INFO

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.client import Client, NumPyClient
from flwr.clientapp import ClientApp
from flwr.common.logger import log

app = ClientApp()


def _partition(context: Context) -> int:
    return int(context.node_config["partition-id"])


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One step: w + 1; sleeps ``sleep-s`` of the message's config first."""
    config = msg.content.config_records.get("config")
    time.sleep(float(config.get("sleep-s", 0.0)) if config is not None else 0.0)
    partition = _partition(context)
    w = msg.content.array_records["arrays"]["w"].numpy()
    log(INFO, "parity client %s trained", partition)
    metrics = MetricRecord(
        {
            "num-examples": 10 * (partition + 1),
            "train_loss": float(partition),
            "run-id": context.run_id,
        }
    )
    arrays = ArrayRecord({"w": Array(np.asarray(w + 1.0, dtype=np.float32))})
    return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Reports the mean of ``w`` and a loss of 0.5 over 10 examples."""
    w = msg.content.array_records["arrays"]["w"].numpy()
    metrics = MetricRecord({"num-examples": 10, "eval_loss": 0.5, "w-mean": float(w.mean())})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


class _Shift(NumPyClient):
    """The legacy NumPyClient of the same step: w + 1."""

    def __init__(self, partition: int) -> None:
        self.partition = partition

    def fit(self, parameters, config):  # type: ignore[no-untyped-def]
        examples = 10 * (self.partition + 1)
        return [parameters[0] + 1.0], examples, {"train_loss": float(self.partition)}

    def evaluate(self, parameters, config):  # type: ignore[no-untyped-def]
        return 0.5, 10, {"w-mean": float(parameters[0].mean())}


def legacy_client_fn(context: Context) -> Client:
    return _Shift(_partition(context)).to_client()


legacy_app = ClientApp(client_fn=legacy_client_fn)
