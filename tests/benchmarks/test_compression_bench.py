"""Unit tests of the compression benchmark's pure helpers (no training, no processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.compression import (
    CONFIGS,
    EXTRA_CONFIGS,
    CodecConfig,
    check_targets,
    overrides,
    plot,
    rounds_to_reach,
    summarize,
)
from geofl.protocols.codecs import CodecError


def _sets(args: list[str]) -> dict[str, Any]:
    """``--set K=V`` pairs parsed the way geofl parses them (V as YAML)."""
    assert args[::2] == ["--set"] * (len(args) // 2)
    pairs = (item.split("=", 1) for item in args[1::2])
    return {key: yaml.safe_load(value) for key, value in pairs}


def _round(number: int, accuracy: float | None, up: int, raw: int) -> dict[str, Any]:
    metrics = {} if accuracy is None else {"accuracy": accuracy}
    return {
        "number": number,
        "status": "committed",
        "bytes_up": up,
        "bytes_up_raw": raw,
        "server_eval_metrics": metrics,
        "num_succeeded": 10,
        "duration_s": 1.0,
    }


def _result(per_round: float, final: float) -> dict[str, Any]:
    return {"bytes_up_per_round": per_round, "final_accuracy": final}


def test_configs_are_the_issue_list_and_parse() -> None:
    assert list(CONFIGS) == [
        "none", "fp16", "int8", "int4", "topk1%+ef", "topk0.1%+ef", "powersgd4+ef"
    ]  # fmt: skip
    assert [label for label, c in CONFIGS.items() if c.error_feedback] == [
        "topk1%+ef", "topk0.1%+ef", "powersgd4+ef"
    ]  # fmt: skip
    for label, config in (*CONFIGS.items(), *EXTRA_CONFIGS.items()):
        assert "," not in label  # --configs is comma-separated
        overrides(config, 1, 1, Path("workdir"))  # raises on an invalid chain


def test_overrides_round_trip_through_yaml(tmp_path: Path) -> None:
    sets = _sets(overrides(CONFIGS["topk0.1%+ef"], 15, 10, tmp_path, max_train_samples=500))
    assert sets["compression.up"] == [{"topk": {"ratio": 0.001}}]
    assert sets["compression.down"] == []
    assert sets["compression.error_feedback"] is True
    assert "compression.min_bytes" not in sets
    assert sets["run.rounds"] == 15
    assert sets["simulation.clients"] == sets["strategy.clients_per_round"] == 10
    assert sets["strategy.min_clients"] == 10
    assert sets["evaluation.every"] == 0
    assert sets["storage.url"] == f"sqlite:///{(tmp_path / 'run.db').resolve()}"
    assert sets["storage.checkpoints"] == str((tmp_path / "checkpoints").resolve())
    assert sets["simulation.node_config.max-train-samples"] == 500


def test_overrides_none_and_min_bytes(tmp_path: Path) -> None:
    plain = _sets(overrides(CONFIGS["none"], 3, 4, tmp_path))
    assert plain["compression.up"] == [] and plain["compression.error_feedback"] is False
    assert "simulation.node_config.max-train-samples" not in plain
    sets = _sets(overrides(EXTRA_CONFIGS["topk1%+ef-min0"], 3, 4, tmp_path))
    assert sets["compression.min_bytes"] == 0


def test_overrides_reject_an_invalid_chain(tmp_path: Path) -> None:
    with pytest.raises(CodecError):
        overrides(CodecConfig([{"topk": {"ratio": 2.0}}], True, "topk1%"), 1, 1, tmp_path)
    with pytest.raises(CodecError):
        overrides(CodecConfig(["zstd"], False, "none"), 1, 1, tmp_path)


def test_rounds_to_reach_examples() -> None:
    assert rounds_to_reach([0.4, 0.849, 0.85, 0.7, 0.9], 0.85) == 3
    assert rounds_to_reach([0.9], 0.85) == 1
    assert rounds_to_reach([None, 0.86], 0.85) == 2
    assert rounds_to_reach([0.1, None, 0.84], 0.85) is None
    assert rounds_to_reach([], 0.85) is None


@given(st.lists(st.one_of(st.none(), st.floats(0, 1)), max_size=30), st.floats(0, 1))
def test_rounds_to_reach_is_the_first_hit(accs: list[float | None], target: float) -> None:
    found = rounds_to_reach(accs, target)
    hits = [i + 1 for i, a in enumerate(accs) if a is not None and a >= target]
    assert found == (hits[0] if hits else None)


def test_summarize_sorts_accumulates_and_finds_target() -> None:
    run = {
        "rounds": [
            _round(3, 0.87, 100, 1000),
            _round(1, 0.40, 300, 1000),
            _round(2, 0.86, 100, 1000),
        ]
    }
    summary = summarize(run, target=0.85)
    assert [row["round"] for row in summary["rounds"]] == [1, 2, 3]
    assert [row["cum_bytes_up"] for row in summary["rounds"]] == [300, 400, 500]
    assert summary["bytes_up_per_round"] == pytest.approx(500 / 3)
    assert summary["bytes_up_raw_per_round"] == pytest.approx(1000)
    assert summary["ratio"] == pytest.approx(6.0)
    assert summary["final_accuracy"] == 0.87
    assert summary["rounds_to_target"] == 2


def test_summarize_without_accuracy_or_rounds() -> None:
    summary = summarize({"rounds": [_round(1, None, 0, 0)]})
    assert summary["final_accuracy"] is None and summary["ratio"] is None
    assert summary["rounds_to_target"] is None
    empty = summarize({"rounds": []})
    assert empty["rounds"] == [] and empty["bytes_up_per_round"] == 0.0


def test_check_targets_bytes_accuracy_and_throughput() -> None:
    configs = {
        "none": _result(1000.0, 0.880),
        "topk0.1%+ef": _result(10.0, 0.875),  # 100x, -0.5 pp: met
        "topk1%+ef": _result(40.0, 0.880),  # 25x: not met
        "int4": _result(130.0, 0.860),  # 7.7x, -2 pp: not met
        "powersgd4+ef": {"error": "geofl simulate exited 1"},
    }
    throughput = {"qsgd4": {"roundtrip_mb_s": 150.0}, "topk0.1%": {"roundtrip_mb_s": 50.0}}
    targets = check_targets(configs, throughput)
    assert targets["topk0.1%+ef"]["bytes_and_accuracy_met"] is True
    assert targets["topk0.1%+ef"]["reduction_vs_none"] == pytest.approx(100.0)
    assert targets["topk0.1%+ef"]["accuracy_loss_pp"] == pytest.approx(0.5)
    assert "throughput_met" not in targets["topk0.1%+ef"]  # not a quantizer
    assert targets["topk1%+ef"]["bytes_and_accuracy_met"] is False
    assert targets["int4"]["bytes_and_accuracy_met"] is False
    assert targets["int4"]["throughput_met"] is False
    assert targets["powersgd4+ef"] == {}
    assert targets["none"]["reduction_vs_none"] == pytest.approx(1.0)


def test_check_targets_without_a_baseline() -> None:
    targets = check_targets({"fp16": _result(500.0, 0.88)}, {"fp16": {"roundtrip_mb_s": 582.0}})
    assert targets == {"fp16": {"throughput_met": True}}


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows = summarize({"rounds": [_round(1, 0.5, 10, 20), _round(2, 0.86, 10, 20)]})
    path = tmp_path / "plot.png"
    plot({"none": rows, "bad": {"error": "x"}}, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
