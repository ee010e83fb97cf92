"""flowernp: A Flower / NumPy app."""

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flowernp.task import num_examples, train

# Flower ClientApp
app = ClientApp()


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    """Train the model on local data."""
    partition_id = int(context.node_config["partition-id"])
    lr = float(msg.content["config"]["lr"])
    arrays = train(msg.content["arrays"], lr, partition_id)
    metrics = MetricRecord(
        {"train_loss": float(partition_id), "num-examples": num_examples(partition_id)}
    )
    return Message(content=RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate_fn(msg: Message, context: Context) -> Message:
    """Evaluate the model on local data."""
    w = msg.content["arrays"]["w"].numpy()
    metrics = MetricRecord({"w-mean": float(w.mean()), "num-examples": 5})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
