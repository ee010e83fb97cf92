"""Tests of the privacy benchmark (issue 15): its run files, its summary, one small run."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

_ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    """Import a package folder by path (without putting its parent on sys.path)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, path / "__init__.py", submodule_search_locations=[str(path)]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot locate {name} at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


for _package in ("benchmarks", "examples"):
    if importlib.util.find_spec(_package) is None:
        _load(_package, _ROOT / _package)

from benchmarks.privacy import main, run_config, summarize  # noqa: E402
from examples.fashion_mnist.data import data_dir  # noqa: E402


def _args(**overrides: object) -> argparse.Namespace:
    values: dict[str, object] = {
        "rounds": 2,
        "clients": 20,
        "per_round": 10,
        "delta": 1e-5,
        "clip": 0.5,
        "lr": 0.1,
        "local_steps": 2,
        "server_lr": 1.0,
        "server_momentum": 0.9,
        "seed": 1,
    }
    values.update(overrides)
    return argparse.Namespace(**values)


def test_each_variant_is_the_run_it_claims(tmp_path: Path) -> None:
    args = _args()
    plain = run_config(args, "nonprivate", None, tmp_path)
    assert plain.privacy is None and not plain.secure_aggregation.enabled
    central = run_config(args, "central", 3.0, tmp_path)
    assert central.privacy is not None and central.privacy.mechanism == "central"
    assert central.privacy.sampling == "none" and not central.secure_aggregation.enabled
    distributed = run_config(args, "distributed", 3.0, tmp_path)
    assert distributed.secure_aggregation.enabled and distributed.secure_aggregation.ring_bits == 32
    assert distributed.privacy is not None and distributed.privacy.is_distributed(True)
    amplified = run_config(args, "central-amplified", 3.0, tmp_path)
    assert amplified.privacy is not None and amplified.privacy.sampling == "uniform"
    assert amplified.privacy.population == 20


def test_summary_averages_the_repeats() -> None:
    rows = [{"variant": "central", "target_epsilon": 8.0, "test_accuracy": a} for a in (0.7, 0.8)]
    [summary] = summarize(rows)
    assert summary["mean_accuracy"] == pytest.approx(0.75)
    assert (summary["min_accuracy"], summary["max_accuracy"], summary["runs"]) == (0.7, 0.8, 2)


@pytest.mark.skipif(not data_dir().exists(), reason="needs the Fashion-MNIST package")
def test_a_small_distributed_run_records_epsilon(tmp_path: Path) -> None:
    out = tmp_path / "privacy.json"
    argv = ["--rounds", "2", "--clients", "20", "--per-round", "10", "--local-steps", "2"]
    argv += ["--variants", "distributed", "--epsilons", "8", "--repeats", "1", "--out", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    [row] = report["results"]
    assert row["status"] == "completed" and row["committed_rounds"] == 2
    assert row["epsilon_per_round"][-1] == pytest.approx(8.0, rel=1e-3)
    assert 0.0 < row["test_accuracy"] <= 1.0
