"""Measured links drive selection and codecs (virtual clock: exact, fast, deterministic).

Two regions: ``near`` clients finish a round in ~0.15 s, ``far`` ones need > 1 s. After a
first round that measures everyone, deadline-aware selection keeps only clients predicted
to finish in time; a deadline nobody can meet falls back to the fastest, recorded; and
adaptive compression gives slow uplinks a lossier chain.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import select

from geofl.server.simulation.virtual import run_virtual_simulation
from geofl.storage import open_database
from geofl.storage.models import Event, Node, NodeMeasurement, Participation, Round
from tests.integration.test_virtual_clock import _virtual

MODEL = "geofl_testapp:make_medium_model"  # 40 kB: transfers dominate
REGIONS = {
    "near": {"share": 0.5, "rtt_ms": 20, "up_mbps": 40, "down_mbps": 80},
    "far": {"share": 0.5, "rtt_ms": 300, "up_mbps": 0.25, "down_mbps": 1},
}


def _config(tmp_path: Path, **overrides: Any) -> Any:
    schedule = {"deadline_s": 5.0, "wait_for_clients_s": 5}
    schedule.update(overrides.pop("schedule", {}))
    return _virtual(
        tmp_path,
        model=MODEL,
        run={"name": "wan", "rounds": 3, "seed": 2},
        # Everyone is selected in round 1, so everyone is measured once.
        strategy={"name": "fedavg", "clients_per_round": 8, "min_clients": 2},
        schedule=schedule,
        simulation={"clients": 8, "regions": REGIONS},
        **overrides,
    )


def _fits_by_round(url: str) -> dict[int, list[tuple[str, str, int]]]:
    db = open_database(url)
    try:
        with db.session() as session:
            rows = session.execute(
                select(Round.number, Node.region, Participation.status, Participation.bytes_up)
                .join(Participation, Participation.round_id == Round.id)
                .join(Node, Participation.node_id == Node.id)
                .where(Participation.kind == "fit")
            ).all()
    finally:
        db.close()
    out: dict[int, list[tuple[str, str, int]]] = {}
    for number, region, status, bytes_up in rows:
        out.setdefault(number, []).append((region, status, bytes_up))
    return out


def _events(url: str) -> list[Event]:
    db = open_database(url)
    try:
        with db.session() as session:
            events = list(session.scalars(select(Event).where(Event.kind == "round.plan")))
            session.expunge_all()
            return events
    finally:
        db.close()


def test_measurements_are_recorded_every_round(tmp_path: Path) -> None:
    config = _config(tmp_path)
    run_virtual_simulation(config)
    db = open_database(config.storage.url)
    try:
        with db.session() as session:
            rows = list(session.scalars(select(NodeMeasurement)))
            regions = {i: r for i, r in session.execute(select(Node.id, Node.region))}
    finally:
        db.close()
    assert rows, "no link measurements recorded"
    far = [r.up_bps for r in rows if regions[r.node_id] == "far" and r.up_bps]
    near = [r.up_bps for r in rows if regions[r.node_id] == "near" and r.up_bps]
    # Effective rates include latency, so they are below the configured rates, but the
    # two regions are told apart by more than an order of magnitude.
    assert far and near and max(far) < 0.25e6 * 1.01 and min(near) > 10 * max(far)


def test_deadline_policy_drops_predicted_stragglers_after_measuring(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        schedule={"deadline_s": 1.0, "selection": {"policy": "deadline", "exploration": 0.0}},
    )
    run_virtual_simulation(config)
    fits = _fits_by_round(config.storage.url)
    # Round 1 knows nobody: all are tried, the far ones are late.
    assert {(region, status) for region, status, _ in fits[1]} == {("near", "ok"), ("far", "late")}
    # From round 2 on only near clients, predicted in time, are chosen, and all succeed.
    for number in (2, 3):
        assert {region for region, _, _ in fits[number]} == {"near"}
        assert all(status == "ok" for _, status, _ in fits[number])
    plans = _events(config.storage.url)
    assert [e.round for e in plans] == [1, 2, 3]
    assert all(e.data["predicted_s"] for e in plans[1:])


def test_impossible_deadline_falls_back_to_fastest_and_says_so(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        schedule={"deadline_s": 0.01, "selection": {"policy": "deadline", "exploration": 0.0}},
    )
    run_virtual_simulation(config)
    plans = _events(config.storage.url)
    later = [e for e in plans if e.round and e.round > 1]
    assert later and all(e.data["fallback"] for e in later)
    assert all("no client is predicted to finish within the deadline" in e.message for e in later)


def test_adaptive_compression_shrinks_slow_uplinks_only(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        schedule={"deadline_s": 1.0},
        compression={"adaptive": True, "min_bytes": 0},
    )
    run_virtual_simulation(config)
    fits = _fits_by_round(config.storage.url)
    raw = 40_012
    later = [f for number in (2, 3) for f in fits[number]]
    near = [bytes_up for region, _, bytes_up in later if region == "near"]
    far = [bytes_up for region, _, bytes_up in later if region == "far"]
    assert near and all(b >= raw for b in near)  # fast links stay lossless
    assert far and all(b < raw / 4 for b in far)  # 0.25 Mbit/s cannot carry 40 kB in time
