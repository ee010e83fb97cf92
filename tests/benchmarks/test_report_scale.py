"""The report benchmark builds the run it claims to and measures both commands on it."""

from __future__ import annotations

from pathlib import Path

from benchmarks.report_scale import build_run, measure
from geofl.storage import open_database, queries


def test_a_small_run_is_built_and_measured(tmp_path: Path) -> None:
    with open_database(f"sqlite:///{tmp_path / 'run.db'}") as db:
        run_id = build_run(db, rounds=3, clients=6)
        with db.session() as session:
            detail = queries.run_detail(session, run_id)
        assert [r.status for r in detail.rounds] == ["committed"] * 3
        assert len(detail.participations) == 18  # every client, every round
        assert {p.node_region for p in detail.participations} == {"eu-west", "us-east", "ap-south"}
        result = measure(db, run_id, tmp_path / "out")
    assert result["participations"] == 18
    assert (tmp_path / "out" / "report" / "report.html").stat().st_size == result["report_bytes"]
