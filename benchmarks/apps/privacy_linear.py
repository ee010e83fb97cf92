"""Softmax regression on Fashion-MNIST, the model of the privacy figures (issue 15).

784 x 10 weights and 10 biases (7,850 float32 parameters, 8,192 once rotated for
distributed DP): small on purpose. DP noise on the mean has norm ``z C sqrt(d) / m``
against a signal of at most ``C``, so with ``m = 100`` clients a round a large model drowns
in it; a linear model is the honest small case, and it trains in NumPy in well under a
millisecond per client, so 1,000 virtual clients fit the CPU budget.

Each fit runs ``local_steps`` SGD steps (``lr``, batches of ``batch_size`` drawn with
replacement from the client's share, seeded by the client and the round). The client's
share is the simulator's partition file (``simulation.partition``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import numpy.typing as npt

from examples.fashion_mnist.data import load_split
from examples.fashion_mnist.task import PIXEL_MEAN, PIXEL_STD
from geofl.client.app import Client, ClientContext
from geofl.client.partition import assigned_indices
from geofl.protocols.types import Config, Metrics, Scalar, Weights, WeightsView

__all__ = ["LinearClient", "client_app", "make_model", "server_evaluate"]

PIXELS = 28 * 28
CLASSES = 10
SEED = 15
Floats = npt.NDArray[np.float32]


def make_model() -> Weights:
    """Zero weights: softmax regression needs no symmetry breaking."""
    return {
        "w": np.zeros((PIXELS, CLASSES), np.float32),
        "b": np.zeros(CLASSES, np.float32),
    }


@lru_cache(maxsize=2)
def _split(split: str) -> tuple[Floats, npt.NDArray[np.int64]]:
    images, labels = load_split("train" if split == "train" else "test")
    flat = images.reshape(len(images), PIXELS).astype(np.float32) / 255.0
    return (flat - PIXEL_MEAN) / PIXEL_STD, labels


def _probabilities(x: Floats, w: Floats, b: Floats) -> Floats:
    logits = x @ w + b
    logits -= logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    out: Floats = exp / exp.sum(axis=1, keepdims=True)
    return out


def _number(config: Config, key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"config[{key!r}] must be a number, got {value!r}")
    return float(value)


class LinearClient(Client):
    """Local SGD on the cross-entropy of one client's share of the training images."""

    def __init__(self, partition_id: int, indices: npt.NDArray[np.int64]) -> None:
        if indices.size == 0:
            raise ValueError(f"client {partition_id} has no training images")
        self.partition_id = partition_id
        self.indices = indices

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        """``local_steps`` steps of SGD from the global model."""
        steps = int(_number(config, "local_steps", 10))
        batch = int(_number(config, "batch_size", 32))
        lr = _number(config, "lr", 0.1)
        rng = np.random.default_rng(
            [SEED, self.partition_id, int(_number(config, "server_round", 1))]
        )
        x_all, y_all = _split("train")
        w = np.array(parameters["w"], dtype=np.float32)
        b = np.array(parameters["b"], dtype=np.float32)
        loss = 0.0
        for _ in range(steps):
            picks = self.indices[rng.integers(0, self.indices.size, batch)]
            x, y = x_all[picks], y_all[picks]
            probabilities = _probabilities(x, w, b)
            loss = float(-np.log(probabilities[np.arange(batch), y] + 1e-12).mean())
            probabilities[np.arange(batch), y] -= 1.0
            probabilities /= batch
            w -= lr * (x.T @ probabilities)
            b -= lr * probabilities.sum(axis=0)
        return {"w": w, "b": b}, int(self.indices.size), {"train_loss": loss}

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        """Not used by the benchmark (the server evaluates)."""
        return 0.0, 0, {}


def client_app(context: ClientContext) -> LinearClient:
    """The client of partition ``partition-id``, on the simulator's share."""
    indices = assigned_indices(context)
    if indices is None:
        raise ValueError("privacy_linear needs simulation.partition (a partition file)")
    return LinearClient(int(context.node_config.get("partition-id", 0)), indices)


def accuracy(weights: WeightsView) -> tuple[float, float]:
    """Cross-entropy and accuracy on the 10,000 test images."""
    x, y = _split("test")
    w = np.asarray(weights["w"], dtype=np.float32)
    b = np.asarray(weights["b"], dtype=np.float32)
    probabilities = _probabilities(x, w, b)
    loss = float(-np.log(probabilities[np.arange(len(y)), y] + 1e-12).mean())
    return loss, float(np.mean(probabilities.argmax(axis=1) == y))


def server_evaluate(weights: WeightsView) -> tuple[float, dict[str, Scalar]]:
    """``accuracy`` as the coordinator's server evaluation."""
    loss, acc = accuracy(weights)
    return loss, {"accuracy": acc}
