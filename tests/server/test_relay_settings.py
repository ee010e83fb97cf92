"""A relay's pure parts: its settings, its model-version plan, its time budget, its result."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from geofl.server.config import ConfigError, ScheduleConfig
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import TaskRecord
from geofl.server.relay import (
    MemoryRecorder,
    RegionalError,
    VersionPlan,
    flag_override,
    load_relay_config,
    local_budget,
)
from geofl.server.rounds.records import RoundRecord

REQUIRED = [
    flag_override("--region", "relay.region", "eu"),
    flag_override("--server", "upstream.address", "coordinator:8443"),
    flag_override("--listen", "server.address", "127.0.0.1:9443"),
]


def _problems(error: ConfigError) -> str:
    return "\n".join(str(p) for p in error.problems)


def test_flags_alone_make_a_relay_with_defaults() -> None:
    config = load_relay_config(flags=REQUIRED)
    assert config.relay.region == "eu" and config.node_name == "relay-eu"
    assert config.relay.local_rounds == 1 and config.relay.clients_per_round is None
    assert config.relay.min_clients == 1 and not config.secure_aggregation.enabled
    assert config.upstream.address == "coordinator:8443"
    assert config.server.address == "127.0.0.1:9443"


def test_missing_region_and_listen_address_are_named() -> None:
    with pytest.raises(ConfigError) as caught:
        load_relay_config(flags=REQUIRED[1:2])
    text = _problems(caught.value)
    assert "relay.region: required key is missing" in text
    assert "--listen" in text


def test_a_bad_flag_value_names_the_flag() -> None:
    with pytest.raises(ConfigError) as caught:
        load_relay_config(flags=[*REQUIRED, flag_override("--region", "relay.region", "")])
    [problem] = caught.value.problems
    assert problem.source == "--region ''" and problem.path == "relay.region"


def test_file_values_are_checked_with_lines_and_flags_win(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("-")
    path = tmp_path / "relay.yaml"
    path.write_text(
        "relay:\n"
        "  region: us\n"
        "  local_rounds: 3\n"
        "upstream:\n"
        "  address: coordinator:8443\n"
        "  root_certificates: ca.pem\n"
        "server:\n"
        "  address: 0.0.0.0:9443\n"
    )
    config = load_relay_config(path, flags=[flag_override("--region", "relay.region", "eu")])
    assert config.relay.region == "eu" and config.relay.local_rounds == 3
    assert config.upstream.root_certificates == tmp_path / "ca.pem"  # relative to the file
    path.write_text(path.read_text().replace("local_rounds: 3", "local_round: 3"))
    with pytest.raises(ConfigError) as caught:
        load_relay_config(path)
    [problem] = caught.value.problems
    assert problem.line == 3 and problem.path == "relay.local_round"
    assert "allowed keys: clients_per_round, local_rounds, min_clients" in problem.message


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["secure_aggregation.enabled=true"], "relay.min_clients >= 2"),
        (["relay.clients_per_round=1", "relay.min_clients=2"], "below relay.min_clients"),
        (["relay.local_rounds=0"], "relay.local_rounds"),
        (["relay.region=two words"], "relay.region"),
    ],
)
def test_inconsistent_settings_are_refused(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_relay_config(flags=REQUIRED, overrides=overrides)
    assert expected in _problems(caught.value)


def test_versions_increase_and_an_evaluated_model_keeps_its_number() -> None:
    plan = VersionPlan(local_rounds=2)
    assert plan.rounds(0) == (1, 2)  # global v0 published as 0, regional rounds 1 and 2
    assert plan.base(1) == 3  # the evaluation of global v1 ...
    assert plan.rounds(1) == (4, 5)  # ... and the fit from v1 share version 3
    assert plan.rounds(1) == (7, 8)  # trained from already: a fresh base (6), never 3 again
    assert plan.base(0) == 9  # a coordinator resumed from an older model: still increasing


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 30)), max_size=40), st.integers(1, 4))
def test_a_version_never_names_two_models(ops: list[tuple[bool, int]], rounds: int) -> None:
    """A client skips downloading a version it holds: a number must mean one model."""
    plan = VersionPlan(rounds)
    named: dict[int, Any] = {}
    trained = 0
    for fit, global_version in ops:
        if fit:
            first, last = plan.rounds(global_version)
            assert last - first + 1 == rounds
            models: list[tuple[int, Any]] = [(first - 1, ("global", global_version))]
            for version in range(first, last + 1):
                trained += 1
                models.append((version, ("regional", trained)))
        else:
            models = [(plan.base(global_version), ("global", global_version))]
        for version, model in models:
            assert named.setdefault(version, model) == model


def test_the_budget_fits_the_coordinators_deadline() -> None:
    schedule = ScheduleConfig(deadline_s=600.0, wait_for_clients_s=300.0)
    assert local_budget(None, schedule, 2) == (600.0, 300.0)
    round_s, wait_s = local_budget(20.0, schedule, 2)
    assert round_s == pytest.approx(9.0) and wait_s == pytest.approx(18.0)  # 10 % kept
    short = ScheduleConfig(deadline_s=5.0, wait_for_clients_s=2.0)
    assert local_budget(100.0, short, 3) == (5.0, 2.0)
    with pytest.raises(RegionalError, match="no time"):
        local_budget(0.5, schedule, 1)


def _record(number: int, examples: dict[int, int], **fields: Any) -> RoundRecord:
    """A round in which ``examples`` (node -> num_examples) succeeded and node 99 failed."""
    record = RoundRecord(number, **fields)
    loop = asyncio.get_running_loop()
    for node, n in [*examples.items(), (99, 7)]:
        task = TaskRecord(node, node, "fit", number, number - 1, {}, 0.0, loop.create_future())
        status: Any = "failed" if node == 99 else "ok"
        record.outcomes.append((task, Outcome(status, num_examples=n)))
    return record


def test_the_result_counts_each_contributing_client_once() -> None:
    async def regional_rounds() -> MemoryRecorder:
        recorder = MemoryRecorder()
        weights = {"w": np.ones(2, np.float32)}
        await recorder.round_committed(_record(1, {1: 10, 2: 20}), weights, {})
        last = _record(2, {2: 20, 3: 30}, train_loss=0.5, fit_metrics={"accuracy": 0.9})
        await recorder.round_committed(last, weights, {})
        return recorder

    result = asyncio.run(regional_rounds()).result()
    assert result.num_examples == 60  # clients 1, 2, 3; the failed one not at all
    assert result.metrics == {
        "accuracy": 0.9,
        "train_loss": 0.5,
        "relay_clients": 3,
        "relay_rounds": 2,
    }
    empty = MemoryRecorder()
    empty.round_failed(RoundRecord(5), "1 of 2 clients succeeded")
    with pytest.raises(RegionalError, match="local round 5: 1 of 2 clients succeeded"):
        empty.result()


def test_a_relay_selects_its_clients_with_the_runs_policy_and_keeps_its_measurements() -> None:
    from dataclasses import replace

    from geofl.server.relay import RegionalServer
    from geofl.server.rounds.records import EngineSettings

    config = load_relay_config(
        flags=[*REQUIRED, flag_override("--set", "schedule.selection.policy", "deadline")]
    )
    regional = RegionalServer(config)
    settings = EngineSettings(
        rounds=2,
        clients_per_round=5,
        min_clients=2,
        over_select=1.0,
        deadline_s=7.5,
        wait_for_clients_s=10.0,
        round_config={},
        evaluate_every=0,
        evaluate_clients=5,
        evaluate_config={},
        seed=0,
    )
    try:
        first = regional._regional_scheduler(settings, 1000)
        assert first.settings.selection.policy == "deadline"
        assert (first.settings.deadline_s, first.settings.min_clients) == (7.5, 2)
        # The next task's deadline applies to the same scheduler (its measurements stay).
        second = regional._regional_scheduler(replace(settings, deadline_s=3.0), 1000)
        assert second is first and second.settings.deadline_s == 3.0
    finally:
        regional.stop(run_over=False)
