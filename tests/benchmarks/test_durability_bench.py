"""The durability benchmark's staging cost runs against the current staging API."""

from __future__ import annotations

from pathlib import Path

from benchmarks.durability import PHASES, phase_reached, stage_cost


def test_stage_cost_stages_and_times_each_update(tmp_path: Path) -> None:
    cost = stage_cost(params=256, repeats=2, work=tmp_path)
    assert cost["bytes"] == 1024 and cost["repeats"] == 2
    assert 0 <= cost["stage_median_s"] <= cost["stage_max_s"]
    # Each staged update is a file under the checkpoints' staged folder.
    assert len(list((tmp_path / "checkpoints" / "staged").glob("*.safetensors"))) == 2


def test_a_phase_is_reached_by_its_round_state() -> None:
    assert PHASES == ("broadcast", "fit", "aggregate", "commit")
    assert phase_reached("fit", ("fit", 2, 0)) and not phase_reached("fit", ("fit", 1, 0))
    assert phase_reached("commit", ("commit", 4, 0)) and not phase_reached(
        "commit", ("aggregate", 4, 0)
    )
    assert phase_reached("broadcast", ("select", 0, 1))  # already committed: too late, stop
