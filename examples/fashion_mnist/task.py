"""Fashion-MNIST task: a small CNN trained by label-skewed clients.

The 60,000 training images are split among ``num-partitions`` clients with a Dirichlet
label prior (``dirichlet-alpha``, default 0.5: each client sees a few classes often and the
rest rarely), the realistic hard case for FedAvg. The server evaluates the global model on
the 10,000 test images. The network is small on purpose: a simulation runs ten clients on
two CPU cores.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import numpy.typing as npt
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from examples.fashion_mnist.data import load_split
from geofl.client.app import ClientContext
from geofl.client.partition import dirichlet_partition, iid_partition
from geofl.client.torch import TorchClient, weights_of
from geofl.protocols.types import Config, Metrics, Scalar, Weights, WeightsView

__all__ = ["build_model", "client_app", "make_model", "server_evaluate", "to_dataset"]

MODEL_SEED = 0
SPLIT_SEED = 2024
DEFAULT_ALPHA = 0.5
DEFAULT_BATCH_SIZE = 32
# Pixel mean and standard deviation of the training split (on a 0-1 scale).
PIXEL_MEAN = 0.2860
PIXEL_STD = 0.3530


def build_model() -> nn.Module:
    """Two 5x5 conv layers (16, 32 channels) with max-pooling, then 64 hidden units."""
    return nn.Sequential(
        nn.Conv2d(1, 16, kernel_size=5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, kernel_size=5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def make_model() -> Weights:
    """Initial weights, identical in every process (seeded without touching global RNG)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(MODEL_SEED)
        return weights_of(build_model())


def to_dataset(images: npt.NDArray[np.uint8], labels: npt.NDArray[np.int64]) -> TensorDataset:
    """Normalized ``(N, 1, 28, 28)`` float32 images with their labels."""
    x = (images.astype(np.float32) / 255.0 - PIXEL_MEAN) / PIXEL_STD
    return TensorDataset(torch.from_numpy(x[:, None]), torch.from_numpy(labels))


@lru_cache(maxsize=1)
def _train_split() -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    return load_split("train")


@lru_cache(maxsize=1)
def _test_set() -> TensorDataset:
    return to_dataset(*load_split("test"))


def _setting(context: ClientContext, key: str, default: Scalar) -> Scalar:
    """A per-node setting, falling back to the run's, then to ``default``."""
    return context.node_config.get(key, context.run_config.get(key, default))


def _as_int(key: str, value: Scalar) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{key} must be an integer, got {value!r}") from None


def _as_float(key: str, value: Scalar) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{key} must be a number, got {value!r}")
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{key} must be a number, got {value!r}") from None


def _max_samples(context: ClientContext) -> int | None:
    """``max-train-samples`` from node or run config; None when unset or 0 (keep all)."""
    value = _setting(context, "max-train-samples", 0)
    limit = _as_int("max-train-samples", value)
    if limit < 0:
        raise ValueError(f"max-train-samples must be >= 0 (0 keeps all), got {limit}")
    return limit or None


def _subsample(indices: npt.NDArray[np.int64], limit: int | None) -> npt.NDArray[np.int64]:
    """At most ``limit`` of ``indices``, chosen uniformly so the label mix is kept."""
    if limit is None or indices.size <= limit:
        return indices
    rng = np.random.default_rng(SPLIT_SEED)
    return np.sort(rng.choice(indices, size=limit, replace=False))


class FashionClient(TorchClient):
    """A TorchClient that re-batches its training set by the round's ``batch_size``."""

    def __init__(self, train: TensorDataset, test: TensorDataset) -> None:
        super().__init__(build_model(), [], DataLoader(test, batch_size=500))
        self.train_set = train

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        """Rebuild the loader for this round's batch size, then train as usual."""
        batch_size = config.get("batch_size", DEFAULT_BATCH_SIZE)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"config['batch_size'] must be a positive integer: {batch_size!r}")
        self.train_loader = DataLoader(self.train_set, batch_size=batch_size, shuffle=True)
        return super().fit(parameters, config)


def client_app(context: ClientContext) -> FashionClient:
    """Client for partition ``partition-id`` of ``num-partitions`` of the training split.

    ``dirichlet-alpha`` (node or run config, default 0.5) sets the label skew;
    ``torch-threads``, if given, caps torch's threads (many clients share few cores in a
    simulation); ``max-train-samples``, if given, keeps a seeded random subset of at most
    that many of the partition's images (same label skew, less work: for quick tests).
    The client evaluates on its IID share of the test split.
    """
    partition_id = _as_int("partition-id", _setting(context, "partition-id", 0))
    num_partitions = _as_int("num-partitions", _setting(context, "num-partitions", 1))
    alpha = _as_float("dirichlet-alpha", _setting(context, "dirichlet-alpha", DEFAULT_ALPHA))
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} is outside 0..{num_partitions - 1}")
    if "torch-threads" in context.node_config:
        torch.set_num_threads(_as_int("torch-threads", context.node_config["torch-threads"]))
    images, labels = _train_split()
    part = dirichlet_partition(labels, num_partitions, alpha, SPLIT_SEED)[partition_id]
    part = _subsample(part, _max_samples(context))
    test = _test_set()
    test_part = iid_partition(len(test), num_partitions, SPLIT_SEED)[partition_id]
    local_test = TensorDataset(*(tensor[test_part] for tensor in test.tensors))
    return FashionClient(to_dataset(images[part], labels[part]), local_test)


def server_evaluate(weights: WeightsView) -> tuple[float, dict[str, Scalar]]:
    """Loss and accuracy of the global model on the 10,000 test images."""
    evaluator = TorchClient(build_model(), [], DataLoader(_test_set(), batch_size=1000))
    loss, _, metrics = evaluator.evaluate(dict(weights), {})
    return loss, dict(metrics)
