"""ClientApp: return the received arrays plus ``1 + partition-id``.

Every client's update differs, so content-addressed deduplication in the transport cannot
skip uploads; there is no training, so the round time is the framework's alone.
"""

from __future__ import annotations

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

__all__ = ["app"]

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Echo the model shifted by a client-specific constant, weight 1."""
    shift = 1.0 + float(context.node_config["partition-id"])
    received = msg.content.array_records["arrays"]
    updated = ArrayRecord(
        {name: Array(arr.numpy() + arr.numpy().dtype.type(shift)) for name, arr in received.items()}
    )
    reply = RecordDict({"arrays": updated, "metrics": MetricRecord({"num-examples": 1})})
    return Message(content=reply, reply_to=msg)
