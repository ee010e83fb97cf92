"""Tests of the scale benchmark: its run files, timelines, memory and summary arithmetic,
the Flower adapter's fidelity to the geofl client, and one tiny real run of each system
(20 clients, 5 per round, 1 round; each a few seconds plus Ray's start-up for Flower)."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.benchmarks.conftest import import_fashion_example

import_fashion_example()
from benchmarks import scale  # noqa: E402
from benchmarks.procmon import ProcSample  # noqa: E402
from benchmarks.scale import (  # noqa: E402
    ScaleSpec,
    cpu_by_kind,
    flower_pyproject,
    flower_timeline,
    geofl_run_config,
    geofl_timeline,
    memory_at_peak,
    render_markdown,
    summarize,
)
from examples.fashion_mnist import data as fmnist_data  # noqa: E402

needs_fmnist = pytest.mark.skipif(
    os.environ.get("GEOFL_REQUIRE_FMNIST") != "1"
    and not all(
        (fmnist_data.data_dir() / name).is_file()
        for pair in fmnist_data._FILES.values()
        for name in pair
    ),
    reason="needs the Debian package dataset-fashion-mnist",
)
TINY = ScaleSpec(clients=20, per_round=5, min_clients=5, rounds=1, timeout_s=120, max_rss_gb=8)


def _ev(event: str, t: float, **fields: Any) -> dict[str, Any]:
    return {"event": event, "t": t, **fields}


# ---------------------------------------------------------------- the workload


@pytest.mark.parametrize(
    "changes",
    [
        {"min_clients": 6},  # above per_round
        {"per_round": 21},  # above the pool
        {"min_clients": 0},
        {"rounds": 0},
        {"workers": 0},
        {"lr": 0.0},
        {"max_rss_gb": -1.0},
    ],
)
def test_spec_rejects_impossible_workloads(changes: dict[str, Any]) -> None:
    settings = {"clients": 20, "per_round": 5, "min_clients": 5, **changes}
    with pytest.raises(ValueError):
        ScaleSpec(**settings)


def test_geofl_run_file_is_what_geofl_simulate_accepts(tmp_path: Path) -> None:
    from geofl.server.config import load_config
    from geofl.server.simulation.preflight import check_simulation

    partition = tmp_path / "partition.npz"
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(geofl_run_config(TINY, tmp_path, partition)))
    config = load_config(path)
    check_simulation(config, str(path))
    assert config.simulation.clock == "virtual"
    assert config.simulation.clients == 20 and config.simulation.workers == 2
    assert config.strategy.clients_per_round == 5 and config.strategy.min_clients == 5
    assert config.evaluation.every == 0
    assert config.round_config == {"local_steps": 5, "batch_size": 16, "lr": 0.05}
    assert config.simulation.node_config["partition-file"] == str(partition)


def test_flower_app_config_carries_the_same_workload(tmp_path: Path) -> None:
    text = flower_pyproject(TINY, tmp_path / "events.jsonl", tmp_path / "p.npz")
    parsed = tomllib.loads(text)["tool"]["flwr"]["app"]
    assert parsed["components"] == {
        "serverapp": "benchmarks.scale_flower:server_app",
        "clientapp": "benchmarks.scale_flower:client_app",
    }
    config = parsed["config"]
    assert (config["num-clients"], config["per-round"], config["min-clients"]) == (20, 5, 5)
    assert (config["local-steps"], config["batch-size"], config["lr"]) == (5, 16, 0.05)
    assert config["partition-file"] == str(tmp_path / "p.npz")


# ---------------------------------------------------------------- timelines


def test_geofl_timeline_splits_startup_rounds_and_result() -> None:
    events = [
        _ev("child_start", 100.5),
        _ev("fleet_ready", 103.0),
        _ev("round_end", 110.0, round=1, ok=5),
        _ev("round_end", 112.5, round=2, ok=4),
        _ev("rounds_done", 113.0),
        _ev("done", 114.0, accuracy=0.5),
    ]
    line = geofl_timeline(events, launched=100.0)
    assert line.startup_s == pytest.approx(3.0)
    assert line.round_s == pytest.approx([7.0, 2.5])
    assert line.tasks_ok == [5, 4]
    assert line.result_s == pytest.approx(13.0)
    assert line.accuracy == 0.5 and line.done


def test_flower_timeline_counts_only_rounds_that_ended() -> None:
    events = [
        _ev("main_start", 104.0),
        _ev("round_start", 105.0, round=1, nodes=5),
        _ev("round_replies", 114.0, round=1, replies=5, errors=1),
        _ev("round_start", 115.0, round=2, nodes=5),
        _ev("round_replies", 116.0, round=2, replies=5, errors=0),
        _ev("round_start", 117.5, round=3, nodes=5),
    ]
    line = flower_timeline(events, launched=100.0)
    assert line.startup_s == pytest.approx(5.0)
    assert line.round_s == pytest.approx([10.0, 2.5])  # round 3 never reached aggregation
    assert line.tasks_ok == [4, 5]
    assert line.result_s is None and not line.done
    assert line.last_event == "round_start (round 3)"


def test_timelines_of_runs_that_never_started_are_empty() -> None:
    for timeline in (geofl_timeline, flower_timeline):
        line = timeline([_ev("child_start", 1.0)], launched=0.0)
        assert line.startup_s is None and line.round_s == [] and not line.done


# ---------------------------------------------------------------- memory and summary


def test_memory_at_peak_sums_one_instant_and_breaks_it_down() -> None:
    samples = [
        ProcSample(1.0, "server", 1, "a", 100_000_000),
        ProcSample(1.0, "server", 2, "b", 50_000_000),
        ProcSample(2.0, "server", 1, "a", 90_000_000),
        ProcSample(2.0, "server", 2, "b", 80_000_000),
        ProcSample(2.0, "server", 3, "b", 10_000_000),
        ProcSample(3.0, "server", 1, "a", 160_000_000),  # the largest process, not the peak
    ]
    peak = memory_at_peak(samples, lambda s: s.kind)
    assert peak["peak_rss_total_mb"] == pytest.approx(180.0)
    assert peak["peak_rss_by_kind_mb"] == pytest.approx({"a": 90.0, "b": 90.0})
    assert peak["processes_at_peak"] == 3
    assert memory_at_peak([], lambda s: s.kind)["peak_rss_total_mb"] is None


def test_cpu_by_kind_sums_per_kind_and_keeps_unsampled_processes() -> None:
    samples = [
        ProcSample(1.0, "server", 1, "a", 1),
        ProcSample(1.0, "server", 2, "b", 1),
        ProcSample(2.0, "server", 3, "b", 1),
    ]
    totals = cpu_by_kind({1: 2.0, 2: 3.0, 3: 4.5, 9: 0.5}, samples, lambda s: s.kind)
    assert totals == {"a": 2.0, "b": 7.5, "other": 0.5}


def _case(system: str, ok: bool, steady: float | None, peak: float, **extra: Any) -> dict[str, Any]:
    return {
        "system": system,
        "ok": ok,
        "repeat": 0,
        "startup_s": 5.0,
        "round1_s": 10.0,
        "steady_round_s": steady,
        "result_s": 30.0,
        "peak_rss_total_mb": peak,
        "cpu_s_total": 60.0,
        "cpu_s_by_kind": {"server": 20.0, "workers": 40.0},
        "accuracy": 0.7 if ok else None,
        "round_s": [10.0] + ([steady] if steady else []),
        "load1_during": {"mean": 2.0, "max": 3.0},
        "error": None if ok else "memory brake",
        "stopped_at": None if ok else "after 2 of 5 rounds",
        **extra,
    }


def test_summary_medians_ratios_and_targets() -> None:
    cases = [
        _case("geofl", True, 1.0, 3000.0),
        _case("geofl", True, 3.0, 4000.0),
        _case("geofl", True, 2.0, 3500.0),
        _case("flower", True, 8.0, 9000.0),
    ]
    summary = summarize(cases)
    assert summary["systems"]["geofl"]["steady_round_s"] == 2.0
    assert summary["systems"]["geofl"]["max_peak_rss_total_mb"] == 4000.0
    assert summary["flower_over_geofl"]["steady_round_s"] == pytest.approx(4.0)
    assert summary["targets"] == {
        "geofl_completes": True,
        "speedup_at_least_3x": True,
        "geofl_under_4_gib": True,  # 4000 MB < 4 GiB = 4294.97 MB
    }
    cases[1]["peak_rss_total_mb"] = 4300.0
    assert summarize(cases)["targets"]["geofl_under_4_gib"] is False


def test_summary_of_an_incomplete_system_uses_its_finished_rounds_and_says_so() -> None:
    cases = [_case("geofl", True, 2.0, 3000.0), _case("flower", False, 5.0, 18000.0)]
    summary = summarize(cases)
    flower = summary["systems"]["flower"]
    assert flower["complete"] == 0 and flower["from_incomplete_runs"]
    assert flower["steady_round_s"] == 5.0 and flower["accuracy"] is None
    assert summary["flower_over_geofl"]["steady_round_s"] == pytest.approx(2.5)
    assert summary["targets"]["speedup_at_least_3x"] is False
    only_round_one = [_case("geofl", True, 2.0, 3000.0), _case("flower", False, None, 18000.0)]
    assert summarize(only_round_one)["flower_over_geofl"]["steady_round_s"] is None
    assert summarize(only_round_one)["targets"]["speedup_at_least_3x"] is None


def test_markdown_shows_every_system_ratio_and_failure() -> None:
    cases = [_case("geofl", True, 2.0, 3000.0), _case("flower", False, 5.0, 18000.0)]
    report = {"spec": dataclasses.asdict(TINY), "cases": cases, "summary": summarize(cases)}
    text = render_markdown(report)
    assert "| geofl | 1/1 |" in text and "| flower (incomplete runs) | 0/1 |" in text
    assert "steady_round_s 2.50" in text
    assert "after 2 of 5 rounds: memory brake" in text


# ---------------------------------------------------------------- the Flower adapter


@pytest.mark.fmnist
@needs_fmnist
# Flower's CLI dependency typer imports a click helper that click deprecates.
@pytest.mark.filterwarnings("ignore::DeprecationWarning:typer")
def test_flower_adapter_trains_exactly_like_the_geofl_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from benchmarks.flower_bridge import train_config
    from benchmarks.scale_flower import ROUND_KEYS, train
    from examples.fashion_mnist.task import make_mlp_model, mlp_client_app

    for attribute in ("_run_id", "_node_id", "_task_id"):  # as in a Flower process
        if getattr(TaskIdentity, attribute) is None:
            monkeypatch.setattr(TaskIdentity, attribute, 1)
    partition = scale.write_partition(TINY, tmp_path)
    run_config = {"local-steps": 3, "batch-size": 8, "lr": 0.1, "partition-file": str(partition)}
    context = Context(
        run_id=1,
        node_id=77,
        node_config={"partition-id": 4, "num-partitions": 20},
        state=RecordDict(),
        run_config=run_config,  # type: ignore[arg-type]
    )
    initial = make_mlp_model()
    sent = train_config(run_config, ROUND_KEYS)
    sent["server-round"] = 2
    content = RecordDict(
        {"arrays": ArrayRecord({k: Array(v) for k, v in initial.items()}), "config": sent}
    )
    reply = train(Message(content=content, dst_node_id=77, message_type="train"), context)

    geofl_client = mlp_client_app(scale_flower_context(partition))
    expected, examples, _ = geofl_client.fit(
        dict(initial), {"local_steps": 3, "batch_size": 8, "lr": 0.1, "server_round": 2}
    )
    got = {k: a.numpy() for k, a in reply.content.array_records["arrays"].items()}
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value)
    assert reply.content.metric_records["metrics"]["num-examples"] == examples == 3000
    assert reply.content.metric_records["metrics"]["samples_trained"] == 24
    assert isinstance(sent, ConfigRecord)


def scale_flower_context(partition: Path) -> Any:
    from geofl.client.app import ClientContext

    node_config = {
        "partition-id": 4,
        "num-partitions": 20,
        "partition-file": str(partition),
        "torch-threads": 1,
    }
    return ClientContext(node_id=77, node_name="geofl-4", node_config=node_config)  # type: ignore[arg-type]


# ---------------------------------------------------------------- real runs


@pytest.mark.fmnist
@needs_fmnist
@pytest.mark.parametrize("system", ["geofl", "flower"])
def test_tiny_real_run_completes_and_is_measured(system: str) -> None:
    record = scale.run_case(system, TINY)
    assert record["ok"], record.get("error") or record.get("log_tail")
    assert record["rounds_finished"] == 1 and record["tasks_ok_per_round"] == [5]
    assert record["startup_s"] > 0 and record["round1_s"] > 0 and record["steady_round_s"] is None
    assert 0.0 < record["accuracy"] <= 1.0
    assert record["peak_rss_total_mb"] > 100 and record["processes_at_peak"] >= 2
    assert record["cpu_s_total"] > 1.0 and sum(record["cpu_s_by_kind"].values()) > 1.0
    assert len(record["load_before"]) == 3 and record["workdir"] is None
