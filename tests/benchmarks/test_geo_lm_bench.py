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
    # sync reaches DiLoCo's final 3.03 only at its 3.0 (8 s); DiLoCo ended at 2 s.
    assert row["sync_time_to_this_final_s"] == pytest.approx(8.0)
    assert row["speedup_at_this_final_vs_sync"] == pytest.approx(4.0)
    assert row["utilisation"] == {"mean": pytest.approx(0.375), "min": pytest.approx(0.25)}
    report["summary"] = summary
    assert "DiLoCo" in render_markdown(report)
    assert "step 0.100 s" in render_markdown(report)


def test_header_derives_the_step_from_a_given_token_rate() -> None:
    report: dict[str, Any] = {
        "initial_bpb": 8.0,
        "spec": asdict(SPEC),
        "step_time": {"tokens_per_s": SPEC.batch * 128 / 0.25, "given": True},
        "summary": {"target_bpb": 3.0, "rows": {}, "failed": []},
        "labels": {},
    }
    assert "step 0.250 s (from the given 4096 tokens/s)" in render_markdown(report)


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
    with pytest.raises(ValueError, match=re.escape("differs in ['cosine']")):
        reference_records(path, replace(SPEC, cosine=True), [100.0])


def test_a_report_from_before_the_schedule_existed_had_a_constant_rate(tmp_path: Path) -> None:
    path = _earlier_report(tmp_path, SPEC)
    report = json.loads(path.read_text())
    for key in ("warmup_steps", "cosine", "final_lr_ratio"):
        del report["spec"][key]
    path.write_text(json.dumps(report))
    assert len(reference_records(path, SPEC, [100.0])) == 1
    with pytest.raises(ValueError, match=re.escape("differs in ['warmup_steps']")):
        reference_records(path, replace(SPEC, warmup_steps=5), [100.0])


def test_the_schedule_reaches_the_sites_and_data_parallels_server_alike(tmp_path: Path) -> None:
    spec = replace(SPEC, warmup_steps=4, cosine=True, final_lr_ratio=0.2)
    expected = {"warmup_steps": 4, "decay_steps": spec.steps, "final_lr_ratio": 0.2}
    diloco = parse_config(base_config(spec, method("diloco"), 100.0, tmp_path / "a"))
    assert {k: diloco.round_config[k] for k in expected} == expected
    sync = parse_config(base_config(spec, SYNC_DP, 100.0, tmp_path / "b"))
    assert {k: getattr(sync.strategy, k) for k in expected} == expected


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


def test_the_wall_check_runs_both_clocks_without_server_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``wall_validation`` runs the method on both clocks at the shared-core step time, with
    server evaluation off, in a configuration geofl accepts, and compares rounds 2 on."""
    import benchmarks.geo_lm as geo_lm

    calls: list[dict[str, Any]] = []

    def run(spec: GeoSpec, chosen: Any, mbps: float, root: Path, **kwargs: Any) -> Any:
        config = deep_merge(base_config(spec, chosen, mbps, root), kwargs["overrides"])
        calls.append({"config": parse_config(config), "spec": spec, "rounds": kwargs["rounds"]})
        seconds = 2.0 if chosen.clock == "wall" else 1.5
        return _record(chosen.name, mbps, [5.0, 4.0, 3.0], 100, seconds)

    monkeypatch.setattr(geo_lm, "run_method", run)
    monkeypatch.setattr(geo_lm, "measure_tokens_per_s", lambda concurrent: {"tokens_per_s": 99.0})
    result = geo_lm.wall_validation(SPEC, SYNC_DP, tmp_path, rounds=3)
    assert [c["config"].simulation.clock for c in calls] == ["wall", "virtual"]
    assert all(c["config"].evaluation.server is None for c in calls)
    assert all(c["spec"].tokens_per_s == 99.0 and c["rounds"] == 3 for c in calls)
    assert result["round_error"] == pytest.approx(-0.25)  # 1.5 s against 2.0 s


def test_a_probe_round_stands_for_later_rounds_of_the_same_phase() -> None:
    from benchmarks.geo_lm import _probe_round

    # Streaming with P = 2: the probe has rounds 0..4 (first + two periods).
    assert [_probe_round(i, 5, 2) for i in range(9)] == [0, 1, 2, 3, 4, 3, 4, 3, 4]
    assert [_probe_round(i, 3, 1) for i in range(5)] == [0, 1, 2, 2, 2]


def _stub_runs(monkeypatch: pytest.MonkeyPatch, probe_bpb: list[float]) -> list[int | None]:
    """``run_method`` replaced: a probe of ``probe_bpb`` (one phase-marking byte count per
    round), a full run otherwise; returns the ``rounds`` of every call."""
    import benchmarks.geo_lm as geo_lm

    calls: list[int | None] = []

    def run(spec: GeoSpec, chosen: Any, mbps: float, root: Path, rounds: int | None = None) -> Any:
        calls.append(rounds)
        if rounds is None:
            return _record(chosen.name, mbps, [9.0] * 8, 1, 1.0)
        record = _record(chosen.name, mbps, probe_bpb[:rounds], 0, 0.5)
        record["curve"]["bytes_up"] = [10 + i for i in range(rounds)]  # round i's own size
        return record

    monkeypatch.setattr(geo_lm, "run_method", run)
    return calls


def test_reuse_maps_streaming_rounds_to_the_same_fragment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks.geo_lm import probe_and_reuse

    spec = GeoSpec(steps=40, local_steps=20, fragments=2, overlap_steps=2)
    full = _record("streaming_int4", 100.0, [6.0, 5.0, 4.5, 4.0, 3.8, 3.6, 3.5, 3.4], 7, 2.0)
    calls = _stub_runs(monkeypatch, [6.0, 5.0, 4.5, 4.0, 3.8])
    reused = probe_and_reuse(spec, method("streaming_int4"), full, 1000.0, tmp_path)
    assert calls == [5]  # first round + two periods of P = 2
    assert reused["reused_from"] == 100.0
    curve = Curve.from_dict(reused["curve"])
    assert curve.bpb == Curve.from_dict(full["curve"]).bpb
    assert curve.bytes_up == [10, 11, 12, 13, 14, 13, 14, 13]  # odd rounds: one fragment


def test_reuse_runs_in_full_when_the_probe_trained_otherwise_or_the_method_replans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks.geo_lm import probe_and_reuse

    full = _record("diloco", 100.0, [6.0, 5.0, 4.5, 4.0], 7, 2.0)
    calls = _stub_runs(monkeypatch, [6.0, 5.0, 4.6])  # round 3 differs
    record = probe_and_reuse(SPEC, method("diloco"), full, 1000.0, tmp_path)
    assert calls == [3, None] and "reused_from" not in record
    assert record["reuse_refused"]["max_abs_diff_bpb"] == pytest.approx(0.1)
    calls.clear()
    probe_and_reuse(SPEC, method("partial_sync"), full, 1000.0, tmp_path)
    assert calls == [None]
    failed = probe_and_reuse(SPEC, method("diloco"), {"error": "boom"}, 1000.0, tmp_path)
    assert failed["error"] == "the full run failed: nothing to reuse"


def test_summary_keeps_points_at_the_same_token_counts_for_every_method() -> None:
    """Sync data parallel is evaluated every step; its curve keeps every H-th point, so its
    time to the target is read at the resolution DiLoCo's is."""
    report: dict[str, Any] = {
        "initial_bpb": 8.0,
        "tokens_per_round": {"sync_dp": 10, "diloco": 20},
        "eval_every": {"sync_dp": 2, "diloco": 1},
        "records": [
            _record("sync_dp", 100.0, [5.0, 4.0, 3.05, 3.0], 1000, 2.0),
            _record("diloco", 100.0, [4.0, 3.0], 100, 1.0),
        ],
    }
    rows = summarize(report, 3.06)["rows"]
    assert rows["sync_dp@100"]["points"]["tokens"] == [0.0, 20.0, 40.0]
    assert rows["sync_dp@100"]["points"]["bytes"] == [0.0, 4000.0, 8000.0]
    assert rows["sync_dp@100"]["time_to_target_s"] == pytest.approx(8.0)  # not round 3's 6.0
