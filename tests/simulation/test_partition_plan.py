"""prepare_partitions: the run's split written once, read back by every client, errors early."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from geofl.client.app import ClientContext
from geofl.client.partition import (
    PARTITION_FILE_KEY,
    PartitionFileError,
    assigned_indices,
    read_partition_file,
)
from geofl.server.config import ConfigError, RunConfig, parse_config
from geofl.server.simulation.links import LinkModel
from geofl.server.simulation.partition import (
    PARTITION_FILE_NAME,
    PartitionPlan,
    prepare_partitions,
)

SOURCE = "run.yaml"
LABELS_MODULE = "geofl_test_partition_labels"
# 10 classes x 60 samples, interleaved so index order says nothing about the label.
TEN_CLASSES = np.tile(np.arange(10, dtype=np.int64), 60)
REGIONS = {
    "near": {"share": 0.5, "rtt_ms": 20, "up_mbps": 50, "down_mbps": 100},
    "far": {"share": 0.5, "rtt_ms": 200, "up_mbps": 5, "down_mbps": 10},
}


@pytest.fixture(autouse=True)
def labels_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A module the configuration can name as ``simulation.labels``."""
    module = ModuleType(LABELS_MODULE)
    module.ten_classes = lambda: TEN_CLASSES.copy()  # type: ignore[attr-defined]
    module.two_d = lambda: TEN_CLASSES.reshape(60, 10)  # type: ignore[attr-defined]
    module.empty = lambda: np.zeros(0, dtype=np.int64)  # type: ignore[attr-defined]
    module.floats = lambda: TEN_CLASSES.astype(np.float32)  # type: ignore[attr-defined]
    module.negative = lambda: TEN_CLASSES - 1  # type: ignore[attr-defined]
    module.not_callable = 3  # type: ignore[attr-defined]

    def failing() -> np.ndarray:
        raise FileNotFoundError("no data here; install the data set")

    module.failing = failing  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, LABELS_MODULE, module)
    return module


def _config(
    partition: Any, clients: int = 6, labels: str | None = "ten_classes", **sim: Any
) -> RunConfig:
    simulation: dict[str, Any] = {"clients": clients, "partition": partition, **sim}
    if labels is not None:
        simulation["labels"] = f"{LABELS_MODULE}:{labels}"
    return parse_config(
        {"run": {"name": "plan", "seed": 11}, "model": "m:f", "simulation": simulation}, SOURCE
    )


def _context(plan: PartitionPlan, client: int, **extra: Any) -> ClientContext:
    node = {**plan.node_config, "partition-id": client, "num-partitions": plan.num_clients}
    return ClientContext(node_id=client, node_name=f"c{client}", node_config={**node, **extra})


def _shares(plan: PartitionPlan) -> list[np.ndarray]:
    shares = [assigned_indices(_context(plan, c)) for c in range(plan.num_clients)]
    assert all(share is not None for share in shares)
    return shares  # type: ignore[return-value]


def _config_error(config: RunConfig, tmp_path: Path, regions: Any = None) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        prepare_partitions(config, SOURCE, tmp_path, regions)
    assert not (tmp_path / PARTITION_FILE_NAME).exists(), "nothing may be written on error"
    return caught.value


def test_no_partition_setting_means_no_plan(tmp_path: Path) -> None:
    config = parse_config({"run": {"name": "x"}, "model": "m:f"})
    assert prepare_partitions(config, SOURCE, tmp_path, None) is None
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "partition", ["iid", {"dirichlet": {"alpha": 0.5}}, {"shards": {"per_client": 2}}]
)
def test_every_client_reads_back_exactly_its_disjoint_covering_share(
    tmp_path: Path, partition: Any
) -> None:
    plan = prepare_partitions(_config(partition), SOURCE, tmp_path / "run", None)
    assert plan is not None and plan.num_clients == 6
    assert plan.path == tmp_path / "run" / PARTITION_FILE_NAME
    assert plan.node_config == {PARTITION_FILE_KEY: str(plan.path)}
    shares = _shares(plan)
    assert all(share.dtype == np.int64 and share.size > 0 for share in shares)
    joined = np.concatenate(shares)
    np.testing.assert_array_equal(np.sort(joined), np.arange(TEN_CLASSES.size))
    # Seeded by run.seed: a second preparation writes the same split.
    again = prepare_partitions(_config(partition), SOURCE, tmp_path / "again", None)
    assert again is not None
    for mine, theirs in zip(shares, _shares(again), strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_the_seed_changes_the_split(tmp_path: Path) -> None:
    base = _config({"dirichlet": {"alpha": 0.5}})
    other = base.model_copy(update={"run": base.run.model_copy(update={"seed": 12})})
    first = prepare_partitions(base, SOURCE, tmp_path / "a", None)
    second = prepare_partitions(other, SOURCE, tmp_path / "b", None)
    assert first is not None and second is not None
    pairs = zip(_shares(first), _shares(second), strict=True)
    assert any(not np.array_equal(a, b) for a, b in pairs)


def test_the_histogram_counts_each_clients_labels(tmp_path: Path) -> None:
    plan = prepare_partitions(
        _config({"shards": {"per_client": 1}}, clients=10), SOURCE, tmp_path, None
    )
    assert plan is not None
    console = Console(width=200, record=True)
    console.print(plan.histogram)
    text = console.export_text()
    assert "shards(per_client=1)" in text and "10 clients" in text
    # One shard each of label-sorted data: every client holds exactly one label.
    assert "mean top-label share 1.00" in text
    for share in _shares(plan):
        assert np.unique(TEN_CLASSES[share]).size == 1


def test_by_region_follows_the_link_models_regions(tmp_path: Path) -> None:
    config = _config({"by_region": {"alpha": 0.1}}, clients=8, regions=REGIONS)
    regions = LinkModel.from_config(config.simulation, config.run.seed).client_regions
    assert set(regions) == {"near", "far"}
    plan = prepare_partitions(config, SOURCE, tmp_path, regions)
    assert plan is not None
    shares = _shares(plan)
    np.testing.assert_array_equal(np.sort(np.concatenate(shares)), np.arange(TEN_CLASSES.size))
    mixes = {
        name: np.bincount(
            TEN_CLASSES[
                np.concatenate([s for s, r in zip(shares, regions, strict=True) if r == name])
            ],
            minlength=10,
        )
        for name in ("near", "far")
    }
    # alpha=0.1: each region's label mix is skewed away from the other's.
    assert not np.array_equal(mixes["near"], mixes["far"])
    assert max(np.abs(mixes["near"] / mixes["near"].sum() - 0.1)) > 0.05


def test_by_region_without_the_client_regions_is_a_config_error(tmp_path: Path) -> None:
    config = _config({"by_region": {"alpha": 0.5}}, regions=REGIONS)
    error = _config_error(config, tmp_path, regions=None)
    assert error.problems[0].path == "simulation.partition"
    assert "region of each of the 6 clients" in str(error)


def test_a_client_left_without_data_stops_the_run_naming_the_fix(tmp_path: Path) -> None:
    # 600 samples cannot fill 200 clients x 4 shards: some client would get nothing.
    error = _config_error(_config({"shards": {"per_client": 4}}, clients=200), tmp_path)
    (problem,) = error.problems
    assert (problem.source, problem.path) == (SOURCE, "simulation.partition")
    assert (
        "no data" in problem.message and "lower per_client or use fewer clients" in problem.message
    )


def test_more_clients_than_samples_is_a_config_error(tmp_path: Path) -> None:
    error = _config_error(_config("iid", clients=601), tmp_path)
    assert error.problems[0].path == "simulation.partition"
    assert "use fewer clients or more data" in str(error)


def test_a_hopeless_dirichlet_split_names_alpha(tmp_path: Path) -> None:
    error = _config_error(_config({"dirichlet": {"alpha": 0.001}}, clients=300), tmp_path)
    (problem,) = error.problems
    assert problem.path == "simulation.partition"
    assert "in simulation.partition: raise alpha, use fewer clients" in problem.message


def test_missing_labels_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    error = _config_error(_config("iid", labels=None), tmp_path)
    (problem,) = error.problems
    assert problem.path == "simulation.labels"
    assert "set simulation.labels" in problem.message


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ("no_such_function", "has no attribute 'no_such_function'"),
        ("not_callable", "is not callable"),
        ("failing", "FileNotFoundError: no data here; install the data set"),
        ("two_d", "one-dimensional array of labels, got shape 60x10"),
        ("empty", "non-empty one-dimensional array of labels, got shape 0"),
        ("floats", "integer class indices, got dtype float32"),
        ("negative", "non-negative class indices, got -1"),
    ],
)
def test_unusable_labels_are_config_errors(tmp_path: Path, labels: str, message: str) -> None:
    error = _config_error(_config("iid", labels=labels), tmp_path)
    (problem,) = error.problems
    assert problem.path == "simulation.labels"
    assert message in problem.message


def test_an_unimportable_labels_module_is_a_config_error(tmp_path: Path) -> None:
    config = _config("iid")
    sim = config.simulation.model_copy(update={"labels": "geofl_no_such_module:labels"})
    error = _config_error(config.model_copy(update={"simulation": sim}), tmp_path)
    assert error.problems[0].path == "simulation.labels"
    assert "cannot import module 'geofl_no_such_module'" in str(error)


def test_rewriting_the_file_is_seen_by_readers_in_the_same_process(tmp_path: Path) -> None:
    first = prepare_partitions(_config("iid", clients=3), SOURCE, tmp_path, None)
    assert first is not None and read_partition_file(first.path).num_clients == 3
    second = prepare_partitions(_config("iid", clients=5), SOURCE, tmp_path, None)
    assert second is not None and second.path == first.path
    assert read_partition_file(second.path).num_clients == 5
    assert len(_shares(second)) == 5


def test_a_client_of_another_run_is_refused(tmp_path: Path) -> None:
    plan = prepare_partitions(_config("iid"), SOURCE, tmp_path, None)
    assert plan is not None
    with pytest.raises(PartitionFileError, match=r"among 6 clients but .* num-partitions=4"):
        assigned_indices(_context(plan, 0, **{"num-partitions": 4}))


# The Fashion-MNIST example, split by the simulator: its clients train on their shares.

ROOT = Path(__file__).resolve().parents[2]
FMNIST_REQUIRED = os.environ.get("GEOFL_REQUIRE_FMNIST") == "1"


def _fmnist_task() -> ModuleType:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT))
        data = importlib.import_module("examples.fashion_mnist.data")
        if not FMNIST_REQUIRED and not (data.data_dir() / "train-labels-idx1-ubyte.gz").is_file():
            pytest.skip("Fashion-MNIST files absent: apt-get install dataset-fashion-mnist")
        return importlib.import_module("examples.fashion_mnist.task")


def _fmnist_plan(tmp_path: Path, partition: Any, clients: int) -> PartitionPlan:
    config = parse_config(
        {
            "run": {"name": "fmnist", "seed": 7},
            "model": "examples.fashion_mnist.task:make_mlp_model",
            "simulation": {
                "clients": clients,
                "partition": partition,
                "labels": "examples.fashion_mnist.task:train_labels",
            },
        },
        SOURCE,
    )
    plan = prepare_partitions(config, SOURCE, tmp_path, None)
    assert plan is not None
    return plan


@pytest.mark.fmnist
def test_fmnist_clients_train_on_the_simulators_share(tmp_path: Path) -> None:
    task = _fmnist_task()
    plan = _fmnist_plan(tmp_path, {"dirichlet": {"alpha": 0.5}}, clients=100)
    share = read_partition_file(plan.path).share(3)
    cnn = task.client_app(_context(plan, 3))
    np.testing.assert_array_equal(cnn.train_set.tensors[1].numpy(), task.train_labels()[share])
    task._flat_tensors.cache_clear()
    mlps = [task.mlp_client_app(_context(plan, client)) for client in range(100)]
    # The test split is normalized once for all clients, not once per client.
    assert task._flat_tensors.cache_info()[:2] == (99, 1)
    np.testing.assert_array_equal(mlps[3].train_indices.numpy(), share)
    sizes = sum(client.train_indices.numel() for client in mlps)
    assert sizes == len(task.train_labels())


@pytest.mark.fmnist
def test_the_mlp_client_learns_its_share_and_reports_fixed_work(tmp_path: Path) -> None:
    task = _fmnist_task()
    plan = _fmnist_plan(tmp_path, "iid", clients=200)  # 300 training images each
    client = task.mlp_client_app(_context(plan, 5))
    own = client.train_indices
    assert own.numel() == 300
    x, y = task._flat_tensors("train")
    judge = task.TorchClient(task.build_mlp(), [], [(x[own], y[own])])
    weights = task.make_mlp_model()
    before, _, _ = judge.evaluate(weights, {})
    for server_round in range(1, 16):
        config = {"lr": 0.05, "local_steps": 4, "batch_size": 8, "server_round": server_round}
        new, num_examples, metrics = client.fit(weights, config)
        assert (num_examples, metrics["samples_trained"]) == (300, 32)
        weights = dict(new)
    after, _, _ = judge.evaluate(weights, {})
    assert after < 0.5 * before, (before, after)
    loss, n_eval, eval_metrics = client.evaluate(weights, {})
    assert n_eval == 50 and loss > 0 and 0 <= float(eval_metrics["accuracy"]) <= 1


@pytest.mark.fmnist
def test_the_mlp_client_draws_new_batches_each_round_and_checks_its_config(
    tmp_path: Path,
) -> None:
    task = _fmnist_task()
    plan = _fmnist_plan(tmp_path, "iid", clients=200)
    start = task.make_mlp_model()
    first = task.mlp_client_app(_context(plan, 0)).fit(start, {"server_round": 1})
    rebuilt = task.mlp_client_app(_context(plan, 0)).fit(start, {"server_round": 1})
    later = task.mlp_client_app(_context(plan, 0)).fit(start, {"server_round": 2})
    assert first[2]["samples_trained"] == 5 * 16  # the defaults
    np.testing.assert_array_equal(first[0]["1.weight"], rebuilt[0]["1.weight"])
    assert not np.array_equal(first[0]["1.weight"], later[0]["1.weight"])
    with pytest.raises(ValueError, match="local_steps'] must be a positive integer"):
        task.mlp_client_app(_context(plan, 0)).fit(start, {"local_steps": 0})
