"""Quickstart task: a 64-32-10 MLP on scikit-learn's digits, split IID among clients.

Everything a run needs from user code lives here: the initial model (``make_model``), the
per-node client (``client_app``) and the server-side evaluation (``server_evaluate``). Every
process derives the same data split and the same initial weights from fixed seeds, so no data
or model file is shipped around.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import numpy.typing as npt
import torch
import torch.nn as nn
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from geofl.client.app import ClientContext
from geofl.client.partition import iid_partition
from geofl.client.torch import TorchClient, weights_of
from geofl.protocols.types import Config, Metrics, Scalar, Weights, WeightsView

__all__ = ["build_model", "client_app", "make_model", "server_evaluate"]

MODEL_SEED = 0
SPLIT_SEED = 42
TEST_FRACTION = 0.25
DEFAULT_BATCH_SIZE = 32

Arrays = tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]


def build_model() -> nn.Module:
    """The network: 64 pixels -> 32 hidden units -> 10 digits."""
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def make_model() -> Weights:
    """Initial weights, identical in every process (seeded without touching global RNG)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(MODEL_SEED)
        return weights_of(build_model())


@lru_cache(maxsize=1)
def _digits() -> tuple[Arrays, Arrays]:
    """(train, test) with pixels standardized by the training split's statistics."""
    data = load_digits()
    x = np.asarray(data.data, dtype=np.float32)
    y = np.asarray(data.target, dtype=np.int64)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    n_test = int(len(y) * TEST_FRACTION)
    test, train = order[:n_test], order[n_test:]
    mean = x[train].mean(axis=0)
    std = x[train].std(axis=0)
    std[std == 0] = 1.0  # border pixels are constant
    x = (x - mean) / std
    return (x[train], y[train]), (x[test], y[test])


def _dataset(arrays: Arrays) -> TensorDataset:
    return TensorDataset(torch.from_numpy(arrays[0]), torch.from_numpy(arrays[1]))


def _node_int(context: ClientContext, key: str, default: int) -> int:
    value = context.node_config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"node_config[{key!r}] must be an integer, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"node_config[{key!r}] must be an integer, got {value!r}") from None


class DigitsClient(TorchClient):
    """A TorchClient that re-batches its training set by the round's ``batch_size``."""

    def __init__(self, train: TensorDataset, test: TensorDataset) -> None:
        super().__init__(build_model(), [], DataLoader(test, batch_size=256))
        self.train_set = train

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        """Rebuild the loader for this round's batch size, then train as usual."""
        batch_size = config.get("batch_size", DEFAULT_BATCH_SIZE)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"config['batch_size'] must be a positive integer: {batch_size!r}")
        self.train_loader = DataLoader(self.train_set, batch_size=batch_size, shuffle=True)
        return super().fit(parameters, config)


def client_app(context: ClientContext) -> DigitsClient:
    """Client for partition ``partition-id`` of ``num-partitions`` (IID) of the train split.

    Every client evaluates on the shared held-out test split.
    """
    partition_id = _node_int(context, "partition-id", 0)
    num_partitions = _node_int(context, "num-partitions", 1)
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} is outside 0..{num_partitions - 1}")
    (x_train, y_train), test = _digits()
    part = iid_partition(len(y_train), num_partitions, SPLIT_SEED)[partition_id]
    return DigitsClient(_dataset((x_train[part], y_train[part])), _dataset(test))


def server_evaluate(weights: WeightsView) -> tuple[float, dict[str, Scalar]]:
    """Loss and accuracy of the global model on the held-out test split."""
    _, test = _digits()
    evaluator = TorchClient(build_model(), [], DataLoader(_dataset(test), batch_size=512))
    loss, _, metrics = evaluator.evaluate(dict(weights), {})
    return loss, dict(metrics)
