"""Fashion-MNIST task: a small CNN trained by label-skewed clients, and an MLP for scale.

The 60,000 training images are split among ``num-partitions`` clients with a Dirichlet
label prior (alpha 0.5: each client sees a few classes often and the rest rarely), the
realistic hard case for FedAvg. The simulator makes that split itself when
``simulation.partition`` is set (``train_labels`` gives it the labels) and each client
reads its share with :func:`~geofl.client.partition.assigned_indices`; otherwise every
client computes the same seeded split from ``dirichlet-alpha``. The server evaluates the
global model on the 10,000 test images. The CNN is small on purpose: a simulation runs ten
clients on two CPU cores.

:func:`mlp_client_app` is the variant for simulations of thousands of clients: a
784-64-10 MLP trained for a fixed number of small SGD steps, built in about a millisecond
from data tensors each process normalizes once.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

import numpy as np
import numpy.typing as npt
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from examples.fashion_mnist.data import load_split
from geofl.client.app import ClientContext
from geofl.client.partition import IndexArray, assigned_indices, dirichlet_partition, iid_partition
from geofl.client.torch import TorchClient, weights_of
from geofl.protocols.types import Config, Metrics, Scalar, Weights, WeightsView

__all__ = [
    "FashionClient",
    "MLPClient",
    "build_mlp",
    "build_model",
    "client_app",
    "make_mlp_model",
    "make_model",
    "mlp_client_app",
    "mlp_server_evaluate",
    "server_evaluate",
    "to_dataset",
    "train_labels",
]

MODEL_SEED = 0
SPLIT_SEED = 2024
#: Seeds the MLP's initial weights and, with the client and round, its batch draws.
MLP_SEED = 1
DEFAULT_ALPHA = 0.5
DEFAULT_BATCH_SIZE = 32
DEFAULT_MLP_STEPS = 5
DEFAULT_MLP_BATCH_SIZE = 16
PIXELS = 28 * 28
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


def train_labels() -> npt.NDArray[np.int64]:
    """The 60,000 training labels, for ``simulation.labels`` (the simulator splits them)."""
    return _train_split()[1].copy()


@lru_cache(maxsize=4)
def _dirichlet_split(num_partitions: int, alpha: float) -> list[IndexArray]:
    # Every client of a process computes the same split: do it once.
    return dirichlet_partition(_train_split()[1], num_partitions, alpha, SPLIT_SEED)


@lru_cache(maxsize=4)
def _test_shares(num_partitions: int) -> list[IndexArray]:
    return iid_partition(len(_test_set()), num_partitions, SPLIT_SEED)


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


def _partition(context: ClientContext) -> tuple[int, int]:
    """``partition-id`` and ``num-partitions``, checked against each other."""
    partition_id = _as_int("partition-id", _setting(context, "partition-id", 0))
    num_partitions = _as_int("num-partitions", _setting(context, "num-partitions", 1))
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} is outside 0..{num_partitions - 1}")
    return partition_id, num_partitions


def _limit_threads(context: ClientContext) -> None:
    if "torch-threads" in context.node_config:
        torch.set_num_threads(_as_int("torch-threads", context.node_config["torch-threads"]))


def _train_indices(context: ClientContext) -> IndexArray:
    """The simulator's share for this client if it split the data, else the seeded split."""
    partition_id, num_partitions = _partition(context)
    assigned = assigned_indices(context)
    if assigned is None:
        alpha = _as_float("dirichlet-alpha", _setting(context, "dirichlet-alpha", DEFAULT_ALPHA))
        return _dirichlet_split(num_partitions, alpha)[partition_id]
    available = len(_train_split()[1])
    if assigned.size and int(assigned.max()) >= available:
        raise ValueError(
            f"the partition file gives client {partition_id} sample {int(assigned.max())}, "
            f"but the training split has {available}; simulation.labels must list the "
            "training labels (examples.fashion_mnist.task:train_labels)"
        )
    return assigned


def _test_share(context: ClientContext) -> IndexArray:
    partition_id, num_partitions = _partition(context)
    return _test_shares(num_partitions)[partition_id]


def client_app(context: ClientContext) -> FashionClient:
    """CNN client for partition ``partition-id`` of ``num-partitions`` of the training split.

    Its training images are the simulator's share for it (node config ``partition-file``)
    when the simulator split the data; otherwise every client computes the same seeded
    Dirichlet split, with ``dirichlet-alpha`` (node or run config, default 0.5) setting
    the label skew. ``torch-threads``, if given, caps torch's threads (many clients share
    few cores in a simulation); ``max-train-samples``, if given, keeps a seeded random
    subset of at most that many of the partition's images (same label skew, less work:
    for quick tests). The client evaluates on its IID share of the test split.
    """
    _limit_threads(context)
    part = _subsample(_train_indices(context), _max_samples(context))
    images, labels = _train_split()
    test = _test_set()
    local_test = TensorDataset(*(tensor[_test_share(context)] for tensor in test.tensors))
    return FashionClient(to_dataset(images[part], labels[part]), local_test)


def server_evaluate(weights: WeightsView) -> tuple[float, dict[str, Scalar]]:
    """Loss and accuracy of the global model on the 10,000 test images."""
    evaluator = TorchClient(build_model(), [], DataLoader(_test_set(), batch_size=1000))
    loss, _, metrics = evaluator.evaluate(dict(weights), {})
    return loss, dict(metrics)


def build_mlp() -> nn.Module:
    """784-64-10 perceptron over flattened images: cheap enough for thousands of clients."""
    return nn.Sequential(nn.Flatten(), nn.Linear(PIXELS, 64), nn.ReLU(), nn.Linear(64, 10))


def make_mlp_model() -> Weights:
    """Initial MLP weights, identical in every process (seeded without touching global RNG)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(MLP_SEED)
        return weights_of(build_mlp())


@lru_cache(maxsize=2)
def _flat_tensors(split: Literal["train", "test"]) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalized ``(N, 784)`` float32 images and labels, built once per process."""
    images, labels = _train_split() if split == "train" else load_split("test")
    flat = (images.reshape(len(images), PIXELS).astype(np.float32) / 255.0 - PIXEL_MEAN) / PIXEL_STD
    return torch.from_numpy(flat), torch.from_numpy(labels)


def _round_count(config: Config, key: str, default: int) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"config[{key!r}] must be a positive integer, got {value!r}")
    return value


class MLPClient(TorchClient):
    """Fixed work per round: ``local_steps`` SGD steps on ``batch_size`` samples each.

    Batches are drawn with replacement from the client's training indices, so a client
    with six images trains as long as one with six thousand, and the compute model of a
    virtual-clock simulation charges every client the same ``samples_trained``. The draw
    is seeded by the client and ``server_round``, so a client rebuilt from scratch (evicted
    from a worker's cache) still sees new batches each round. ``num_examples`` is the
    size of the client's share, FedAvg's weight (McMahan et al., 2017).
    """

    def __init__(self, partition_id: int, train: IndexArray, test: IndexArray) -> None:
        if train.size == 0 or test.size == 0:
            raise ValueError(
                f"client {partition_id} has {train.size} training and {test.size} test "
                "images; both must be non-empty"
            )
        test_x, test_y = _flat_tensors("test")
        picked = torch.from_numpy(test)
        super().__init__(build_mlp(), [], [(test_x[picked], test_y[picked])])
        self.partition_id = partition_id
        self.train_indices = torch.from_numpy(train)

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        """Train ``local_steps`` (default 5) batches of ``batch_size`` (default 16)."""
        steps = _round_count(config, "local_steps", DEFAULT_MLP_STEPS)
        batch_size = _round_count(config, "batch_size", DEFAULT_MLP_BATCH_SIZE)
        server_round = _round_count(config, "server_round", 1)
        rng = np.random.default_rng([MLP_SEED, self.partition_id, server_round])
        draws = rng.integers(0, self.train_indices.numel(), size=(steps, batch_size))
        picks = self.train_indices[torch.from_numpy(draws)]
        x, y = _flat_tensors("train")
        self.train_loader = [(x[batch], y[batch]) for batch in picks]
        weights, trained, metrics = super().fit(parameters, {**config, "local_steps": steps})
        return weights, self.train_indices.numel(), {**metrics, "samples_trained": trained}


def mlp_client_app(context: ClientContext) -> MLPClient:
    """MLP client for partition ``partition-id``: its training share and its test share.

    The training share is the simulator's (``partition-file``) or, without one, the seeded
    Dirichlet split (``dirichlet-alpha``), as for :func:`client_app`; ``max-train-samples``
    and ``torch-threads`` work as there. The client evaluates on its IID share of the
    10,000 test images (one image each at 10,000 clients).
    """
    _limit_threads(context)
    partition_id, _ = _partition(context)
    train = _subsample(_train_indices(context), _max_samples(context))
    return MLPClient(partition_id, train, _test_share(context))


def mlp_server_evaluate(weights: WeightsView) -> tuple[float, dict[str, Scalar]]:
    """Loss and accuracy of the global MLP on the 10,000 test images."""
    x, y = _flat_tensors("test")
    evaluator = TorchClient(build_mlp(), [], [(x, y)])
    loss, _, metrics = evaluator.evaluate(dict(weights), {})
    return loss, dict(metrics)
