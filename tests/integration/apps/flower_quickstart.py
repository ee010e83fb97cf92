"""A Flower message-API ClientApp written as Flower's quickstart-pytorch writes one.

A small CNN on Fashion-MNIST: the handlers rebuild the model from the received
``"arrays"``, read ``partition-id``/``num-partitions`` from the node config,
``batch-size``/``local-epochs`` from the run config and ``lr`` from the message's
``"config"``, and reply with ``ArrayRecord(model.state_dict())`` and a MetricRecord with
``"num-examples"``. Nothing here knows about geofl except :func:`make_model`, the
server's initial weights. The images come from the Debian package through
``examples.fashion_mnist.data`` (the repository root must be importable); only the first
:data:`SAMPLES` training images are used, split IID, 80 % train / 20 % validation.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's convention)
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SAMPLES = 600
MODEL_SEED = 0


class Net(nn.Module):
    """Two 5x5 convolutions with pooling, then two linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.conv2 = nn.Conv2d(6, 12, 5)
        self.fc1 = nn.Linear(12 * 4 * 4, 48)
        self.fc2 = nn.Linear(48, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def make_model() -> dict[str, np.ndarray]:
    """The server's initial weights: a seeded Net, named by its state dict."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(MODEL_SEED)
        return {k: v.numpy().copy() for k, v in Net().state_dict().items()}


@lru_cache(maxsize=1)
def _images() -> tuple[torch.Tensor, torch.Tensor]:
    from examples.fashion_mnist.data import load_split

    images, labels = load_split("train")
    x = torch.from_numpy(images[:SAMPLES].astype(np.float32) / 255.0).unsqueeze(1)
    return (x - 0.5) / 0.5, torch.from_numpy(labels[:SAMPLES])


def load_data(
    partition_id: int, num_partitions: int, batch_size: int
) -> tuple[DataLoader[tuple[torch.Tensor, ...]], DataLoader[tuple[torch.Tensor, ...]]]:
    """This partition's train and validation loaders (seeded shuffling)."""
    x, y = _images()
    part = np.array_split(np.arange(len(y)), num_partitions)[partition_id]
    cut = int(0.8 * len(part))
    train, val = part[:cut], part[cut:]
    shuffle = torch.Generator().manual_seed(partition_id)
    return (
        DataLoader(TensorDataset(x[train], y[train]), batch_size, shuffle=True, generator=shuffle),
        DataLoader(TensorDataset(x[val], y[val]), batch_size),
    )


def train_fn(
    net: Net, loader: DataLoader[tuple[torch.Tensor, ...]], epochs: int, lr: float
) -> float:
    """Plain SGD; the mean training loss."""
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    total, batches = 0.0, 0
    for _ in range(epochs):
        for images, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(net(images), labels)
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
    return total / max(batches, 1)


def test_fn(net: Net, loader: DataLoader[tuple[torch.Tensor, ...]]) -> tuple[float, float]:
    """Mean loss and accuracy."""
    net.eval()
    loss, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for images, labels in loader:
            outputs = net(images)
            loss += F.cross_entropy(outputs, labels, reduction="sum").item()
            correct += int((outputs.argmax(1) == labels).sum())
            count += len(labels)
    return loss / count, correct / count


app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model on the local partition."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    trainloader, _ = load_data(
        int(context.node_config["partition-id"]),
        int(context.node_config["num-partitions"]),
        int(context.run_config["batch-size"]),
    )
    train_loss = train_fn(
        model,
        trainloader,
        int(context.run_config["local-epochs"]),
        float(msg.content["config"]["lr"]),
    )
    metrics = {"train_loss": train_loss, "num-examples": len(trainloader.dataset)}
    content = RecordDict(
        {"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)}
    )
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the received model on the local validation split."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    _, valloader = load_data(
        int(context.node_config["partition-id"]),
        int(context.node_config["num-partitions"]),
        int(context.run_config["batch-size"]),
    )
    eval_loss, eval_acc = test_fn(model, valloader)
    metrics = {"eval_loss": eval_loss, "eval_acc": eval_acc, "num-examples": len(valloader.dataset)}
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
