"""Unit tests for the benchmark harness's pure helpers and its byte-counting proxy."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import itertools
import json
import signal
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.byteproxy import ByteProxy, parse_hostport
from benchmarks.core import (
    BenchmarkError,
    RoundRecord,
    RunContext,
    SystemRun,
    Workload,
)
from benchmarks.flower_system import (
    FLOWER_APP_TEMPLATE,
    cli_config_toml,
    traffic_from_ls,
)
from benchmarks.framework import medians, parse_int_list, ratios
from benchmarks.geofl_system import (
    GEOFL_MODEL,
    GeoflSystem,
    checkpoint_dir,
    final_shift,
    phase_medians,
    rounds_from_runs_show,
)
from benchmarks.harness import summarize_case, write_rss_timeline
from benchmarks.metrics import (
    ByteSample,
    bytes_between,
    proxy_bytes_per_round,
    rounds_from_events,
)
from benchmarks.procmon import (
    GroupPeaks,
    ProcessMonitor,
    ProcSample,
    classify_cmdline,
    summarize,
)

# ---------------------------------------------------------------- procmon


@pytest.mark.parametrize(
    ("cmdline", "kind"),
    [
        (["/v/bin/python", "/v/bin/flower-superlink", "--insecure"], "superlink"),
        (["/v/bin/python", "/v/bin/flower-supernode", "--superlink", "x"], "supernode"),
        (["/v/bin/python", "/v/bin/flower-superexec", "--plugin-type", "x"], "superexec"),
        (["/v/bin/python", "/v/bin/flwr-clientapp", "--token", "1"], "clientapp"),
        (["/v/bin/python", "/v/bin/flwr-serverapp", "--token", "1"], "serverapp"),
        (["/v/bin/python", "/v/bin/geofl", "server", "-c", "x.yaml"], "geofl-server"),
        (["/v/bin/python", "/v/bin/geofl", "client", "--server", "h:1"], "geofl-client"),
        (["/usr/bin/sleep", "10"], "other"),
    ],
)
def test_classify_cmdline(cmdline: list[str], kind: str) -> None:
    assert classify_cmdline(cmdline) == kind


def test_summarize_sums_per_instant_and_takes_max_over_time() -> None:
    samples = [
        ProcSample(1.0, "server", 10, "superlink", 100),
        ProcSample(1.0, "server", 11, "serverapp", 50),
        ProcSample(2.0, "server", 10, "superlink", 120),
        ProcSample(2.0, "site-0", 20, "supernode", 30),
        ProcSample(3.0, "server", 10, "superlink", 80),
        ProcSample(3.0, "server", 12, "serverapp", 90),
    ]
    peaks = summarize(samples)
    assert peaks["server"].peak_sum_rss == 170  # t=3: 80 + 90, not 120 + 90
    assert peaks["server"].peak_rss_by_kind == {"superlink": 120, "serverapp": 90}
    assert peaks["server"].pids_seen == 3
    assert peaks["site-0"].peak_sum_rss == 30


# ---------------------------------------------------------------- metrics


def _events(n: int) -> list[dict[str, object]]:
    evs: list[dict[str, object]] = [{"event": "main_start", "t": 99.0}]
    evs += [{"event": "round_start", "round": r, "t": 100.0 + 10 * r} for r in range(1, n + 1)]
    return [*evs, {"event": "end", "t": 100.0 + 10 * n + 4, "final_shift": 1.0}]


def test_rounds_from_events_uses_next_start_and_end() -> None:
    recs = rounds_from_events(_events(3), 3)
    assert [r.number for r in recs] == [1, 2, 3]
    assert [r.duration_s for r in recs] == [10.0, 10.0, 4.0]
    assert recs[0].start_wall == 110.0


def test_rounds_from_events_rejects_incomplete_log() -> None:
    events = [e for e in _events(3) if e.get("round") != 2]
    with pytest.raises(BenchmarkError, match=r"rounds \[2\] missing"):
        rounds_from_events(events, 3)
    with pytest.raises(BenchmarkError, match="end=None"):
        rounds_from_events(_events(3)[:-1], 3)


def test_bytes_between_is_a_step_function() -> None:
    samples = [
        ByteSample(10.0, 100, 1000),
        ByteSample(20.0, 300, 1500),
        ByteSample(30.0, 350, 1600),
    ]
    assert bytes_between(samples, 5.0, 10.0) == (100, 1000)  # before first sample: zero
    assert bytes_between(samples, 10.0, 25.0) == (200, 500)
    assert bytes_between(samples, 31.0, 40.0) == (0, 0)
    with pytest.raises(ValueError, match="ends before it starts"):
        bytes_between(samples, 2.0, 1.0)


@given(
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1, max_size=20),
    st.lists(st.floats(0, 25, allow_nan=False), min_size=2, max_size=6),
)
def test_bytes_of_consecutive_rounds_add_up(
    increments: list[tuple[int, int]], cuts: list[float]
) -> None:
    up = np.cumsum([i for i, _ in increments]).tolist()
    down = np.cumsum([d for _, d in increments]).tolist()
    samples = [
        ByteSample(float(t), int(u), int(d)) for t, (u, d) in enumerate(zip(up, down, strict=True))
    ]
    cuts = sorted(cuts)
    parts = [bytes_between(samples, a, b) for a, b in itertools.pairwise(cuts)]
    assert tuple(map(sum, zip(*parts, strict=True))) == bytes_between(samples, cuts[0], cuts[-1])


def test_proxy_bytes_per_round_needs_start_times() -> None:
    samples = [ByteSample(0.0, 0, 0), ByteSample(5.0, 40, 80), ByteSample(9.0, 50, 90)]
    rounds = [RoundRecord(1, 5.0, start_wall=0.0), RoundRecord(2, 4.0, start_wall=5.0)]
    assert proxy_bytes_per_round(samples, rounds) == [(40, 80), (10, 10)]
    assert proxy_bytes_per_round(samples, [RoundRecord(1, 5.0)]) is None


# ---------------------------------------------------------------- Flower / geofl adapters


def test_cli_config_toml_names_connection_and_address() -> None:
    doc = tomllib.loads(cli_config_toml("bench", 4242))
    assert doc["superlink"]["default"] == "bench"
    assert doc["superlink"]["bench"] == {"address": "127.0.0.1:4242", "insecure": True}


# flwr's CLI modules import click helpers that click 8.2+ deprecates (not our code).
@pytest.mark.filterwarnings("ignore:'click.utils:DeprecationWarning")
def test_flower_app_template_is_a_valid_flower_app() -> None:
    from flwr.common.config import validate_fields_in_config

    config = tomllib.loads((FLOWER_APP_TEMPLATE / "pyproject.toml").read_text())
    ok, errors, _ = validate_fields_in_config(config)
    assert ok, errors
    for ref in config["tool"]["flwr"]["app"]["components"].values():
        module = ref.split(":")[0].replace(".", "/") + ".py"
        assert (FLOWER_APP_TEMPLATE / module).is_file(), ref
    assert "federations" not in config["tool"]["flwr"]


def test_traffic_from_ls_reads_network_traffic() -> None:
    reply = {"success": True, "runs": [{"network-traffic": {"inbound-bytes": 5, "total-bytes": 9}}]}
    assert traffic_from_ls(reply) == {"inbound-bytes": 5, "total-bytes": 9}
    assert traffic_from_ls({"runs": []}) == {}


def test_rounds_from_runs_show_parses_and_sorts() -> None:
    reply = {
        "rounds": [
            {"number": 2, "duration_s": 1.5, "bytes_up": 10, "bytes_down": 20},
            {"number": 1, "duration_s": 2.5, "started_at": "2025-01-01T00:00:00+00:00"},
        ]
    }
    recs = rounds_from_runs_show(reply)
    assert [(r.number, r.duration_s) for r in recs] == [(1, 2.5), (2, 1.5)]
    assert recs[0].start_wall == 1735689600.0
    assert (recs[1].bytes_up, recs[1].bytes_down) == (10, 20)
    with pytest.raises(BenchmarkError, match="no 'rounds' list"):
        rounds_from_runs_show({"run": 1})
    with pytest.raises(BenchmarkError, match="malformed"):
        rounds_from_runs_show({"rounds": [{"number": 1}]})


def test_rounds_from_runs_show_reads_naive_timestamps_as_utc() -> None:
    reply = {"rounds": [{"number": 1, "duration_s": 1.0, "started_at": "2025-01-01T00:00:00"}]}
    assert rounds_from_runs_show(reply)[0].start_wall == 1735689600.0


def test_geofl_run_yaml_is_a_valid_geofl_config(tmp_path: Path) -> None:
    from geofl.server.config.loader import load_config

    ctx = RunContext(tmp_path, 4321, 4322, ProcessMonitor())
    path = GeoflSystem().write_config(Workload(10, 7, 4, 99.0), ctx, tmp_path / "g.db")
    config = load_config(path)
    assert config.run.rounds == 4 and config.model == GEOFL_MODEL
    assert config.strategy.name == "fedavg"
    assert (config.strategy.clients_per_round, config.strategy.min_clients) == (7, 7)
    assert config.evaluation.every == 0
    assert config.server.address == "127.0.0.1:4321"
    assert config.storage.url == f"sqlite:///{tmp_path / 'g.db'}"
    assert config.storage.checkpoints == checkpoint_dir(tmp_path / "g.db")
    assert config.schedule.wait_for_clients_s == 99.0


def test_final_shift_is_the_mean_difference_and_checks_the_model() -> None:
    start = {"a": np.zeros((2, 3), np.float32), "b": np.ones(4, np.float32)}
    end = {"a": np.full((2, 3), 2.0, np.float32), "b": np.full(4, 4.0, np.float32)}
    assert final_shift(start, end) == pytest.approx((6 * 2.0 + 4 * 3.0) / 10)
    with pytest.raises(BenchmarkError, match="differ"):
        final_shift(start, {"a": end["a"]})
    with pytest.raises(BenchmarkError, match="tensor 'b'"):
        final_shift(start, {"a": end["a"], "b": np.zeros(5, np.float32)})


def test_phase_medians_take_the_median_per_phase() -> None:
    reply = {
        "rounds": [
            {"phase_durations": {"fit": 1.0, "broadcast": 0.5}},
            {"phase_durations": {"fit": 3.0, "broadcast": 0.1}},
            {"phase_durations": {"fit": 2.0, "select": 9.0}},
        ]
    }
    assert phase_medians(reply) == {"broadcast": 0.3, "fit": 2.0, "select": 9.0}
    assert phase_medians({"rounds": "x"}) == {}


def test_rss_timeline_sums_each_group_per_sample(tmp_path: Path) -> None:
    monitor = ProcessMonitor()
    monitor.samples = [
        ProcSample(1.0, "server", 10, "geofl-server", 100),
        ProcSample(1.0, "server", 11, "other", 5),
        ProcSample(1.0, "site-0", 20, "geofl-client", 7),
        ProcSample(2.0, "server", 10, "geofl-server", 300),
    ]
    write_rss_timeline(monitor, tmp_path / "rss.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "rss.jsonl").read_text().splitlines()]
    assert rows == [
        {"t": 1.0, "group": "server", "rss": 105},
        {"t": 1.0, "group": "site-0", "rss": 7},
        {"t": 2.0, "group": "server", "rss": 300},
    ]


def test_memory_brake_kills_the_tree_and_fails_the_case(tmp_path: Path) -> None:
    monitor = ProcessMonitor(0.05, limit_bytes=1)
    ctx = RunContext(tmp_path, 1, 2, monitor)
    proc = ctx.spawn("server", "sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
    monitor.start()
    try:
        code = proc.wait(timeout=30)
    finally:
        monitor.stop()
        ctx.stop_all()
    assert code == -signal.SIGKILL
    assert monitor.exceeded is not None and "passed the limit" in monitor.exceeded
    with pytest.raises(BenchmarkError, match="memory brake"):
        ctx.check_alive()


# ---------------------------------------------------------------- harness / report


def _run(final_shift: float) -> SystemRun:
    return SystemRun(
        rounds=[RoundRecord(1, 3.0, start_wall=0.0), RoundRecord(2, 5.0, start_wall=3.0)],
        final_shift=final_shift,
    )


def test_summarize_case_checks_the_final_model() -> None:
    workload = Workload(params=100, clients=4, rounds=2)
    assert workload.expected_shift() == 5.0  # 2 rounds x mean(1, 2, 3, 4)
    samples = [ByteSample(0.0, 0, 0), ByteSample(3.0, 400, 400), ByteSample(8.0, 800, 800)]
    peaks = {"server": GroupPeaks(5_000_000, {"superlink": 3_000_000}, 2)}
    good = summarize_case("flower", workload, _run(5.0), samples, peaks)
    assert good["ok"] and good["median_round_s"] == 4.0
    assert good["proxy_up_mb_per_round"] == [0.0004, 0.0004]
    assert good["peak_rss_server_mb"] == 5.0 and good["peak_rss_client_site_mb"] is None
    bad = summarize_case("flower", workload, _run(4.0), samples, peaks)
    assert not bad["ok"] and "lost or duplicated" in bad["error"]


def test_ratios_divide_geofl_by_flower_and_never_invent() -> None:
    cases = [
        {"system": "flower", "params": 1, "ok": True, "median_round_s": 20.0},
        {"system": "geofl", "params": 1, "ok": True, "median_round_s": 2.0},
        {"system": "flower", "params": 2, "ok": True, "median_round_s": 40.0},
        {"system": "geofl", "params": 2, "ok": False, "median_round_s": 1.0},
    ]
    rows = {r["params"]: r for r in ratios(cases)}
    assert rows[1]["median_round_s"] == pytest.approx(0.1)
    assert rows[2]["median_round_s"] is None
    assert rows[1]["peak_rss_server_mb"] is None


def test_medians_over_repeats_and_loopback_ratio() -> None:
    cases = [
        {"system": "geofl", "params": 1, "ok": True, "median_round_s": 3.0},
        {"system": "geofl", "params": 1, "ok": True, "median_round_s": 1.0},
        {"system": "geofl", "params": 1, "ok": False, "median_round_s": 99.0},
        {"system": "flower", "params": 1, "ok": True, "median_round_s": 8.0},
    ]
    bounds = [{"params": 1, "ok": True, "median_s": 0.5}]
    rows = {r["system"]: r for r in medians(cases, bounds)}
    assert rows["geofl"]["median_round_s"] == 2.0  # the failed repeat is left out
    assert (rows["geofl"]["repeats_ok"], rows["geofl"]["repeats"]) == (2, 3)
    assert rows["geofl"]["round_s_over_loopback"] == 4.0
    assert rows["flower"]["round_s_over_loopback"] == 16.0
    assert medians(cases, [])[0]["round_s_over_loopback"] is None


def test_parse_int_list() -> None:
    assert parse_int_list("1_000_000,10000000") == [1_000_000, 10_000_000]
    for bad in ("", "1,x", "0"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_int_list(bad)


# ---------------------------------------------------------------- byte proxy


def test_parse_hostport() -> None:
    assert parse_hostport("127.0.0.1:80") == ("127.0.0.1", 80)
    for bad in ("127.0.0.1", ":80", "h:0", "h:99999", "h:x"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_hostport(bad)


async def _echo_through_proxy(payload: bytes) -> tuple[bytes, int, int, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    proxy = ByteProxy("127.0.0.1", 0, "127.0.0.1", server.sockets[0].getsockname()[1])
    await proxy.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(payload)
    writer.write_eof()
    received = await reader.read(-1)
    writer.close()
    await writer.wait_closed()
    await proxy.stop()
    server.close()
    await server.wait_closed()
    c = proxy.counters
    return received, c.up, c.down, c.connections


def test_byteproxy_forwards_and_counts_both_directions() -> None:
    payload = np.random.default_rng(0).bytes(3 * 1024 * 1024 + 17)
    received, up, down, conns = asyncio.run(_echo_through_proxy(payload))
    assert received == payload
    assert (up, down, conns) == (len(payload), len(payload), 1)


# ---------------------------------------------------------------- geofl echo app


def test_geofl_echo_app(monkeypatch: pytest.MonkeyPatch) -> None:
    echo = importlib.import_module("benchmarks.apps.geofl_echo")
    from geofl.client.app import ClientContext

    client = echo.client_app(
        ClientContext(node_id=1, node_name="c", node_config={"partition-id": 3})
    )
    params = {"w": np.zeros(5, dtype=np.float32)}
    out, weight, _ = client.fit(params, {})
    assert weight == 1 and out["w"].dtype == np.float32
    np.testing.assert_array_equal(out["w"], np.full(5, 4.0, dtype=np.float32))
    np.testing.assert_array_equal(params["w"], np.zeros(5, dtype=np.float32))  # not mutated
    with pytest.raises(ValueError, match="partition-id"):
        echo.client_app(ClientContext(node_id=1, node_name="c"))
    monkeypatch.setenv(echo.PARAMS_ENV, "7")
    assert echo.make_model()["w"].shape == (7,)
    monkeypatch.setenv(echo.PARAMS_ENV, "-1")
    with pytest.raises(ValueError, match=echo.PARAMS_ENV):
        echo.make_model()


@pytest.mark.filterwarnings("ignore:'click.utils:DeprecationWarning")
def test_both_systems_start_from_the_same_non_constant_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = importlib.util.spec_from_file_location(
        "flwrbench_server_app", FLOWER_APP_TEMPLATE / "flwrbench" / "server_app.py"
    )
    assert spec is not None and spec.loader is not None
    server_app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(server_app)
    echo = importlib.import_module("benchmarks.apps.geofl_echo")
    monkeypatch.setenv(echo.PARAMS_ENV, "1000")
    geofl_w = echo.make_model()["w"]
    np.testing.assert_array_equal(server_app.initial_model(1000), geofl_w)
    # constant chunks would be deduplicated by content-addressed transports
    assert len(np.unique(geofl_w)) > 990
