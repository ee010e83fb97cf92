"""Tests of the comparison harness: workload registry, metrics, table, and one tiny real run.

The real run is a geofl simulation only (2 clients, 2 rounds, 1k parameters, a few
seconds); Flower deployments take minutes and are exercised by running the benchmark.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

_ROOT = Path(__file__).resolve().parents[2]


from benchmarks import compare, framework  # noqa: E402
from benchmarks.apps import digits_mlp, geofl_digits  # noqa: E402
from benchmarks.compare import (  # noqa: E402
    build_report,
    case_metrics,
    render_markdown,
    run_comparison,
    scrub_paths,
    summarize,
)
from benchmarks.core import REPO_ROOT, Workload  # noqa: E402
from benchmarks.geofl_system import GeoflSimulationSystem  # noqa: E402
from benchmarks.metrics import rounds_from_events  # noqa: E402
from benchmarks.procmon import ProcSample, classify_cmdline, peak_rss_of_kinds  # noqa: E402
from benchmarks.workloads import (  # noqa: E402
    DIGITS_MLP_PARAMS,
    FASHION_CNN_PARAMS,
    WORKLOADS,
    NamedWorkload,
    get_workload,
    register,
)
from geofl.client.app import ClientContext  # noqa: E402

# ---------------------------------------------------------------- registry


def test_registry_has_the_issue_workloads() -> None:
    assert {"echo-1m", "echo-10m", "mlp-digits", "cnn-fashion"} <= set(WORKLOADS)
    assert (WORKLOADS["echo-1m"].task, WORKLOADS["echo-1m"].params) == ("echo", 1_000_000)
    assert WORKLOADS["echo-10m"].params == 10_000_000
    assert WORKLOADS["mlp-digits"].task == "mlp-digits"
    assert all(w.clients == 10 for w in WORKLOADS.values())


def test_named_workload_becomes_a_harness_workload() -> None:
    named = get_workload("mlp-digits")
    assert named.workload() == Workload(
        DIGITS_MLP_PARAMS, 10, named.rounds, named.timeout_s, "mlp-digits"
    )
    assert named.workload(rounds=3, timeout_s=5.0).rounds == 3
    assert named.workload(timeout_s=5.0).timeout_s == 5.0
    with pytest.raises(ValueError, match="rounds must be >= 2"):
        named.workload(rounds=1)


def test_registry_rejects_bad_and_duplicate_workloads() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register(NamedWorkload("echo-1m", "echo", 1, 1))
    with pytest.raises(ValueError, match="unknown task"):
        NamedWorkload("x", "resnet", 1, 1)
    with pytest.raises(ValueError, match="needs >= 2 rounds"):
        NamedWorkload("x", "echo", 1, 1, rounds=1)
    with pytest.raises(ValueError, match="known: cnn-fashion, echo-10m, echo-1m"):
        get_workload("nope")
    with pytest.raises(ValueError, match="unknown task"):
        Workload(1, 1, 2, task="nope")


def test_only_echo_has_an_expected_shift() -> None:
    assert Workload(10, 4, 2).expected_shift() == 5.0
    assert Workload(10, 4, 2, task="mlp-digits").expected_shift() is None


# ---------------------------------------------------------------- the shared digits task


def test_digits_mlp_params_constant_matches_the_model() -> None:
    assert digits_mlp.num_params() == DIGITS_MLP_PARAMS


def test_digits_training_is_deterministic_and_learns() -> None:
    start = digits_mlp.initial_weights()
    first = digits_mlp.train(start, 1, 3, server_round=2)
    again = digits_mlp.train(start, 1, 3, server_round=2)
    other_round = digits_mlp.train(start, 1, 3, server_round=3)
    assert first[1] == len(digits_mlp.partition_indices(1, 3))
    for name, arr in first[0].items():
        assert arr.shape == start[name].shape and arr.dtype == np.float32
        np.testing.assert_array_equal(arr, again[0][name])
    assert any(not np.array_equal(first[0][n], other_round[0][n]) for n in start)
    assert digits_mlp.accuracy(first[0]) > digits_mlp.accuracy(start) + 0.3


def test_digits_partitions_cover_the_training_split_once() -> None:
    parts = [digits_mlp.partition_indices(i, 4) for i in range(4)]
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined)
    assert len(joined) == sum(len(p) for p in parts)
    with pytest.raises(ValueError, match=r"outside 0\.\.3"):
        digits_mlp.partition_indices(4, 4)


def test_geofl_digits_client_reads_its_partition_and_round() -> None:
    context = ClientContext(1, "n", node_config={"partition-id": 0, "num-partitions": 5})
    client = geofl_digits.client_app(context)
    weights, examples, metrics = client.fit(geofl_digits.make_model(), {"server_round": 1})
    expected, n, _ = digits_mlp.train(digits_mlp.initial_weights(), 0, 5, 1)
    assert examples == n and "train_loss" in metrics
    for name, arr in expected.items():
        np.testing.assert_array_equal(weights[name], arr)
    with pytest.raises(ValueError, match="'server_round'"):
        client.fit(geofl_digits.make_model(), {})
    with pytest.raises(ValueError, match="'num-partitions'"):
        geofl_digits.client_app(ClientContext(1, "n", node_config={"partition-id": 0}))


# ---------------------------------------------------------------- measurement plumbing


@pytest.mark.parametrize(
    ("cmdline", "kind"),
    [
        (["/v/bin/python", "/v/bin/geofl", "simulate", "-c", "run.yaml"], "geofl-simulate"),
        (["/v/bin/python", "-m", "geofl.client", "--server", "x"], "geofl-client"),
        (["/v/bin/python", "/v/bin/flwr-simulation", "--token", "t"], "simulation"),
        (["ray::ClientAppActor"], "ray-actor"),
        (["ray::IDLE"], "ray-infra"),
        (["/v/lib/ray/core/src/ray/gcs/gcs_server", "--log_dir=/t"], "ray-infra"),
        (["/v/lib/ray/core/src/ray/raylet/raylet", "--x"], "ray-infra"),
        (["/v/bin/python", "/v/lib/ray/_private/workers/default_worker.py"], "ray-infra"),
    ],
)
def test_simulation_processes_are_classified(cmdline: list[str], kind: str) -> None:
    assert classify_cmdline(cmdline) == kind


def test_peak_rss_of_kinds_sums_per_instant_or_takes_the_largest_process() -> None:
    samples = [
        ProcSample(1.0, "server", 1, "geofl-simulate", 100),
        ProcSample(1.0, "server", 2, "geofl-client", 40),
        ProcSample(1.0, "server", 3, "geofl-client", 50),
        ProcSample(2.0, "server", 1, "geofl-simulate", 120),
        ProcSample(2.0, "server", 2, "geofl-client", 60),
    ]
    assert peak_rss_of_kinds(samples, {"geofl-client"}) == 90  # t=1: 40 + 50
    assert peak_rss_of_kinds(samples, {"geofl-client"}, per_process=True) == 60
    assert peak_rss_of_kinds(samples, {"geofl-simulate", "geofl-client"}) == 190
    assert peak_rss_of_kinds(samples, {"superlink"}) == 0


def test_rounds_from_events_reads_flower_payload_bytes() -> None:
    events: list[dict[str, object]] = [
        {"event": "round_start", "round": 1, "t": 10.0, "bytes_down": 400},
        {"event": "round_replies", "round": 1, "t": 12.0, "bytes_up": 404},
        {"event": "round_start", "round": 2, "t": 13.0},
        {"event": "end", "t": 15.0},
    ]
    first, second = rounds_from_events(events, 2)
    assert (first.bytes_up, first.bytes_down, first.duration_s) == (404, 400, 3.0)
    assert (second.bytes_up, second.bytes_down) == (None, None)


# ---------------------------------------------------------------- metrics, summary, table


def _case(mode: str, system: str, seconds: float, ok: bool = True, **extra: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "mode": mode,
        "system": system,
        "ok": ok,
        "round_s": [30.0, seconds, seconds, 99.0 if seconds > 1 else seconds],
        "proxy_up_mb_per_round": [9.0, 2.0, 2.0, 2.0],
        "proxy_down_mb_per_round": [9.0, 1.0, 1.0, 1.0],
        "system_round_bytes": [[1, 1], [3_000_000, 1_000_000], [3_000_000, 1_000_000]],
        "peak_rss_server_mb": 500.0,
        "peak_rss_client_site_mb": 200.0,
        "peak_rss_roles_mb": {"server": 300.0, "client": 100.0},
        "peak_rss_total_mb": 2000.0,
        "accuracy": 0.9,
    }
    return record | extra


def test_case_metrics_skip_round_one_and_pick_bytes_and_memory_by_mode() -> None:
    deployed = case_metrics(_case("deployment", "flower", 10.0), "deployment")
    assert deployed["round_s"] == 10.0  # median of 10, 10, 99: round 1 (30 s) left out
    assert (deployed["up_mb"], deployed["down_mb"]) == (2.0, 1.0)
    assert (deployed["server_rss_mb"], deployed["client_rss_mb"]) == (500.0, 200.0)
    simulated = case_metrics(_case("simulation", "geofl", 0.5), "simulation")
    assert (simulated["up_mb"], simulated["down_mb"]) == (3.0, 1.0)
    assert (simulated["server_rss_mb"], simulated["client_rss_mb"]) == (300.0, 100.0)
    assert simulated["total_rss_mb"] == 2000.0 and simulated["accuracy"] == 0.9
    with pytest.raises(ValueError, match="unknown mode"):
        case_metrics(_case("x", "geofl", 1.0), "x")


def test_summary_takes_medians_of_good_repeats_and_divides_geofl_by_flower() -> None:
    cases = [
        _case("deployment", "flower", 10.0),
        _case("deployment", "flower", 12.0),
        _case("deployment", "flower", 1000.0, ok=False),
        _case("deployment", "geofl", 0.5, accuracy=None),
        _case("simulation", "geofl", 0.2),
    ]
    rows = {(r["mode"], r["system"]): r for r in summarize(cases)}
    flower, geofl = rows[("deployment", "flower")], rows[("deployment", "geofl")]
    assert (flower["repeats_ok"], flower["repeats"], flower["round_s"]) == (2, 3, 11.0)
    ratio = rows[("deployment", "geofl/flower")]
    assert ratio["round_s"] == pytest.approx(0.5 / 11.0)
    assert ratio["accuracy"] is None  # geofl reported none: no invented ratio
    assert ("simulation", "geofl/flower") not in rows  # Flower not run in simulation
    assert geofl["accuracy"] is None


@given(st.lists(st.floats(0.01, 1e3), min_size=1, max_size=5), st.floats(0.01, 1e3))
def test_ratio_is_the_quotient_of_the_medians(flower_times: list[float], geofl_time: float) -> None:
    cases = [_case("simulation", "flower", t) for t in flower_times]
    cases.append(_case("simulation", "geofl", geofl_time))
    ratio = next(r for r in summarize(cases) if r["kind"] == "ratio")
    # Each case's steady rounds are (t, t, 99 or t), so its median is t.
    assert ratio["round_s"] == pytest.approx(geofl_time / float(np.median(flower_times)))


def test_markdown_table_has_one_row_per_system_and_ratio() -> None:
    named = NamedWorkload("tiny", "echo", 1000, 2, rounds=4)
    cases = [_case("deployment", "flower", 10.0), _case("deployment", "geofl", 0.5)]
    settings = {"repeats": 1, "rounds": 4}
    text = render_markdown(build_report(named, cases, settings))
    lines = text.splitlines()
    assert lines[0].startswith("**tiny**: 2 clients, 1,000 params, 4 rounds")
    assert lines[2].startswith("| mode | system | ok | s/round (steady) |")
    assert (
        "| deployment | Flower 1.42 | 1/1 | 10 | 2.000 | 1.000 | 500 | 200 | 2000 | 0.9000 |"
        in (lines)
    )
    assert "| deployment | **geofl / Flower** |  | 0.050 | 1.000 |" in text
    assert len([line for line in lines if line.startswith("| deployment")]) == 3


def test_results_carry_no_machine_paths() -> None:
    tmp = tempfile.gettempdir()
    value = {"a": [f"{tmp}/bench-x/logs", f"{REPO_ROOT}/benchmarks"], "b": 3}
    assert scrub_paths(value) == {"a": ["$TMPDIR/bench-x/logs", "./benchmarks"], "b": 3}


def test_cli_rejects_unknown_workload_mode_and_rounds(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="unknown workload 'nope'"):
        compare.main(["--workload", "nope"])
    for argv in (
        ["--workload", "echo-1m", "--modes", "cloud"],
        ["--workload", "x", "--rounds", "1"],
    ):
        with pytest.raises(SystemExit):
            compare.main(argv)
    compare.main(["--list"])
    assert "mlp-digits:" in capsys.readouterr().out


@pytest.mark.parametrize("main", [compare.main, framework.main], ids=["compare", "framework"])
def test_a_malformed_geofl_set_is_refused_before_any_run(
    main: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--workload", "echo-1m"] if main is compare.main else ["--systems", "geofl"]
    with pytest.raises(SystemExit):
        main([*argv, "--geofl-set", "no-equals-sign"])
    assert "no-equals-sign" in capsys.readouterr().err


# ---------------------------------------------------------------- one real run


def test_tiny_geofl_simulation_end_to_end() -> None:
    named = NamedWorkload("tiny", "echo", 1000, 2, rounds=2, timeout_s=120.0)
    seen: list[int] = []
    cases = run_comparison(
        named, ["simulation"], ["geofl"], on_case=lambda so_far: seen.append(len(so_far))
    )
    assert seen == [1]
    (case,) = cases
    assert case["ok"], case.get("error")
    assert (case["mode"], case["system"], case["workload"]) == ("simulation", "geofl", "tiny")
    assert case["final_shift"] == pytest.approx(named.workload().expected_shift())
    assert case["median_up_mb"] is None  # no proxy in a simulation
    metrics = case_metrics(case, "simulation")
    assert metrics["up_mb"] is not None and metrics["up_mb"] >= 2 * 1000 * 4 / 1e6
    assert metrics["server_rss_mb"] and metrics["client_rss_mb"]
    assert set(GeoflSimulationSystem.memory_roles) == {"server", "client"}
    report = build_report(named, cases, {"repeats": 1, "rounds": 2})
    assert "| simulation | geofl | 1/1 |" in render_markdown(report)


# ---------------------------------------------------------------- issue 18: wall-clock simulation


def test_fashion_cnn_workload_is_registered_with_the_models_size() -> None:
    fashion_cnn = pytest.importorskip("benchmarks.apps.fashion_cnn")
    named = get_workload("cnn-fashion")
    assert (named.task, named.clients) == ("cnn-fashion", 10)
    assert fashion_cnn.num_params() == FASHION_CNN_PARAMS == named.params


def test_fashion_cnn_partitions_cover_the_subset_once() -> None:
    fashion_cnn = pytest.importorskip("benchmarks.apps.fashion_cnn")
    parts = [fashion_cnn.partition_indices(i, 10) for i in range(10)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(fashion_cnn.TRAIN_IMAGES))
    with pytest.raises(ValueError, match="outside"):
        fashion_cnn.partition_indices(10, 10)


def test_geofl_sim_settings_reach_the_simulation_section(tmp_path: Path) -> None:
    from benchmarks.core import RunContext
    from benchmarks.procmon import ProcessMonitor
    from geofl.server.config.loader import load_config

    settings = compare.parse_settings(["pooled=false", "client_threads=0", "workers=3"])
    assert settings == {"pooled": False, "client_threads": 0, "workers": 3}
    system = compare.make_system("simulation", "geofl", settings)
    ctx = RunContext(tmp_path, 4321, 4322, ProcessMonitor())
    config = load_config(system.write_config(Workload(10, 4, 2, 60.0), ctx, tmp_path / "g.db"))
    assert (config.simulation.pooled, config.simulation.client_threads) == (False, 0)
    assert (config.simulation.workers, config.simulation.clients) == (3, 4)
    assert compare.make_system("simulation", "flower", settings).name == "flower"
    with pytest.raises(ValueError, match="KEY=VALUE"):
        compare.parse_settings(["pooled"])
