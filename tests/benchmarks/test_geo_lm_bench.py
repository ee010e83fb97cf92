"""benchmarks.geo_lm without training: every method's file is a valid geofl config that trains
the same tokens, and the summary's ratios are computed from the curves it is given."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from benchmarks.geo_lm import METHODS, SYNC_DP, method, reference_records
from benchmarks.geo_lm_report import render_markdown, summarize
from benchmarks.geo_lm_runs import Curve, GeoSpec, base_config
from benchmarks.wan_schedule import deep_merge
from geofl.server.config.loader import parse_config

SPEC = GeoSpec(steps=40, local_steps=20, fragments=4, overlap_steps=2)


@pytest.mark.parametrize("chosen", METHODS, ids=lambda m: m.name)
def test_every_method_is_a_valid_config_of_the_same_tokens(chosen: Any, tmp_path: Path) -> None:
    config = base_config(SPEC, chosen, 100.0, tmp_path)
    parsed = parse_config(config)
    assert parsed.run.rounds == chosen.rounds(SPEC)
    # Every method trains the same tokens in the run, and evaluates at the same counts.
    assert chosen.rounds(SPEC) * chosen.tokens_per_round(SPEC) == SPEC.steps * (
        SPEC.tokens_per_step
    )
    every_tokens = chosen.eval_every(SPEC) * chosen.tokens_per_round(SPEC)
    assert every_tokens == SPEC.local_steps * SPEC.tokens_per_step
    regions = config["simulation"]["regions"]
    assert sorted(r["rtt_ms"] for r in regions.values()) == [20, 80, 220]
    assert {r["up_mbps"] for r in regions.values()} == {100.0}


def test_streaming_method_sets_fragments_and_4_bit_uploads(tmp_path: Path) -> None:
    config = base_config(SPEC, method("streaming_int4"), 100.0, tmp_path)
    assert config["schedule"]["streaming"] == {
        "fragments": 4,
        "overlap_steps": 2,
        "mixing_alpha": 0.5,
    }
    assert config["compression"]["up"] == [{"qsgd": {"bits": 4}}]
    assert config["compression"]["error_feedback"] is True
    assert config["schedule"]["diloco"]["local_steps"] == 20


def test_spec_refuses_fragments_that_do_not_divide_h() -> None:
    with pytest.raises(ValueError, match="multiple of fragments"):
        GeoSpec(steps=40, local_steps=20, fragments=3)
    with pytest.raises(ValueError, match="multiple of local_steps"):
        GeoSpec(steps=30, local_steps=20)


def _record(name: str, mbps: float, bpb: list[float], step_bytes: int, dt: float) -> Any:
    rounds = list(range(1, len(bpb) + 1))
    curve = Curve(
        rounds=rounds,
        times=[dt * r for r in rounds],
        bpb=list(bpb),
        bytes_up=[step_bytes] * len(bpb),
        bytes_down=[step_bytes] * len(bpb),
        compute_s=[{"1": dt / 2, "2": dt / 4} for _ in rounds],
        durations=[dt] * len(bpb),
        status=["committed"] * len(bpb),
    )
    return {"method": name, "mbps": mbps, "exit_code": 0, "curve": curve.as_dict()}


def test_summary_ratios_against_sync_dp() -> None:
    report: dict[str, Any] = {
        "initial_bpb": 8.0,
        "step_time": {"step_s": 0.1},
        "labels": {"sync_dp": "sync", "diloco": "DiLoCo"},
        # sync: 2 rounds per evaluation point of DiLoCo's single round.
        "tokens_per_round": {"sync_dp": 10, "diloco": 20},
        "records": [
            _record("sync_dp", 100.0, [5.0, 4.0, 3.5, 3.0], 1000, 2.0),
            _record("diloco", 100.0, [4.2, 3.03], 100, 1.0),
        ],
    }
    summary = summarize(report, None)
    assert summary["target_bpb"] == pytest.approx(3.0 * 1.02)
    row = summary["rows"]["diloco@100"]
    assert row["final_gap_vs_sync"] == pytest.approx(0.01)  # 3.03 against 3.0 at 40 tokens
    assert row["bytes_ratio_vs_sync"] == pytest.approx(8000 / 400)
    assert row["time_to_target_s"] == pytest.approx(2.0)
    assert summary["rows"]["sync_dp@100"]["time_to_target_s"] == pytest.approx(8.0)
    assert row["speedup_to_target_vs_sync"] == pytest.approx(4.0)
    assert row["utilisation"] == {"mean": pytest.approx(0.375), "min": pytest.approx(0.25)}
    report["summary"] = summary
    assert "DiLoCo" in render_markdown(report)


def test_sync_dp_evaluates_every_h_steps() -> None:
    assert SYNC_DP.eval_every(SPEC) == SPEC.local_steps
    assert SYNC_DP.rounds(SPEC) == SPEC.steps


def _earlier_report(tmp_path: Path, spec: GeoSpec) -> Path:
    path = tmp_path / "earlier.json"
    report = {
        "spec": asdict(spec),
        "records": [
            _record("sync_dp", 100.0, [5.0, 4.0], 1000, 2.0),
            _record("sync_dp", 1000.0, [5.0, 4.0], 1000, 0.5),
            _record("diloco", 100.0, [4.2], 100, 1.0),
        ],
    }
    path.write_text(json.dumps(report))
    return path


def test_reference_reuses_sync_dp_of_a_report_that_trained_the_same_curve(
    tmp_path: Path,
) -> None:

    path = _earlier_report(tmp_path, SPEC)
    # H and the fragments do not change data parallel's training: reused.
    other_h = replace(SPEC, local_steps=10, fragments=2)
    records = reference_records(path, other_h, [100.0, 1000.0])
    assert [(r["method"], r["mbps"]) for r in records] == [("sync_dp", 100.0), ("sync_dp", 1000.0)]
    assert all(r["reused_from_report"] == str(path) for r in records)
    with pytest.raises(ValueError, match=re.escape("differs in ['lr']")):
        reference_records(path, replace(SPEC, lr=2e-3), [100.0])
    with pytest.raises(ValueError, match=re.escape("no successful sync_dp record at [10.0]")):
        reference_records(path, SPEC, [10.0])


def _args(out: Path, **changes: Any) -> Any:
    from benchmarks.geo_lm import _parse

    argv = ["--out", str(out), "--steps", "40", "--local-steps", "20", "--fragments", "4"]
    argv += ["--overlap-steps", "2"]
    for flag, value in changes.items():
        argv += [f"--{flag.replace('_', '-')}", str(value)]
    return _parse([*argv, "--resume"])


def test_resume_keeps_the_partial_runs_and_refuses_another_spec(tmp_path: Path) -> None:
    from benchmarks.geo_lm import _resumed, _save_partial

    out = tmp_path / "geo_lm.json"
    spec = replace(SPEC, tokens_per_s=5000.0)
    failed = {"method": "diloco", "mbps": 100.0, "error": "exit code 1"}
    kept = _record("sync_dp", 100.0, [5.0, 4.0], 1000, 2.0)
    _save_partial(out, spec, {"tokens_per_s": 5000.0}, [kept, failed])
    speed, records = _resumed(_args(out))
    assert speed == {"tokens_per_s": 5000.0}  # the partial's step time, not a new one
    assert records == [kept]  # a failed run is run again
    with pytest.raises(ValueError, match=re.escape("differs in ['fragments', 'local_steps']")):
        _resumed(_args(out, local_steps=10, fragments=2))


def test_the_wall_check_turns_server_evaluation_off_and_stays_valid(tmp_path: Path) -> None:
    config = deep_merge(
        base_config(SPEC, replace(SYNC_DP, clock="wall"), 100.0, tmp_path),
        {"evaluation": {"every": 0, "server": None}},
    )
    parsed = parse_config(config)
    assert parsed.evaluation.server is None
    assert parsed.simulation.clock == "wall"
