"""Tests of the WAN-scheduling benchmark: its configurations, the link-model arithmetic
behind Flower's computed round times, curves and verdict, the paced client, the wall-vs-
virtual comparison, and one tiny real run of geofl (virtual clock) and of Flower 1.42
(6 clients, 3 per round, 2 rounds; about half a minute, most of it Ray's start-up)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from tests.benchmarks.conftest import import_fashion_example

import_fashion_example()
from benchmarks import wan_schedule as wan  # noqa: E402
from benchmarks.apps import wan_fashion  # noqa: E402
from benchmarks.wan_schedule_runs import (  # noqa: E402
    Curve,
    flower_curve,
    flower_round_s,
    read_geofl_curve,
)
from benchmarks.wan_schedule_wall import compare_runs  # noqa: E402
from examples.fashion_mnist import data as fmnist_data  # noqa: E402
from geofl.client.app import Client  # noqa: E402
from geofl.protocols.types import Config, Metrics, Weights, WeightsView  # noqa: E402
from geofl.server.config import parse_config  # noqa: E402
from geofl.server.config.models import SimulationConfig  # noqa: E402
from geofl.server.simulation.links import ClientLink, LinkModel  # noqa: E402
from geofl.storage import open_database  # noqa: E402
from geofl.storage.models import Node, Participation, Round  # noqa: E402

needs_fmnist = pytest.mark.skipif(
    os.environ.get("GEOFL_REQUIRE_FMNIST") != "1"
    and not all(
        (fmnist_data.data_dir() / name).is_file()
        for pair in fmnist_data._FILES.values()
        for name in pair
    ),
    reason="needs the Debian package dataset-fashion-mnist",
)
TINY = wan.WanSpec(
    clients=6, per_round=3, min_clients=2, rounds=2, max_train_samples=32, workers=0, timeout_s=240
)


def _links(spec: wan.WanSpec) -> tuple[ClientLink, ...]:
    section = SimulationConfig.model_validate(wan.simulation_section(spec))
    return LinkModel.from_config(section, spec.seed).links


# ---------------------------------------------------------------- configurations


@pytest.mark.parametrize("name", [s.name for s in wan.SCENARIOS if s.system == "geofl"])
def test_every_geofl_configuration_is_a_valid_run_file(name: str, tmp_path: Path) -> None:
    spec = wan.WanSpec()
    sections = wan.scenario(name).sections
    assert sections is not None
    config = parse_config(
        wan.geofl_config(spec, sections(spec, wan.Deadlines(4.0, 5.0)), tmp_path, tmp_path / "p"),
        "test",
    )
    # The workload is the same in every configuration; only their own sections differ.
    assert config.simulation.clock == "virtual" and config.simulation.clients == 100
    assert set(config.simulation.regions) == {"near", "mid", "far"}
    per_round = 3 if name == "relays" else 20  # with relays the coordinator's nodes are relays
    assert config.strategy.clients_per_round == per_round and config.run.seed == spec.seed
    assert config.evaluation.server is not None and config.evaluation_clients == 0
    schedule = config.schedule
    modes = {"fedbuff": "async"} | dict.fromkeys(
        (
            "diloco",
            "diloco-deadline",
            "diloco-deadline-utility",
            "diloco-partial",
            "diloco-partial-deadline",
        ),
        "diloco",
    )
    assert schedule.mode == modes.get(name, "sync")
    assert schedule.partial_sync.enabled is name.startswith("diloco-partial")
    if schedule.partial_sync.enabled:
        assert schedule.partial_sync.sync_points == spec.sync_points
    # Rounds of epochs get the epochs' deadline, DiLoCo's rounds of steps their own.
    deadlines = {
        "deadline": 4.0,
        "adaptive": 4.0,
        "relays": 4.0,
        "diloco-deadline": 5.0,
        "diloco-deadline-utility": 5.0,
        "diloco-partial-deadline": 5.0,
    }
    assert (schedule.selection.policy == "deadline") is (name in deadlines)
    assert schedule.deadline_s == deadlines.get(name, wan.NO_DEADLINE_S)
    assert config.compression.adaptive is (name == "adaptive")
    assert schedule.selection.utility is (name == "diloco-deadline-utility")
    if name == "fedbuff":
        # As many client updates as the synchronous runs apply: 80 rounds x 20 / K.
        assert schedule.fedbuff.updates == 160 and schedule.fedbuff.buffer_size == 10


def test_the_relays_row_makes_the_relays_the_coordinators_nodes(tmp_path: Path) -> None:
    spec = wan.WanSpec()
    sections = wan.scenario("relays").sections
    assert sections is not None
    config = parse_config(
        wan.geofl_config(spec, sections(spec, wan.Deadlines(4.0, 5.0)), tmp_path, tmp_path / "p"),
        "test",
    )
    assert config.simulation.relays and config.simulation.relay.cohort == spec.per_round
    assert config.strategy.clients_per_round == len(wan.REGIONS) == 3
    assert config.schedule.selection.policy == "deadline" and config.schedule.deadline_s == 4.0
    assert all(s.system != "unavailable" for s in wan.SCENARIOS)


def test_predicted_rounds_charge_epochs_over_shares_or_fixed_steps() -> None:
    spec, links = wan.WanSpec(), _links(wan.WanSpec())
    shares = list(range(100, 200))
    by_epochs = wan.predicted_round_s(spec, shares, 1000)
    by_steps = wan.predicted_round_s(spec, shares, 1000, steps=20)
    assert by_epochs[7] == pytest.approx(links[7].round_s(1000, 1000, 107))
    assert by_steps[7] == pytest.approx(links[7].round_s(1000, 1000, 20 * spec.batch_size))


def test_deadline_lets_the_chosen_quantile_of_clients_fit() -> None:
    predicted = [float(t) for t in range(1, 11)]
    deadline = wan.deadline_for(wan.WanSpec(deadline_quantile=0.5), predicted)
    fits = [t for t in predicted if t <= 0.9 * deadline]  # the selection's default margin
    assert len(fits) == 5
    assert wan.deadline_for(wan.WanSpec(deadline_s=2.5), predicted) == 2.5


def test_deep_merge_merges_mappings_and_leaves_inputs_alone() -> None:
    base = {"a": {"b": 1, "c": 2}, "d": 3}
    merged = wan.deep_merge(base, {"a": {"c": 9}, "e": 4})
    assert merged == {"a": {"b": 1, "c": 9}, "d": 3, "e": 4}
    assert base == {"a": {"b": 1, "c": 2}, "d": 3}


# ---------------------------------------------------------------- link-model arithmetic


def test_flower_round_is_the_slowest_clients_download_compute_and_upload() -> None:
    links = _links(wan.WanSpec())
    nbytes, clients = 400_000, [(3, 500), (17, 100), (42, 900)]
    expected = max(
        links[i].fetch_s(nbytes) + samples / links[i].samples_per_s + links[i].upload_s(nbytes)
        for i, samples in clients
    )
    assert flower_round_s(links, nbytes, clients) == pytest.approx(expected)
    with pytest.raises(ValueError, match="at least one client"):
        flower_round_s(links, nbytes, [])


def test_flower_curve_accumulates_computed_round_times_and_bytes() -> None:
    links = _links(wan.WanSpec())
    events = [
        {"event": "server_eval", "round": 0, "accuracy": 0.1},
        {"event": "round_replies", "round": 2, "clients": [[5, 300]], "errors": 0},
        {"event": "round_replies", "round": 1, "clients": [[1, 200], [2, 100]], "errors": 0},
        {"event": "server_eval", "round": 1, "accuracy": 0.5},
        {"event": "server_eval", "round": 2, "accuracy": 0.7},
    ]
    curve = flower_curve(events, links, 1000)
    first = flower_round_s(links, 1000, [(1, 200), (2, 100)])
    assert curve.rounds == [1, 2] and curve.accuracy == [0.5, 0.7]
    assert curve.times == pytest.approx([first, first + flower_round_s(links, 1000, [(5, 300)])])
    assert curve.bytes_up == curve.bytes_down == [2000, 1000]


def test_curve_summary_reads_time_rounds_and_bytes_to_the_target() -> None:
    curve = Curve()
    for number, (t, accuracy) in enumerate([(2.0, 0.6), (5.0, None), (7.0, 0.86), (9.0, 0.84)]):
        curve.add(number + 1, t, accuracy, 10, 5, "committed" if accuracy else "failed")
    row = curve.summary(0.85, window=2)
    assert row["time_to_target_s"] == 7.0 and row["rounds_to_target"] == 3
    assert row["time_to_target_held_s"] is None  # 0.86 then 0.84: not held for two
    assert curve.summary(0.6, window=2)["time_to_target_held_s"] == 2.0  # skips round 2
    assert row["bytes_to_target"] == 45 and row["bytes_total"] == 60
    assert row["final_accuracy"] == pytest.approx(0.85) and row["last_accuracy"] == 0.84
    assert row["best_accuracy"] == 0.86 and row["failed_rounds"] == 1
    assert curve.summary(0.9, window=2)["time_to_target_s"] is None
    assert Curve.from_dict(json.loads(json.dumps(curve.as_dict()))) == curve
    assert curve.points(0.1) == ([0.0, 2.0, 7.0, 9.0], [0.1, 0.6, 0.86, 0.84])


def _record(name: str, system: str, times: list[float], accuracy: list[float]) -> dict[str, Any]:
    curve = Curve()
    for number, (t, value) in enumerate(zip(times, accuracy, strict=True)):
        curve.add(number + 1, t, value, 1, 1)
    return {"name": name, "label": name, "system": system, "available": True, "curve": curve}


def _records(best_final: float) -> list[dict[str, Any]]:
    records = [
        _record("fedavg", "geofl", [10, 20, 30], [0.8, 0.86, 0.87]),
        _record("flower", "flower", [1, 2, 3], [0.86, 0.87, 0.88]),
        _record("deadline", "geofl", [2, 4, 6], [0.86, 0.86, best_final]),
        _record("diloco", "geofl", [3, 6, 9], [0.7, 0.9, 0.95]),
        {"name": "relays", "label": "r", "system": "unavailable", "available": False},
    ]
    for record in records:
        if "curve" in record:
            record["curve"] = record["curve"].as_dict()
    return records


def test_verdict_takes_the_soonest_geofl_configuration_within_a_point() -> None:
    summary = wan.summarize(_records(best_final=0.86), 0.85)
    rows = {row["name"]: row for row in summary["rows"]}
    assert rows["deadline"]["speedup"] == pytest.approx(10.0)
    assert rows["flower"]["speedup"] == pytest.approx(20.0)  # faster, but not geofl
    assert rows["relays"]["available"] is False and "speedup" in rows["relays"]
    verdict = summary["target"]
    assert verdict["best"] == "deadline" and verdict["met"] is True
    # 0.86 final against plain FedAvg's mean of its last three (0.8433): no loss at all.
    assert verdict["accuracy_drop"] == pytest.approx((0.8 + 0.86 + 0.87) / 3 - 0.86)
    # A sooner configuration that loses more than a point gives way to one that does not.
    lower = wan.summarize(_records(best_final=0.70), 0.85)["target"]
    assert lower["best"] == "diloco" and lower["met"] is False
    assert lower["speedup"] == pytest.approx(20 / 6)


# ---------------------------------------------------------------- wall clock


class _Trains(Client):
    """Reports ``examples`` trained, instantly."""

    def __init__(self, examples: int) -> None:
        self.examples = examples

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        return parameters, self.examples, {}


def test_paced_client_sleeps_out_the_modelled_compute_time() -> None:
    clock, slept = iter([10.0, 10.5]), list[float]()
    client = wan_fashion.PacedClient(
        _Trains(300), samples_per_s=100.0, clock=lambda: next(clock), sleep=slept.append
    )
    client.fit({}, {"local_epochs": 2})
    assert slept == [pytest.approx(600 / 100.0 - 0.5)]  # 300 examples x 2 epochs


def test_paced_client_is_not_slowed_when_training_took_longer() -> None:
    clock, slept = iter([0.0, 5.0]), list[float]()
    client = wan_fashion.PacedClient(
        _Trains(10), samples_per_s=100.0, clock=lambda: next(clock), sleep=slept.append
    )
    client.fit({}, {})
    assert slept == []


def test_speeds_file_must_list_positive_numbers(tmp_path: Path) -> None:
    path = tmp_path / "speeds.json"
    path.write_text(json.dumps([1.0, 0]))
    with pytest.raises(ValueError, match="positive numbers"):
        wan_fashion.read_speeds(str(path))


def test_wall_comparison_is_per_round_and_leaves_round_one_out_of_the_medians() -> None:
    def fit(region: str, seconds: float, status: str = "ok") -> dict[str, Any]:
        return {"status": status, "region": region, "duration_s": seconds}

    def rounds(durations: list[float], cohorts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"round": i + 1, "duration_s": d, "cohort": c}
            for i, (d, c) in enumerate(zip(durations, cohorts, strict=True))
        ]

    wall = rounds(
        [30.0, 4.0, 5.0, 2.0],
        [
            {"a": fit("far", 9.0)},
            {"a": fit("far", 4.0)},
            {"c": fit("near", 2.0)},
            {"d": fit("mid", 2.0, "late")},
        ],
    )
    virtual = rounds(
        [3.0, 4.4, 4.5, 2.0],
        [
            {"a": fit("far", 1.0)},
            {"a": fit("far", 4.4)},
            {"c": fit("near", 1.0), "e": fit("near", 1.0)},
            {"d": fit("mid", 2.0)},
        ],
    )
    result = compare_runs(wall, virtual)
    assert [r["error"] for r in result["per_round"]] == pytest.approx([-0.9, 0.1, -0.1, 0.0])
    assert result["median_abs_error"] == pytest.approx(0.1)
    assert result["total_s"] == pytest.approx({"wall": 11.0, "virtual": 10.9})
    assert result["same_cohorts"] == 2 and result["rounds_compared"] == 3
    # Round 1 is left out; a client is compared with itself in the same round, and only
    # where it succeeded on both clocks.
    fits = result["fits_by_region"]
    assert set(fits) == {"far", "near"}
    assert fits["far"] == pytest.approx(
        {"fits": 1, "wall_s": 4.0, "virtual_s": 4.4, "median_error": 0.1}
    )
    assert fits["near"]["median_error"] == pytest.approx(-0.5) and fits["near"]["fits"] == 1


# ---------------------------------------------------------------- real runs


def _fits(url: str) -> dict[int, list[tuple[int, int]]]:
    """Each round's fit participants as (client index, trained samples)."""
    db = open_database(url)
    try:
        with db.session() as session:
            rows = session.execute(
                select(Round.number, Node.name, Participation.num_examples)
                .join(Participation, Participation.round_id == Round.id)
                .join(Node, Participation.node_id == Node.id)
                .where(Participation.kind == "fit", Participation.status == "ok")
            ).all()
    finally:
        db.close()
    out: dict[int, list[tuple[int, int]]] = {}
    for number, name, examples in rows:
        out.setdefault(number, []).append((int(name.removeprefix("sim-")), examples))
    return out


@pytest.mark.fmnist
@needs_fmnist
# Flower's CLI dependency typer imports a click helper that click deprecates.
@pytest.mark.filterwarnings("ignore::DeprecationWarning:typer")
def test_tiny_geofl_and_flower_runs_share_the_link_models_time_line(tmp_path: Path) -> None:
    setup = wan.prepare(TINY, tmp_path)
    assert 0.0 < setup.initial_accuracy < 0.3 and setup.deadlines.epochs_s > 0
    plain = wan.run_scenario(TINY, wan.scenario("fedavg"), setup, lock=False)
    assert plain.get("error") is None, plain.get("error")
    assert plain["child"]["status"] == "completed"
    curve = Curve.from_dict(plain["curve"])
    assert curve.rounds == [1, 2] and all(a is not None and a > 0.1 for a in curve.accuracy)
    # geofl's virtual round equals the link-model formula Flower's rounds are computed with,
    # applied to geofl's own cohort (to within the wire header's bytes).
    links = _links(TINY)
    fits = _fits(f"sqlite:///{tmp_path / 'fedavg' / 'run.db'}")
    durations = np.diff([0.0, *curve.times])
    for number, duration in zip(curve.rounds, durations, strict=True):
        assert len(fits[number]) == TINY.per_round
        computed = flower_round_s(links, setup.nbytes, fits[number])
        assert duration == pytest.approx(computed, abs=1e-3)
    assert read_geofl_curve(f"sqlite:///{tmp_path / 'fedavg' / 'run.db'}") == curve

    flower = wan.run_scenario(TINY, wan.scenario("flower"), setup, lock=False)
    assert flower.get("error") is None, flower.get("error")
    replies = [e for e in flower["events"] if e["event"] == "round_replies"]
    assert [len(e["clients"]) for e in replies] == [TINY.per_round] * TINY.rounds
    assert all(
        0 < samples <= TINY.max_train_samples for e in replies for _, samples in e["clients"]
    )
    flower_line = Curve.from_dict(flower["curve"])
    assert flower_line.rounds == [1, 2] and all(a is not None for a in flower_line.accuracy)
    assert flower_line.times[0] == pytest.approx(
        flower_round_s(links, setup.nbytes, replies[0]["clients"])
    )
    report = wan.build_report(TINY, setup, [plain, flower], None)
    assert "| Flower 1.42 FedAvg" in wan.render_markdown(report)
