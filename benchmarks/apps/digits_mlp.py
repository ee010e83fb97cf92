"""A small real training task, identical under every framework: an MLP on sklearn's digits.

Both the Flower ClientApp (``benchmarks/flower_app``) and the geofl client
(:mod:`benchmarks.apps.geofl_digits`) call :func:`train`, and both servers start from
:func:`initial_weights` and score the final model with :func:`accuracy`, so a difference
between the frameworks' numbers is the frameworks', not the task's.

The task: a 64-128-128-10 MLP (26,122 float32 parameters) on scikit-learn's bundled 8x8
digits (1,797 images, nothing downloaded), 25 % held out for testing, the rest split IID
into ``num_partitions`` parts. Each fit runs ``LOCAL_EPOCHS`` epochs of SGD (lr 0.05,
momentum 0.9, batch 32) on one part, shuffled by a generator seeded with the partition and
the server round: the same global model gives the same update under either framework.
Torch uses one thread: ten client processes share the benchmark host's cores, and the
model is too small to gain from more.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn as nn
from sklearn.datasets import load_digits

__all__ = [
    "BATCH_SIZE",
    "LEARNING_RATE",
    "LOCAL_EPOCHS",
    "MOMENTUM",
    "accuracy",
    "build_model",
    "evaluate",
    "initial_weights",
    "num_params",
    "partition_indices",
    "train",
]

LOCAL_EPOCHS = 5
LEARNING_RATE = 0.05
MOMENTUM = 0.9
BATCH_SIZE = 32
MODEL_SEED = 0
SPLIT_SEED = 42
TEST_FRACTION = 0.25

Features = npt.NDArray[np.float32]
Labels = npt.NDArray[np.int64]
Weights = dict[str, npt.NDArray[np.float32]]


def build_model() -> nn.Module:
    """The network: 64 pixels -> 128 -> 128 -> 10 digits, ReLU between."""
    return nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
    )


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
    """Parameters of the model (26,122)."""
    return sum(arr.size for arr in initial_weights().values())


@lru_cache(maxsize=1)
def _split() -> tuple[tuple[Features, Labels], tuple[Features, Labels]]:
    """(train, test), pixels standardized with the training split's statistics."""
    data = load_digits()
    x = np.asarray(data.data, dtype=np.float32)
    y = np.asarray(data.target, dtype=np.int64)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    n_test = int(len(y) * TEST_FRACTION)
    test, train_rows = order[:n_test], order[n_test:]
    mean = x[train_rows].mean(axis=0)
    std = x[train_rows].std(axis=0)
    std[std == 0] = 1.0  # border pixels are constant
    x = (x - mean) / std
    return (x[train_rows], y[train_rows]), (x[test], y[test])


def partition_indices(partition_id: int, num_partitions: int) -> npt.NDArray[np.int64]:
    """Rows of the training split that belong to one IID partition."""
    if num_partitions < 1 or not 0 <= partition_id < num_partitions:
        raise ValueError(
            f"partition-id {partition_id} is outside 0..{num_partitions - 1} "
            f"(num-partitions {num_partitions})"
        )
    n_train = len(_split()[0][1])
    order = np.random.default_rng(SPLIT_SEED).permutation(n_train)
    return np.array_split(order, num_partitions)[partition_id].astype(np.int64)


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
    torch.set_num_threads(1)
    (x_all, y_all), _ = _split()
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
    """(mean cross-entropy, accuracy) of ``weights`` on the held-out test digits."""
    torch.set_num_threads(1)
    _, (x_test, y_test) = _split()
    model = build_model()
    _load(model, weights)
    with torch.no_grad():
        logits = model(torch.from_numpy(x_test))
        loss = float(nn.functional.cross_entropy(logits, torch.from_numpy(y_test)))
    predicted = logits.argmax(dim=1).numpy()
    return loss, float(np.mean(predicted == y_test))


def accuracy(weights: Mapping[str, npt.NDArray[Any]]) -> float:
    """Share of the held-out test digits that ``weights`` classify correctly."""
    return evaluate(weights)[1]
