"""One attacker among honest clients over real gRPC: FedAvg is moved, robust rules are not.

Every honest client of the test app adds ``1 + partition`` to the float weights; the
attacker (the last partition) adds that times 10^6, a finite update that passes every
check. One round from zero weights, so the committed ``w`` is the round's aggregate.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from geofl.server.cli.main import main as geofl_main
from geofl.server.simulation.virtual import run_virtual_simulation

from .conftest import final_weights, link_model, run_config, run_rows, virtual_run_config

ATTACK = 1e6


def attacked_run(tmp_path: Path, serve: Any, clients: int, robust: dict[str, Any] | None) -> Any:
    strategy: dict[str, Any] = {"clients_per_round": clients, "min_clients": clients}
    if robust is not None:
        strategy["robust"] = robust
    config = run_config(
        tmp_path, run={"name": "attacked", "rounds": 1, "seed": 1}, strategy=strategy
    )
    handle = serve(config)
    for partition in range(clients - 1):
        handle.add_client(partition)
    handle.add_client(clients - 1, behaviour="scaled", scale=ATTACK)
    result = handle.wait(timeout=90)
    assert result.status == "completed", result
    return config


def fit_participations(config: Any) -> dict[str, tuple[str, str | None]]:
    _, _, pairs = run_rows(config)
    return {node.name: (p.status, p.reason) for p, node in pairs if p.kind == "fit"}


def test_fedavg_is_moved_wherever_the_attacker_likes(tmp_path: Path, serve: Any) -> None:
    config = attacked_run(tmp_path, serve, 4, None)
    w = final_weights(config)["w"]
    assert float(w.min()) > 1e5  # the attacker's 40 of 100 examples times 4e6
    assert all(reason is None for _, reason in fit_participations(config).values())


@pytest.mark.parametrize(
    ("robust", "expected", "attacker_reason"),
    [
        ({"name": "median", "byzantine": 1}, 2.5, "median: not a middle value in "),
        (
            {"name": "trimmed_mean", "byzantine": 1},
            2.5,
            "trimmed_mean: cut as one of the 1 largest or smallest values in ",
        ),
        ({"name": "clip", "clip_norm": 5.0}, None, "clip: norm 1.549e+07 over the clip norm 5"),
        (
            {"name": "centered_clip", "radius": 5.0, "iterations": 3, "byzantine": 1},
            None,
            "centered_clip: ",
        ),
    ],
)
def test_a_robust_rule_keeps_the_model_near_the_honest_mean(
    tmp_path: Path,
    serve: Any,
    robust: dict[str, Any],
    expected: float | None,
    attacker_reason: str,
) -> None:
    config = attacked_run(tmp_path, serve, 4, robust)
    w = final_weights(config)["w"]
    honest_mean = 2.0  # of the honest deltas 1, 2, 3
    assert float(np.abs(w - honest_mean).max()) <= 1.0, w
    if expected is not None:
        np.testing.assert_allclose(w, expected)
    status, reason = fit_participations(config)["node-3"]
    assert status == "ok"  # cut down, but used
    assert reason is not None and reason.startswith(attacker_reason), reason
    share = re.search(r"in (\d+)% of coordinates", reason)
    if share is not None:  # every float coordinate; the tied integer counter may go either way
        assert int(share.group(1)) >= 15 * 100 // 16, reason


def test_krum_leaves_the_attacker_out_and_runs_show_says_why(
    tmp_path: Path, serve: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config = attacked_run(tmp_path, serve, 5, {"name": "krum", "byzantine": 1})
    w = final_weights(config)["w"]
    assert float(w.min()) >= 1.0 and float(w.max()) <= 4.0  # one honest update, as sent
    participations = fit_participations(config)
    status, reason = participations["node-4"]
    assert status == "rejected"
    assert reason is not None and reason.startswith("krum: not selected"), reason
    assert sum(status == "ok" for status, _ in participations.values()) == 1
    assert geofl_main(["runs", "show", "1", "--db", config.storage.url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    rows = {p["node_name"]: p for p in shown["participations"] if p["kind"] == "fit"}
    assert rows["node-4"]["status"] == "rejected"
    assert rows["node-4"]["reason"].startswith("krum: not selected")
    assert shown["rounds"][0]["num_succeeded"] == 1


def test_multi_krum_on_the_virtual_clock(tmp_path: Path) -> None:
    """Eight simulated clients, one scaled by 10^6, two rounds: Multi-Krum averages the
    seven honest shifts 1..7 each round, and the attacker is rejected every round."""
    config = virtual_run_config(
        tmp_path,
        8,
        node_config={"scaled-ids": "7", "scale": ATTACK},
        run={"name": "virtual-attack", "rounds": 2, "seed": 3},
        strategy={
            "clients_per_round": 8,
            "min_clients": 8,
            "robust": {"name": "multi_krum", "byzantine": 1},
        },
    )
    outcome = run_virtual_simulation(config)
    assert outcome.result.status == "completed"
    np.testing.assert_allclose(final_weights(config)["w"], 2 * 4.0)  # mean of 1..7, twice
    _, _, pairs = run_rows(config)
    attacker = [p for p, node in pairs if p.kind == "fit" and node.name == "sim-7"]
    assert len(attacker) == 2
    assert all(p.status == "rejected" for p in attacker)
    assert all((p.reason or "").startswith("multi_krum: not selected") for p in attacker)


THREE_REGIONS = {
    "near": {"share": 0.25, "rtt_ms": 20, "up_mbps": 8, "down_mbps": 40},
    "mid": {"share": 0.25, "rtt_ms": 80, "up_mbps": 2, "down_mbps": 10},
    "far": {"share": 0.5, "rtt_ms": 200, "up_mbps": 0.5, "down_mbps": 2},
}


def test_a_rule_at_the_coordinator_runs_among_regions(tmp_path: Path) -> None:
    """Three relays; one client of the far region is scaled by 10^6, which poisons that
    region's FedAvg. The coordinator's median of the three regional updates ignores it."""

    def relayed(node_config: dict[str, Any]) -> Any:
        return virtual_run_config(
            tmp_path,
            8,
            node_config=node_config,
            simulation={"relays": True, "regions": THREE_REGIONS},
            run={"name": "relayed-attack", "rounds": 1, "seed": 1},
            strategy={
                "clients_per_round": 3,
                "min_clients": 3,
                "robust": {"name": "median", "byzantine": 1},
            },
        )

    links = link_model(relayed({}))
    attacker = links.clients_in("far")[0]
    config = relayed({"scaled-ids": str(attacker), "scale": ATTACK})
    outcome = run_virtual_simulation(config)
    assert outcome.result.status == "completed"
    near, mid = (np.mean([1 + c for c in links.clients_in(r)]) for r in ("near", "mid"))
    np.testing.assert_allclose(final_weights(config)["w"], max(near, mid), rtol=1e-6)
    _, _, pairs = run_rows(config)
    reasons = {node.name: p.reason for p, node in pairs if p.kind == "fit" and node.region == "far"}
    assert any((r or "").startswith("median: not a middle value") for r in reasons.values())


def test_a_regional_rule_runs_within_each_region(tmp_path: Path) -> None:
    """The same poisoned far region, now with a median in every relay's regional round
    (``simulation.relay.robust``) and plain FedAvg among the regions."""

    def relayed(node_config: dict[str, Any]) -> Any:
        return virtual_run_config(
            tmp_path,
            8,
            node_config=node_config,
            simulation={
                "relays": True,
                "regions": THREE_REGIONS,
                "relay": {"min_clients": 1, "robust": {"name": "median", "byzantine": 0}},
            },
            run={"name": "regional-median", "rounds": 1, "seed": 1},
            strategy={"clients_per_round": 3, "min_clients": 3},
        )

    links = link_model(relayed({}))
    far = sorted(links.clients_in("far"))
    assert len(far) >= 3, far  # the median of the far region needs an honest majority
    config = relayed({"scaled-ids": str(far[0]), "scale": ATTACK})
    outcome = run_virtual_simulation(config)
    assert outcome.result.status == "completed"
    shifts = {r: [1.0 + c for c in links.clients_in(r)] for r in ("near", "mid", "far")}
    shifts["far"][shifts["far"].index(1.0 + far[0])] *= ATTACK
    regional = {r: float(np.median(values)) for r, values in shifts.items()}
    examples = {r: 100 * len(values) for r, values in shifts.items()}  # FedAvg among regions
    expected = sum(regional[r] * examples[r] for r in regional) / sum(examples.values())
    np.testing.assert_allclose(final_weights(config)["w"], expected, rtol=1e-5)
    assert float(final_weights(config)["w"].max()) < 10.0
