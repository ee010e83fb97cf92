"""A tiny DiLoCo run of the geo_lm example end to end: ``geofl simulate`` on the virtual clock.

Two rounds of two inner AdamW steps on four sites in three regions, int8 outer
pseudo-gradients with error feedback: the run must exit 0, commit both rounds with every
site, record the server's validation bits per byte below the initial model's, and leave
each site's AdamW state (four steps) in its state directory.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open
from sqlalchemy import select

from geofl.storage import open_database
from geofl.storage.models import Participation, Round

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 600  # a safety net against a hung run, not a timing assertion

pytestmark = pytest.mark.e2e


def test_tiny_diloco_run_of_the_example(tmp_path: Path) -> None:
    sets = {
        "run.rounds": "2",
        "schedule.diloco.local_steps": "2",
        "round_config.batch_size": "2",
        "storage.url": f"sqlite:///{tmp_path / 'run.db'}",
        "storage.checkpoints": str(tmp_path / "checkpoints"),
        "simulation.node_config.state-dir": str(tmp_path / "state"),
    }
    args = [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]
    command = [sys.executable, "-m", "geofl.server.cli.main", "simulate"]
    done = subprocess.run(
        [*command, "-c", "examples/geo_lm/run.yaml", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    db = open_database(sets["storage.url"])
    try:
        with db.session() as session:
            rounds = list(session.scalars(select(Round).order_by(Round.number)))
            fits = list(session.scalars(select(Participation).where(Participation.kind == "fit")))
    finally:
        db.close()
    assert [r.status for r in rounds] == ["committed", "committed"]
    assert len(fits) == 8 and all(p.status == "ok" for p in fits)
    assert all(p.bytes_up < p.bytes_up_raw for p in fits)  # int8 uploads
    bpb = [float(r.server_eval_metrics["bpb"]) for r in rounds]
    assert bpb[1] < bpb[0] < 8.0  # 8 bits per byte is a uniform guess
    for site in range(4):
        path = tmp_path / "state" / f"site-{site}.adamw.safetensors"
        with safe_open(str(path), framework="pt") as handle:
            assert handle.metadata()["round"] == "2"
            assert float(handle.get_tensor("embed.weight.step")[0]) == 4.0
