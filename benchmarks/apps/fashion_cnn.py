"""A heavier real training task, identical under every framework: a CNN on Fashion-MNIST.

Like :mod:`benchmarks.apps.digits_mlp`, both the Flower ClientApp
(``benchmarks/flower_app``) and the geofl client (:mod:`benchmarks.apps.geofl_fashion_cnn`)
call :func:`train`, and both servers start from :func:`initial_weights` and score the final
model with :func:`accuracy`.

The task: the small CNN of :mod:`examples.fashion_mnist.task` (two 5x5 conv layers, 16 and
32 channels, max-pooling, 64 hidden units: 114,314 float32 parameters) on Fashion-MNIST
from the Debian package ``dataset-fashion-mnist`` (nothing downloaded). A seeded subset of
``TRAIN_IMAGES`` training images is split IID into ``num_partitions`` parts; each fit runs
``LOCAL_EPOCHS`` epoch of SGD (lr 0.05, momentum 0.9, batch 32) on one part, shuffled by a
generator seeded with the partition and the server round. The final model is scored on all
10,000 test images.

Unlike the digits task, :func:`train` leaves torch's thread count alone: how many threads
each simulated client gets is the framework's choice, and part of what is compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn as nn

from examples.fashion_mnist.data import load_split
from examples.fashion_mnist.task import PIXEL_MEAN, PIXEL_STD, build_model

__all__ = [
    "BATCH_SIZE",
    "LEARNING_RATE",
    "LOCAL_EPOCHS",
    "MOMENTUM",
    "TRAIN_IMAGES",
    "accuracy",
    "evaluate",
    "initial_weights",
    "num_params",
    "partition_indices",
    "train",
]

LOCAL_EPOCHS = 1
LEARNING_RATE = 0.05
MOMENTUM = 0.9
BATCH_SIZE = 32
#: Training images shared among the clients (600 each with 10 clients): a round of real
#: convolution work (about a second per client and core), few enough that repeated
#: benchmarks fit in minutes.
TRAIN_IMAGES = 6_000
MODEL_SEED = 0
SPLIT_SEED = 7
_EVAL_BATCH = 1000

Images = npt.NDArray[np.float32]
Labels = npt.NDArray[np.int64]
Weights = dict[str, npt.NDArray[np.float32]]


def _weights_of(model: nn.Module) -> Weights:
    return {name: t.detach().cpu().numpy().copy() for name, t in model.state_dict().items()}


def _load(model: nn.Module, weights: Mapping[str, npt.NDArray[Any]]) -> None:
    expected = set(model.state_dict())
    if set(weights) != expected:
        raise ValueError(f"weights name {sorted(weights)}, the model has {sorted(expected)}")
    state = {
        name: torch.from_numpy(np.array(arr, dtype=np.float32)) for name, arr in weights.items()
    }
    model.load_state_dict(state)


def initial_weights() -> Weights:
    """Seeded initial weights, the same in every process (the global RNG is left alone)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(MODEL_SEED)
        return _weights_of(build_model())


def num_params() -> int:
    """Parameters of the model (114,314)."""
    return sum(arr.size for arr in initial_weights().values())


def _normalized(images: npt.NDArray[np.uint8]) -> Images:
    """``(N, 1, 28, 28)`` float32 pixels, standardized as the example does."""
    x = (images.astype(np.float32) / 255.0 - PIXEL_MEAN) / PIXEL_STD
    return np.ascontiguousarray(x[:, None])


@lru_cache(maxsize=1)
def _train_subset() -> tuple[Images, Labels]:
    """The seeded ``TRAIN_IMAGES`` training images (normalized) and labels, once per process."""
    images, labels = load_split("train")
    rows = np.random.default_rng(SPLIT_SEED).permutation(len(labels))[:TRAIN_IMAGES]
    return _normalized(images[rows]), labels[rows].astype(np.int64)


@lru_cache(maxsize=1)
def _test_set() -> tuple[Images, Labels]:
    images, labels = load_split("test")
    return _normalized(images), labels.astype(np.int64)


def partition_indices(partition_id: int, num_partitions: int) -> npt.NDArray[np.int64]:
    """Rows of the training subset that belong to one IID partition."""
    if num_partitions < 1 or not 0 <= partition_id < num_partitions:
        raise ValueError(
            f"partition-id {partition_id} is outside 0..{num_partitions - 1} "
            f"(num-partitions {num_partitions})"
        )
    return np.array_split(np.arange(TRAIN_IMAGES, dtype=np.int64), num_partitions)[partition_id]


def train(
    weights: Mapping[str, npt.NDArray[Any]],
    partition_id: int,
    num_partitions: int,
    server_round: int,
) -> tuple[Weights, int, float]:
    """Local training on one partition from ``weights``.

    Returns
    -------
    tuple
        The new weights (same names and shapes, float32), the number of training examples
        (the FedAvg weight) and the mean training loss of the last epoch.
    """
    x_all, y_all = _train_subset()
    rows = partition_indices(partition_id, num_partitions)
    x, y = torch.from_numpy(x_all[rows]), torch.from_numpy(y_all[rows])
    model = build_model()
    _load(model, weights)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    generator = torch.Generator().manual_seed(partition_id * 100_003 + server_round)
    loss_sum, batches = 0.0, 0
    for _ in range(LOCAL_EPOCHS):
        loss_sum, batches = 0.0, 0
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), BATCH_SIZE):
            batch = order[start : start + BATCH_SIZE]
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
            torch.autograd.backward(loss)
            optimizer.step()
            loss_sum, batches = loss_sum + float(loss.detach()), batches + 1
    return _weights_of(model), len(rows), loss_sum / max(batches, 1)


def evaluate(weights: Mapping[str, npt.NDArray[Any]]) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of ``weights`` on the 10,000 test images."""
    x_test, y_test = _test_set()
    model = build_model()
    _load(model, weights)
    model.eval()
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(y_test), _EVAL_BATCH):
            x = torch.from_numpy(x_test[start : start + _EVAL_BATCH])
            y = torch.from_numpy(y_test[start : start + _EVAL_BATCH])
            logits = model(x)
            loss_sum += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(dim=1) == y).sum())
    return loss_sum / len(y_test), correct / len(y_test)


def accuracy(weights: Mapping[str, npt.NDArray[Any]]) -> float:
    """Share of the test images that ``weights`` classify correctly."""
    return evaluate(weights)[1]
