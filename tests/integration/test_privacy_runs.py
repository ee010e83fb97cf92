"""Central DP over real gRPC on loopback: ε recorded per round, shown, and a budget that stops.

Three clients each add ``1 + partition`` to every float (norm ``(1 + p) sqrt(15)``), so
with ``clip_norm`` 1 every update is clipped, and its participation says so.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from geofl.server.cli.main import main as geofl_main
from geofl.server.config.errors import ConfigError
from geofl.server.coordinator import Coordinator
from geofl.server.privacy import RoundMechanism, Sampling, epsilon
from geofl.server.simulation.virtual import run_virtual_simulation
from geofl.storage import open_database, queries

from .conftest import final_weights, run_config, run_rows, virtual_run_config

CLIENTS = 3


def recorded_epsilons(config: Any) -> list[float | None]:
    db = open_database(config.storage.url)
    try:
        with db.session() as session:
            return [r.epsilon for r in queries.rounds_of(session, 1)]
    finally:
        db.close()


def private_run(tmp_path: Path, serve: Any, rounds: int, privacy: dict[str, Any]) -> Any:
    config = run_config(
        tmp_path,
        run={"name": "private", "rounds": rounds, "seed": 1},
        model="geofl_testapp:make_float_model",
        strategy={"clients_per_round": CLIENTS, "min_clients": CLIENTS},
        privacy=privacy,
    )
    handle = serve(config)
    for partition in range(CLIENTS):
        handle.add_client(partition)
    return config, handle.wait(timeout=90)


def test_epsilon_per_round_is_recorded_and_shown(
    tmp_path: Path, serve: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config, result = private_run(
        tmp_path, serve, 3, {"clip_norm": 1.0, "noise_multiplier": 1.5, "delta": 1e-5}
    )
    assert result.status == "completed", result
    _, _, pairs = run_rows(config)
    expected = [epsilon(RoundMechanism(1.5), n, 1e-5) for n in (1, 2, 3)]
    assert recorded_epsilons(config) == pytest.approx(expected)
    assert expected[0] < expected[1] < expected[2]
    reasons = [p.reason for p, _ in pairs if p.kind == "fit"]
    assert len(reasons) == 3 * CLIENTS
    assert all(r is not None and r.startswith("dp_gaussian: norm") for r in reasons), reasons

    assert geofl_main(["runs", "show", "1", "--db", config.storage.url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [r["epsilon"] for r in shown["rounds"]] == pytest.approx(expected)
    assert geofl_main(["runs", "show", "1", "--db", config.storage.url]) == 0
    table = capsys.readouterr().out
    assert "ε" in table and f"{expected[2]:.4g}" in table


def test_a_tight_target_stops_the_run_before_the_round_that_would_exceed_it(
    tmp_path: Path, serve: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    z = 2.0
    target = (epsilon(RoundMechanism(z), 2, 1e-5) + epsilon(RoundMechanism(z), 3, 1e-5)) / 2
    privacy = {"clip_norm": 1.0, "noise_multiplier": z, "target_epsilon": target}
    config, result = private_run(tmp_path, serve, 5, {**privacy, "on_budget": "stop"})
    assert result.status == "cancelled", result
    assert result.error is not None and result.error.startswith("privacy budget reached")
    run, rounds, _ = run_rows(config)
    assert run.last_committed_round == 2
    assert [r.number for r in rounds] == [1, 2]
    spent = recorded_epsilons(config)
    assert len(spent) == 2 and all(e is not None and e <= target for e in spent)
    assert geofl_main(["runs", "logs", "1", "--db", config.storage.url]) == 0
    assert "privacy.budget_reached" in capsys.readouterr().out


def test_a_model_with_an_integer_counter_is_refused_before_the_run(tmp_path: Path) -> None:
    config = run_config(tmp_path, privacy={"clip_norm": 1.0, "noise_multiplier": 1.0})
    with pytest.raises(ConfigError, match=r"\['steps'\] would be averaged without noise"):
        Coordinator(config, listen=False)


def test_the_same_target_refuses_to_start_by_default(tmp_path: Path) -> None:
    z = 2.0
    target = epsilon(RoundMechanism(z), 2, 1e-5) * 1.01
    with pytest.raises(ConfigError, match="only 2 rounds fit"):
        run_config(
            tmp_path,
            run={"name": "private", "rounds": 5},
            model="geofl_testapp:make_float_model",
            privacy={"clip_norm": 1.0, "noise_multiplier": z, "target_epsilon": target},
        )


def test_adaptive_clipping_with_sampling_on_the_virtual_clock(tmp_path: Path) -> None:
    """Twenty simulated clients, five a round, one scaled by 10^6: the clipped, noised mean
    moves each coordinate by at most ~C + 6 noise std a round, and ε is the amplified one."""
    privacy = {
        "clip_norm": 1.0,
        "noise_multiplier": 1.0,
        "adaptive": {"target_quantile": 0.5, "count_noise_multiplier": 1.0},
        "sampling": "uniform",
        "population": 20,
    }
    config = virtual_run_config(
        tmp_path,
        20,
        node_config={"scaled-ids": "7", "scale": 1e6},
        run={"name": "virtual-dp", "rounds": 4, "seed": 3},
        model="geofl_testapp:make_float_model",
        strategy={"clients_per_round": 5, "min_clients": 5},
        privacy=privacy,
    )
    outcome = run_virtual_simulation(config)
    assert outcome.result.status == "completed", outcome.result
    mechanism = RoundMechanism(1.0, 1.0, Sampling(20, 5))
    expected = [epsilon(mechanism, n, 1e-5) for n in range(1, 5)]
    assert recorded_epsilons(config) == pytest.approx(expected)
    noise_std = 1.0 * 1.0 / 5
    _, _, pairs = run_rows(config)
    norms = {
        match.group(1)
        for p, _ in pairs
        if p.kind == "fit" and (match := re.search(r"over the clip norm (\S+),", p.reason or ""))
    }
    assert len(norms) > 1, norms  # the adaptive norm moved between rounds
    assert float(np.abs(final_weights(config)["w"]).max()) < 4 * (1.0 + 6 * noise_std)


def test_the_accountant_never_runs_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that the budget stops: every ε (the guard's checks, the recorded ones) is
    computed in a worker thread, never on the thread running the event loop."""
    from geofl.server.privacy import budget

    on_loop: list[int] = []
    calls: list[int] = []
    accountant = budget.epsilon

    def watched(mechanism: Any, rounds: int, delta: float) -> float:
        calls.append(rounds)
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop in this thread: a worker
            pass
        else:
            on_loop.append(rounds)
        return accountant(mechanism, rounds, delta)

    monkeypatch.setattr(budget, "epsilon", watched)
    mechanism = RoundMechanism(2.0)
    target = (epsilon(mechanism, 2, 1e-5) + epsilon(mechanism, 3, 1e-5)) / 2
    config = virtual_run_config(
        tmp_path,
        4,
        run={"name": "budget-off-loop", "rounds": 5, "seed": 3},
        model="geofl_testapp:make_float_model",
        strategy={"clients_per_round": 4, "min_clients": 4},
        privacy={
            "clip_norm": 1.0,
            "noise_multiplier": 2.0,
            "target_epsilon": target,
            "on_budget": "stop",
        },
    )
    outcome = run_virtual_simulation(config)
    assert outcome.result.status == "cancelled", outcome.result
    assert recorded_epsilons(config) == pytest.approx([epsilon(mechanism, n, 1e-5) for n in (1, 2)])
    assert calls and 3 in calls  # the guard did ask about round 3, ...
    assert on_loop == []  # ... and nothing was asked on the event loop
