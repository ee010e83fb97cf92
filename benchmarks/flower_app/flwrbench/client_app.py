"""ClientApp: the ``task`` run-config value picks what a client does with the model.

* ``echo``: return the received arrays plus ``1 + partition-id`` (weight 1). Every update
  differs, so content-addressed deduplication cannot skip uploads, and there is no
  training: the round time is the framework's alone.
* ``mlp-digits``: train ``benchmarks.apps.digits_mlp``'s MLP on partition ``partition-id``
  of ``num-partitions`` (the code the geofl client runs too; the harness puts the
  repository root on ``PYTHONPATH``). Imported only for this task, so ``echo`` never pays
  for importing torch.
* ``cnn-fashion``: the same with ``benchmarks.apps.fashion_cnn``'s CNN on Fashion-MNIST.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

__all__ = ["app", "echo", "mlp_digits", "trained"]

app = ClientApp()


def echo(received: ArrayRecord, context: Context) -> tuple[ArrayRecord, MetricRecord]:
    """The model shifted by a client-specific constant, weight 1."""
    shift = 1.0 + float(context.node_config["partition-id"])
    updated = ArrayRecord(
        {name: Array(arr.numpy() + arr.numpy().dtype.type(shift)) for name, arr in received.items()}
    )
    return updated, MetricRecord({"num-examples": 1})


def mlp_digits(
    received: ArrayRecord, context: Context, server_round: int
) -> tuple[ArrayRecord, MetricRecord]:
    """Local training of the shared digits MLP, weighted by the partition's size."""
    from benchmarks.apps import digits_mlp

    return trained(digits_mlp.train, received, context, server_round)


def trained(
    train_fn: Callable[..., tuple[dict[str, Any], int, float]],
    received: ArrayRecord,
    context: Context,
    server_round: int,
) -> tuple[ArrayRecord, MetricRecord]:
    """``train_fn`` (a shared task's ``train``) on this node's partition, as a reply."""
    weights, examples, loss = train_fn(
        {name: arr.numpy() for name, arr in received.items()},
        int(context.node_config["partition-id"]),
        int(context.node_config["num-partitions"]),
        server_round,
    )
    arrays = ArrayRecord({name: Array(arr) for name, arr in weights.items()})
    return arrays, MetricRecord({"num-examples": examples, "train-loss": loss})


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Run the configured task on the received model and reply with the result."""
    received = msg.content.array_records["arrays"]
    task = str(context.run_config["task"])
    if task == "echo":
        arrays, metrics = echo(received, context)
    elif task == "mlp-digits":
        server_round = int(str(msg.content.config_records["config"]["server-round"]))
        arrays, metrics = mlp_digits(received, context, server_round)
    elif task == "cnn-fashion":
        from benchmarks.apps import fashion_cnn

        server_round = int(str(msg.content.config_records["config"]["server-round"]))
        arrays, metrics = trained(fashion_cnn.train, received, context, server_round)
    else:
        raise ValueError(
            f"unknown task {task!r} in the run config; expected echo, mlp-digits or cnn-fashion"
        )
    reply = RecordDict({"arrays": arrays, "metrics": metrics})
    return Message(content=reply, reply_to=msg)
