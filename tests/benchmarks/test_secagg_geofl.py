"""Tests of geofl's side of the secure-aggregation benchmark and of the side-by-side report.

All but the last two tests are pure. The last two run the smallest real cases (``geofl
simulate``, 3 clients, 1000 parameters, 2 rounds, one client dropping out per round), plain
and SecAgg+, and check the records (a few seconds each).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

_ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path, package: bool = False) -> ModuleType:
    """Import a module or package folder by path (without putting its parent on sys.path)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name,
        path / "__init__.py" if package else path,
        submodule_search_locations=[str(path)] if package else None,
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot locate {name} at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


if importlib.util.find_spec("benchmarks") is None:
    _load("benchmarks", _ROOT / "benchmarks", package=True)
#: The Flower app's draw of dropped clients (its module needs only NumPy).
flower_common = _load(
    "flwrsecagg_common_for_geofl_tests",
    _ROOT / "benchmarks" / "flower_secagg_app" / "flwrsecagg" / "common.py",
)

from benchmarks.apps.geofl_secagg_echo import (  # noqa: E402
    ClientDropoutError,
    DroppingEcho,
    client_app,
    client_shift,
    dropped_partitions,
)
from benchmarks.secagg import SecAggCase, run_secagg_case  # noqa: E402
from benchmarks.secagg_geofl import (  # noqa: E402
    GeoflSecAgg,
    build_specs,
    describe_variant,
    effective_params,
    expected_shift,
    parse_args,
    record_key,
    run_config,
    run_from_reply,
    secure_section,
    stage_task_bytes,
)
from benchmarks.secagg_report import (  # noqa: E402
    flower_key_exchange_bytes,
    geofl_key_exchange_bytes,
    render,
)
from geofl.client.app import ClientContext  # noqa: E402
from geofl.protocols.types import Weights  # noqa: E402
from geofl.server.config.loader import load_config  # noqa: E402

# ---------------------------------------------------------------- the client app


@given(
    st.integers(1, 200),
    st.sampled_from([0.0, 0.1, 0.34, 0.5]),
    st.integers(1, 50),
    st.integers(0, 9),
)
def test_dropped_partitions_are_the_flower_apps(
    clients: int, fraction: float, server_round: int, seed: int
) -> None:
    ours = dropped_partitions(clients, fraction, server_round, seed)
    assert ours == flower_common.dropped_partitions(clients, fraction, server_round, seed)
    assert len(ours) == round(fraction * clients) and ours <= set(range(clients))


def test_client_shift_is_the_flower_apps() -> None:
    assert [client_shift(p) for p in range(5)] == [flower_common.client_shift(p) for p in range(5)]


def test_dropping_echo_raises_only_in_its_rounds() -> None:
    clients, fraction, seed = 10, 0.1, 0
    rounds = {r: dropped_partitions(clients, fraction, r, seed) for r in range(1, 7)}
    victim = next(iter(rounds[1]))
    echo = DroppingEcho(victim, clients, fraction, seed)
    model: Weights = {"w": np.zeros(4, np.float32)}
    with pytest.raises(ClientDropoutError, match="round 1"):
        echo.fit(model, {"server_round": 1})
    kept = next(r for r, dropped in rounds.items() if victim not in dropped)
    out, examples, metrics = echo.fit(model, {"server_round": kept})
    assert np.allclose(out["w"], client_shift(victim)) and examples == 1
    assert metrics == {"partition-id": victim}
    with pytest.raises(ValueError, match="server_round"):
        echo.fit(model, {})


def test_client_app_reads_its_node_config() -> None:
    def context(node_config: dict[str, Any]) -> ClientContext:
        return ClientContext(1, "n", None, node_config, {}, {})

    app = client_app(context({"partition-id": 3, "num-partitions": 8, "drop-fraction": 0.25}))
    assert isinstance(app, DroppingEcho)
    assert (app.partition_id, app.clients, app.fraction, app.seed) == (3, 8, 0.25, 0)
    with pytest.raises(ValueError, match="partition-id"):
        client_app(context({"num-partitions": 8}))
    with pytest.raises(ValueError, match="drop-fraction"):
        client_app(context({"partition-id": 0, "num-partitions": 2, "drop-fraction": "x"}))


# ---------------------------------------------------------------- configuration


def _case(**kw: Any) -> SecAggCase:
    return SecAggCase(**{"n": 50, "d": 1000, "rounds": 6, "secure": True, **kw})


@pytest.mark.parametrize(
    ("variant", "n", "degree", "threshold"),
    [("matched", 50, 4, 3), ("matched", 3, 2, 2), ("auto", 50, 18, 13), ("full", 50, 49, 33)],
)
def test_variants_resolve_to_the_intended_graph(
    variant: str, n: int, degree: int, threshold: int
) -> None:
    section = secure_section(variant, _case(n=n))
    assert section is not None and section["max_examples"] == 1
    params = effective_params(section, n)
    assert (params.effective_degree, params.threshold) == (degree, threshold)


def test_secure_section_plain_and_unknown() -> None:
    assert secure_section("plain", _case(secure=False)) is None
    with pytest.raises(ValueError, match="unknown variant"):
        secure_section("sparse", _case())
    with pytest.raises(ValueError, match="unknown variant"):
        GeoflSecAgg("sparse")


@pytest.mark.parametrize("mode", ["simulation", "deployment"])
def test_run_config_is_a_valid_geofl_config(tmp_path: Path, mode: str) -> None:
    case = _case(n=20, dropout=0.1, mode=mode, drop_seed=4)
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(run_config(case, "matched", 4321, tmp_path / "g.db")))
    config = load_config(path)
    assert (config.strategy.clients_per_round, config.strategy.min_clients) == (20, 18)
    assert config.secure_aggregation.enabled and config.secure_aggregation.degree == 4
    assert config.secure_aggregation.threshold == pytest.approx(0.6)
    if mode == "simulation":
        assert config.simulation.clients == 20
        assert config.simulation.node_config == {"drop-fraction": 0.1, "drop-seed": 4}
    plain = run_config(_case(secure=False), "plain", 4321, tmp_path / "g.db")
    assert "secure_aggregation" not in plain and plain["strategy"]["min_clients"] == 50


def test_named_case_sets_and_explicit_grid() -> None:
    specs = build_specs(parse_args(["--cases", "headline,full-graph"]))
    assert [(s.n, s.d, s.variant) for s in specs[:3]] == [
        (50, 1_000_000, "plain"),
        (50, 1_000_000, "matched"),
        (50, 1_000_000, "auto"),
    ]
    assert {(s.n, s.variant) for s in specs[3:]} == {(50, "full"), (100, "full")}
    grid = build_specs(parse_args(["--clients", "10,50", "--variants", "plain,auto"]))
    assert [(s.n, s.variant) for s in grid] == [
        (10, "plain"),
        (10, "auto"),
        (50, "plain"),
        (50, "auto"),
    ]
    with pytest.raises(SystemExit):
        parse_args(["--cases", "nope"])


def test_record_key_separates_variants() -> None:
    base = {"system": "geofl", "mode": "simulation", "n": 3, "d": 1, "dropout": 0.0}
    base |= {"secure": True, "rounds": 6}
    one = {**base, "settings": {"drop_stage": "fit", "variant": "matched"}}
    other = {**base, "settings": {"drop_stage": "fit", "variant": "auto"}}
    assert record_key(one) != record_key(other)
    assert record_key(one) == record_key({**one, "steady_round_s": 1.0})


def test_stage_task_bytes_grow_with_the_degree() -> None:
    small = stage_task_bytes(secure_section("matched", _case()) or {}, 50)
    full = stage_task_bytes(secure_section("full", _case()) or {}, 50)
    assert set(small) == {"advertise", "share", "inbox", "unmask"}
    assert small["advertise"] == full["advertise"]  # the setup does not depend on the graph
    assert full["share"] - small["share"] > (49 - 4) * 64  # two 32-byte keys per neighbour
    assert full["inbox"] - small["inbox"] > (49 - 4) * 100


# ---------------------------------------------------------------- reading the database


def _participation(number: int, kind: str, status: str, up: int, down: int, p: int) -> Any:
    return {
        "id": number * 100 + p,
        "round_number": number,
        "kind": kind,
        "status": status,
        "bytes_up": up,
        "bytes_down": down,
        "compute_s": 0.5,
        "duration_s": 0.75,
        "metrics": {"partition-id": p} if kind == "fit" and status == "ok" else {},
    }


def _reply() -> dict[str, Any]:
    rounds, parts = [], []
    for number, status in [(1, "committed"), (2, "committed"), (3, "failed")]:
        rounds.append(
            {
                "number": number,
                "status": status,
                "duration_s": float(number),
                "started_at": "2025-01-01T00:00:00+00:00",
                "phase_durations": {"fit": 0.1 * number},
                "error": None if status == "committed" else "aborted in stage unmask",
            }
        )
        for p in range(2):
            parts.append(_participation(number, "advertise", "ok", 100, 0, p))
            fit_status = "failed" if (number, p) == (2, 1) else "ok"
            parts.append(_participation(number, "fit", fit_status, 4000, 2000, p))
    return {"rounds": rounds, "participations": parts}


def test_run_from_reply_reads_rounds_bytes_and_contributors() -> None:
    run = run_from_reply(_reply(), n=2)
    assert [r.aggregated for r in run.rounds] == [2, 1, 0]  # failed fit; aborted round
    assert [r.duration_s for r in run.rounds] == [1.0, 2.0, 3.0]
    assert run.rounds[0].payload_up_bytes == 4100 and run.rounds[0].payload_down_bytes == 2000
    assert run.notes["bytes_per_client_by_kind"]["advertise"] == {"up": 100.0, "down": 0.0}
    assert run.notes["key_exchange_up_bytes"] == 100.0
    assert run.notes["contributors_by_round"] == {"1": [0, 1], "2": [0]}
    assert run.notes["phase_s"] == {"fit": pytest.approx(0.2)}  # steady and committed only
    assert run.notes["round_errors"] == {"3": "aborted in stage unmask"}
    assert run.notes["client_compute_s"] == {"advertise": 0.5, "fit": 0.5}
    assert run.notes["task_duration_s"] == {"advertise": 0.75, "fit": 0.75}
    assert run.expected_shift == pytest.approx(expected_shift({1: [0, 1], 2: [0]}))
    assert expected_shift({1: [0, 1], 2: [0]}) == pytest.approx(0.0015 + 0.001)


# ---------------------------------------------------------------- the report


def _record(system: str, secure: bool, steady: float | None, **extra: Any) -> dict[str, Any]:
    record = {
        "system": system,
        "mode": "simulation",
        "n": 50,
        "d": 1_000_000,
        "dropout": 0.0,
        "secure": secure,
        "ok": steady is not None,
        "steady_round_s": steady,
        "peak_rss_mb": 1000.0,
        "settings": {},
        "notes": {},
    }
    record.update(extra)
    return record


def _synthetic() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    kinds = {"fit": {"up": 4_000_004.0, "down": 4_000_000.0}}
    geofl = [
        _record(
            "geofl",
            False,
            1.0,
            settings={"variant": "plain"},
            notes={"bytes_per_client_by_kind": {"fit": {"up": 4_000_000.0}}},
        ),
        _record(
            "geofl",
            True,
            1.25,
            settings={"variant": "matched", "holders": 5, "reconstruct_threshold": 3},
            notes={
                "bytes_per_client_by_kind": kinds,
                "key_exchange_up_bytes": 700.0,
                "key_exchange_down_bytes": 300.0,
                "phase_s": {"unmask": 0.125},
            },
        ),
        _record("geofl", True, None, settings={"variant": "auto"}, error="boom"),
    ]
    flower_notes = {
        "stage_down_bytes_per_message": {"setup": 100, "share_keys": 2000, "unmask": 50},
        "stage_up_bytes_per_reply": {"setup": 400, "share_keys": 2500, "unmask": 300},
    }
    flower = [
        _record("flower", False, 2.0),
        _record("flower", True, 10.0, notes=flower_notes),
    ]
    return geofl, flower


def test_key_exchange_bytes_of_each_system() -> None:
    geofl, flower = _synthetic()
    assert geofl_key_exchange_bytes(geofl[1]) == 1000.0
    assert geofl_key_exchange_bytes(geofl[0]) is None
    assert flower_key_exchange_bytes(flower[1]) == 5350.0
    assert flower_key_exchange_bytes(flower[0]) is None


def test_render_puts_the_systems_side_by_side() -> None:
    geofl, flower = _synthetic()
    text = render(geofl, flower)
    row = next(line for line in text.splitlines() if line.startswith("| simulation | 50 | 1e+06"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4:12] == ["1.000", "1.250", "1.25", "failed", "-", "2.000", "10.000", "8.0"]
    assert cells[12] == "4,000,004 / 4,000,000 (1.00)"
    assert cells[13] == "1,000 / 5,350"
    assert cells[14] == "1000 / 1000"
    assert "| matched | simulation | 50 | 1e+06 | 5 | 3 | 700 | 300 | 1,000 | 5,350 |" in text
    assert "0.125" in text  # the phase table


def test_render_without_flower_records_shows_dashes() -> None:
    geofl, _ = _synthetic()
    row = next(line for line in render(geofl, []).splitlines() if "| 50 | 1e+06 | 0% |" in line)
    assert row.count("| - |") >= 2


# ---------------------------------------------------------------- real runs


@pytest.mark.parametrize("variant", ["plain", "matched"])
def test_smallest_geofl_simulation_case_produces_a_sane_record(variant: str) -> None:
    """3 clients, 1000 parameters, 2 rounds; one client drops out of each round's fit."""
    secure = variant != "plain"
    case = SecAggCase(n=3, d=1000, rounds=2, secure=secure, dropout=0.34, timeout_s=120)
    record = run_secagg_case(GeoflSecAgg(variant), case, use_lock=False)
    describe_variant(record, variant, case)
    assert record.ok, record.error
    assert record.aggregated_per_round == [2, 2]  # the dropped client's masks were removed
    assert record.steady_round_s is not None and 0 < record.steady_round_s < record.round_s[0]
    assert record.final_shift == pytest.approx(record.expected_shift, abs=1e-6)
    assert record.peak_rss_mb is not None and record.peak_rss_mb > 100
    assert record.settings["drop_stage"] == "fit" and record.settings["variant"] == variant
    kinds = record.notes["bytes_per_client_by_kind"]
    # two of three clients upload a vector of d (+1 masked: the weight) 4-byte values
    assert kinds["fit"]["up"] > 2 / 3 * 4 * (1000 + secure)
    assert kinds["fit"]["down"] >= 4 * 1000  # every client downloads the model
    if secure:
        assert set(kinds) == {"advertise", "share", "fit", "unmask"}
        assert record.notes["key_exchange_up_bytes"] > 0
        assert record.notes["key_exchange_down_bytes"] > 0
        assert (record.settings["holders"], record.settings["reconstruct_threshold"]) == (3, 2)
        assert {"advertise", "share", "unmask"} <= set(record.notes["phase_s"])
    else:
        assert set(kinds) == {"fit"} and "key_exchange_down_bytes" not in record.notes
