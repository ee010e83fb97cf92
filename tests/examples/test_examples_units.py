"""Unit checks of the example tasks: seeded models, client factories, the IDX reader.

The examples are imported as ``examples.*`` from the repository root, as ``geofl`` does
from the working directory; the root goes on ``sys.path`` only while they are imported.
"""

from __future__ import annotations

import gzip
import importlib
import os
import struct
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from geofl.client.app import Client, ClientContext
from geofl.protocols.types import Config, Scalar

ROOT = Path(__file__).resolve().parents[2]
FMNIST_REQUIRED = os.environ.get("GEOFL_REQUIRE_FMNIST") == "1"


def _import(name: str) -> ModuleType:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT))
        return importlib.import_module(name)


quickstart = _import("examples.quickstart.task")
fmnist_data = _import("examples.fashion_mnist.data")
fmnist_task = _import("examples.fashion_mnist.task")


def _fmnist_present() -> bool:
    return all(
        (fmnist_data.data_dir() / name).is_file()
        for pair in fmnist_data._FILES.values()
        for name in pair
    )


needs_fmnist = pytest.mark.skipif(
    not FMNIST_REQUIRED and not _fmnist_present(),
    reason="Fashion-MNIST files absent: apt-get install dataset-fashion-mnist "
    "(set GEOFL_REQUIRE_FMNIST=1 to make this a failure)",
)


def _context(partition: int, partitions: int, **extra: int | float) -> ClientContext:
    node: dict[str, Scalar] = {"partition-id": partition, "num-partitions": partitions, **extra}
    return ClientContext(node_id=partition, node_name=f"client-{partition}", node_config=node)


@pytest.mark.parametrize("task", [quickstart, fmnist_task], ids=["quickstart", "fmnist"])
def test_make_model_is_deterministic_and_leaves_global_rng_alone(task: ModuleType) -> None:
    state = torch.get_rng_state()
    first, second = task.make_model(), task.make_model()
    assert torch.equal(state, torch.get_rng_state())
    assert list(first) == list(task.build_model().state_dict())
    for name in first:
        assert first[name].dtype == np.float32
        np.testing.assert_array_equal(first[name], second[name])


def test_quickstart_model_shape() -> None:
    shapes = {k: v.shape for k, v in quickstart.make_model().items()}
    assert shapes == {"0.weight": (32, 64), "0.bias": (32,), "2.weight": (10, 32), "2.bias": (10,)}


def test_quickstart_partitions_cover_the_training_split() -> None:
    sizes = [len(quickstart.client_app(_context(i, 4)).train_set) for i in range(4)]
    (x_train, _), (x_test, _) = quickstart._digits()
    assert sum(sizes) == len(x_train) and max(sizes) - min(sizes) <= 1
    assert len(x_train) + len(x_test) == 1797


def test_quickstart_client_trains_and_evaluates() -> None:
    client = quickstart.client_app(_context(0, 4))
    assert isinstance(client, quickstart.DigitsClient)
    assert issubclass(quickstart.DigitsClient, Client)
    start = quickstart.make_model()
    config: Config = {"local_epochs": 1, "lr": 0.05, "batch_size": 32, "seed": 1}
    new, num_examples, metrics = client.fit(start, config)
    assert num_examples == len(client.train_set)
    assert {k: v.shape for k, v in new.items()} == {k: v.shape for k, v in start.items()}
    assert not np.array_equal(new["0.weight"], start["0.weight"])
    assert "train_loss" in metrics
    loss, n_eval, eval_metrics = client.evaluate(dict(new), {})
    assert n_eval == len(quickstart._digits()[1][1]) and loss > 0
    assert 0.0 <= float(eval_metrics["accuracy"]) <= 1.0


def test_quickstart_server_evaluate_improves_after_training() -> None:
    start = quickstart.make_model()
    loss0, metrics0 = quickstart.server_evaluate(start)
    client = quickstart.client_app(_context(0, 1))
    trained, _, _ = client.fit(start, {"local_epochs": 3, "lr": 0.05, "seed": 0})
    loss1, metrics1 = quickstart.server_evaluate(trained)
    assert loss1 < loss0
    assert float(metrics1["accuracy"]) > 0.8 > float(metrics0["accuracy"])


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"partition-id": 4, "num-partitions": 4}, "outside 0..3"),
        ({"partition-id": "x", "num-partitions": 4}, "must be an integer"),
    ],
)
def test_quickstart_rejects_bad_node_config(node: dict[str, object], message: str) -> None:
    context = ClientContext(node_id=0, node_name="c", node_config=node)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        quickstart.client_app(context)


def test_quickstart_rejects_bad_batch_size() -> None:
    client = quickstart.client_app(_context(0, 4))
    with pytest.raises(ValueError, match="batch_size"):
        client.fit(quickstart.make_model(), {"batch_size": 0})


def _write_idx(path: Path, array: np.ndarray, type_code: int = 0x08) -> None:
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


def test_read_idx_round_trip(tmp_path: Path) -> None:
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "a.gz", array)
    np.testing.assert_array_equal(fmnist_data.read_idx(tmp_path / "a.gz"), array)


def test_read_idx_rejects_bad_files(tmp_path: Path) -> None:
    _write_idx(tmp_path / "float.gz", np.zeros(3), type_code=0x0D)
    with pytest.raises(ValueError, match="not an unsigned-byte IDX"):
        fmnist_data.read_idx(tmp_path / "float.gz")
    header = bytes([0, 0, 8, 1]) + struct.pack(">I", 10)
    (tmp_path / "short.gz").write_bytes(gzip.compress(header + b"\x00" * 4))
    with pytest.raises(ValueError, match=r"shape \(10,\) \(10 bytes\), found 4"):
        fmnist_data.read_idx(tmp_path / "short.gz")


def test_missing_files_name_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fmnist_data.ENV_DIR, str(tmp_path))
    with pytest.raises(fmnist_data.FashionMNISTMissingError, match="dataset-fashion-mnist"):
        fmnist_data.load_split("train")


@pytest.mark.fmnist
@needs_fmnist
def test_fmnist_splits_have_the_published_shapes() -> None:
    for split, size in (("train", 60000), ("test", 10000)):
        images, labels = fmnist_data.load_split(split)
        assert images.shape == (size, 28, 28) and images.dtype == np.uint8
        assert labels.shape == (size,) and labels.dtype == np.int64
        np.testing.assert_array_equal(np.bincount(labels), np.full(10, size // 10))


@pytest.mark.fmnist
@needs_fmnist
def test_fmnist_client_is_label_skewed_and_trains() -> None:
    client = fmnist_task.client_app(_context(0, 10, **{"dirichlet-alpha": 0.1}))
    labels = client.train_set.tensors[1].numpy()
    shares = np.bincount(labels, minlength=10) / labels.size
    assert shares.max() > 0.3  # alpha=0.1: one class dominates (uniform would be 0.1)
    assert client.train_set.tensors[0].shape[1:] == (1, 28, 28)
    start = fmnist_task.make_model()
    new, num_examples, _ = client.fit(start, {"local_steps": 2, "batch_size": 8, "seed": 0})
    assert num_examples == 16
    assert not np.array_equal(new["0.weight"], start["0.weight"])
    loss, n_eval, metrics = client.evaluate(dict(new), {})
    assert n_eval == 1000 and loss > 0 and "accuracy" in metrics
