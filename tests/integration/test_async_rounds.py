"""Buffered asynchronous rounds (FedBuff): the real coordinator in ``schedule.mode: async``.

On the virtual clock (simulated clients, no sleeping) the timeline is exact: regions of
very different speed make the slow clients' updates stale by a known amount, and the
staleness the engine recorded is checked against the one the database's timestamps
imply. Over real gRPC on loopback: plain buffers, a crashed client, secure aggregation in
groups, and regional relays as ordinary nodes. The test apps add a constant shift to
every float, so every applied version is known in closed form from its participations.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.client.runtime import ClientRuntime
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.config import ConfigError, RunConfig, parse_config
from geofl.server.config.schedule import AsyncConfig, StalenessConfig
from geofl.server.models.store import ModelStore
from geofl.server.nodes.registry import Registry
from geofl.server.rounds.fedbuff import STALENESS_METRIC, FedBuffEngine, staleness_discount
from geofl.server.rounds.observers import RoundEndCallback, RoundObserver
from geofl.server.rounds.parts import EngineParts
from geofl.server.rounds.records import EngineSettings
from geofl.server.rounds.secure import SecureSettings
from geofl.server.simulation.traces import load_trace
from geofl.server.simulation.virtual import run_virtual_simulation
from geofl.server.strategies import make_strategy
from geofl.storage import open_database, queries
from geofl.storage.reports import ParticipationRecord, RunDetail

from .conftest import ServerHandle, final_weights, run_config
from .test_relay import REGIONS, RegionHandle, coordinator_config, region  # noqa: F401

NEAR = {"share": 0.5, "rtt_ms": 2, "jitter_ms": 1, "up_mbps": 100, "down_mbps": 100}
SPEED = 1000.0  # samples per second: a virtual client's 100 examples take 0.1 s


# ------------------------------------------------------------------ helpers


def _fedbuff(**fedbuff: Any) -> dict[str, Any]:
    return {"mode": "async", "deadline_s": 600, "wait_for_clients_s": 5, "fedbuff": fedbuff}


def _virtual(
    tmp_path: Path,
    clients: int,
    fedbuff: dict[str, Any],
    regions: dict[str, Any] | None = None,
    **overrides: Any,
) -> RunConfig:
    simulation: dict[str, Any] = {
        "clients": clients,
        "app": "geofl_testapp:virtual_app",
        "clock": "virtual",
        "workers": 0,
        "regions": regions or {},
        "compute": {"samples_per_s": SPEED},
        **overrides.pop("simulation", {}),
    }
    sections: dict[str, Any] = {
        "strategy": {"name": "fedavg", "clients_per_round": clients, "min_clients": 1},
        "schedule": _fedbuff(**fedbuff),
        "evaluation": {"every": 0, "server": "geofl_testapp:server_evaluate"},
        "simulation": simulation,
        **overrides,
    }
    return run_config(tmp_path, **sections)


def _detail(config: RunConfig) -> RunDetail:
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        run_id = queries.list_runs(session)[0].id
        return queries.run_detail(session, run_id)


def _fits(detail: RunDetail, number: int | None = None) -> list[ParticipationRecord]:
    return [
        p
        for p in detail.participations
        if p.kind == "fit" and (number is None or p.round_number == number)
    ]


def _expected_model(
    detail: RunDetail,
    shift: Callable[[ParticipationRecord], float],
    weight: Callable[[ParticipationRecord], float],
    staleness: StalenessConfig,
) -> float:
    """What the floats of the model should be: each version adds
    ``sum n d(s) shift / sum n`` over its applied updates (FedBuff's absolute discount)."""
    model = 0.0
    for round_ in detail.rounds:
        if round_.status != "committed":
            continue
        applied = [p for p in _fits(detail, round_.number) if p.status == "ok"]
        total = sum(weight(p) for p in applied)
        model += (
            sum(
                weight(p)
                * staleness_discount(int(p.metrics[STALENESS_METRIC]), staleness)
                * shift(p)
                for p in applied
            )
            / total
        )
    return model


def _sim_shift(participation: ParticipationRecord) -> float:
    return 1.0 + int(participation.node_name.removeprefix("sim-"))


def _grpc_shift(participation: ParticipationRecord) -> float:
    return 1.0 + int(participation.node_name.removeprefix("node-"))


def _grpc_examples(participation: ParticipationRecord) -> float:
    return 10.0 * (int(participation.node_name.removeprefix("node-")) + 1)


def _implied_staleness(detail: RunDetail, participation: ParticipationRecord) -> int:
    """Versions applied between a task's start and its arrival, from the timestamps alone:
    the task trained on the last version committed (or failed) when it started."""
    started = participation.started_at
    trained_on = sum(
        1 for r in detail.rounds if r.finished_at is not None and r.finished_at <= started
    )
    return participation.round_number - 1 - trained_on


# ------------------------------------------------------------------ the discount


@settings(max_examples=200, deadline=None)
@given(
    function=st.sampled_from(["constant", "polynomial", "hinge"]),
    exponent=st.floats(0, 8, allow_nan=False),
    hinge_at=st.integers(0, 50),
    staleness=st.integers(0, 10_000),
)
def test_discount_is_one_when_fresh_and_never_grows_with_staleness(
    function: str, exponent: float, hinge_at: int, staleness: int
) -> None:
    config = StalenessConfig(function=function, exponent=exponent, hinge_at=hinge_at)
    assert staleness_discount(0, config) == 1.0
    now, later = staleness_discount(staleness, config), staleness_discount(staleness + 1, config)
    assert 0.0 <= later <= now <= 1.0


def test_discount_functions_have_their_documented_values() -> None:
    assert staleness_discount(7, StalenessConfig(function="constant")) == 1.0
    polynomial = StalenessConfig(function="polynomial", exponent=0.5)
    assert staleness_discount(3, polynomial) == pytest.approx(0.5)
    hinge = StalenessConfig(function="hinge", exponent=0.5, hinge_at=4)
    assert [staleness_discount(s, hinge) for s in (4, 6, 10)] == pytest.approx([1, 0.5, 0.25])
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        staleness_discount(-1, polynomial)


# ------------------------------------------------------------------ bad input


def test_a_staleness_bound_of_zero_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"schedule\.fedbuff\.staleness\.max"):
        parse_config(
            {
                "run": {"name": "x", "rounds": 1},
                "model": "geofl_testapp:make_model",
                "schedule": _fedbuff(staleness={"max": 0}),
            },
            source="itest",
        )


def test_secure_groups_of_one_client_are_refused(tmp_path: Path) -> None:
    config = run_config(tmp_path, schedule=_fedbuff(buffer_size=1))
    secure = SecureSettings(
        run_id=1,
        degree="full",
        threshold=0.66,
        clip=8.0,
        ring_bits=32,
        max_examples=1000,
        stage_deadline_s=10,
    )
    with pytest.raises(ValueError, match="buffer_size >= 2"):
        FedBuffEngine(
            EngineSettings.from_config(config),
            EngineParts(
                registry=Registry(0.5),
                strategy=make_strategy("fedavg"),
                models=ModelStore(),
                observer=RoundObserver(),
                start_round=1,
                weights={"w": np.zeros(3, np.float32)},
                secure=secure,
            ),
            AsyncConfig(buffer_size=1),
        )


# ------------------------------------------------------------------ the virtual clock


def test_every_k_arrivals_apply_the_staleness_discounted_mean(tmp_path: Path) -> None:
    staleness = {"function": "polynomial", "exponent": 0.5, "max": 100}
    far = {**NEAR, "rtt_ms": 250, "jitter_ms": 20}
    config = _virtual(
        tmp_path,
        4,
        {"buffer_size": 3, "concurrency": 4, "updates": 8, "staleness": staleness},
        {"near": NEAR, "far": far},
        run={"name": "fedbuff", "rounds": 2, "seed": 4},
    )
    outcome = run_virtual_simulation(config)
    assert outcome.result.status == "completed"
    detail = _detail(config)
    # schedule.fedbuff.updates, not run.rounds, sets the number of versions.
    assert [(r.number, r.status) for r in detail.rounds] == [(n, "committed") for n in range(1, 9)]
    for round_ in detail.rounds:
        applied = [p for p in _fits(detail, round_.number) if p.status == "ok"]
        assert len(applied) == round_.num_succeeded == 3
        mean = sum(p.metrics[STALENESS_METRIC] for p in applied) / 3
        assert round_.fit_metrics[STALENESS_METRIC] == pytest.approx(mean)
    judged = [p for p in _fits(detail) if STALENESS_METRIC in p.metrics]
    for participation in judged:
        assert participation.metrics[STALENESS_METRIC] == _implied_staleness(detail, participation)
    stale = {p.node_region for p in judged if p.metrics[STALENESS_METRIC] > 0}
    assert "far" in stale  # the slow region's updates were discounted
    expected = _expected_model(detail, _sim_shift, lambda p: 100.0, StalenessConfig(**staleness))
    np.testing.assert_allclose(final_weights(config)["w"], expected, rtol=1e-6)
    # Only the last version's outstanding tasks were cut short.
    cut = [p for p in _fits(detail) if p.status == "dropped"]
    assert cut and all(p.round_number == 8 and "last version" in (p.reason or "") for p in cut)


def test_updates_past_the_staleness_bound_are_late_and_not_applied(tmp_path: Path) -> None:
    # The far task takes 0.75 s to fetch (notice, request, model), 0.1 s to train and
    # 0.25 s to upload: it lands about 11 near versions after it was handed out.
    far = {**NEAR, "rtt_ms": 500}
    config = _virtual(
        tmp_path,
        2,
        {"buffer_size": 1, "updates": 15, "staleness": {"function": "polynomial", "max": 2}},
        {"near": NEAR, "far": far},
    )
    run_virtual_simulation(config)
    detail = _detail(config)
    far_fits = [p for p in _fits(detail) if p.node_region == "far"]
    late = [p for p in far_fits if p.status == "late"]
    assert late and all(p.status in ("late", "dropped") for p in far_fits)
    for participation in late:
        assert participation.metrics[STALENESS_METRIC] > 2
        assert "schedule.fedbuff.staleness.max = 2" in (participation.reason or "")
    near = [p for p in _fits(detail) if p.node_region == "near" and p.status == "ok"]
    assert len(near) == 15 and all(p.metrics[STALENESS_METRIC] == 0 for p in near)
    # Only the near client moved the model: 15 versions of its shift, undiscounted.
    np.testing.assert_array_equal(
        final_weights(config)["w"], np.full((4, 3), 15 * _sim_shift(near[0]), np.float32)
    )


def _trace(tmp_path: Path, windows: Sequence[tuple[float, float]]) -> Path:
    """Client ``i`` is online from ``windows[i][0]`` to ``windows[i][1]`` seconds;
    each computes 1 ms per sample (FedScale's units: a step is 3 inferences)."""
    behaviour = {str(i): {"active": [a], "inactive": [b]} for i, (a, b) in enumerate(windows)}
    capacity = {str(i): {"computation": 1 / 3, "communication": 8000} for i in range(len(windows))}
    path = tmp_path / "trace.json"
    document = {"format": "geofl-client-trace", "version": 1}
    path.write_text(json.dumps(document | {"device_capacity": capacity, "behave_trace": behaviour}))
    return path


def test_a_client_that_drops_mid_task_is_replaced_at_once(tmp_path: Path) -> None:
    # Client 0 vanishes 0.05 s into its first task; client 2 only appears at 0.01 s, so
    # the two first tasks go to clients 0 and 1 and client 2 is the only idle one.
    trace = _trace(tmp_path, [(0.0, 0.05), (0.0, 1e9), (0.01, 1e9)])
    config = _virtual(
        tmp_path,
        3,
        {"buffer_size": 1, "concurrency": 2, "updates": 3},
        simulation={"trace": str(trace)},
    )
    run_virtual_simulation(config, load_trace(trace))
    detail = _detail(config)
    by_node: dict[str, list[ParticipationRecord]] = {}
    for participation in sorted(_fits(detail), key=lambda p: p.started_at):
        by_node.setdefault(participation.node_name, []).append(participation)
    (crashed,) = by_node["sim-0"]
    assert crashed.status == "dropped" and "availability trace" in (crashed.reason or "")
    assert by_node["sim-2"][0].started_at == crashed.finished_at
    assert [r.status for r in detail.rounds] == ["committed"] * 3


def test_failing_clients_sit_out_the_version_instead_of_spinning(tmp_path: Path) -> None:
    config = _virtual(
        tmp_path,
        3,
        {"buffer_size": 2, "updates": 3},
        simulation={"node_config": {"raise-ids": "0"}},
    )
    run_virtual_simulation(config)
    detail = _detail(config)
    assert [r.status for r in detail.rounds] == ["committed"] * 3
    for round_ in detail.rounds:
        failures = [p for p in _fits(detail, round_.number) if p.node_name == "sim-0"]
        assert len(failures) <= 1 and all(p.status == "failed" for p in failures)
    assert any(p.node_name == "sim-0" for p in _fits(detail))


def test_a_version_fails_when_every_client_fails(tmp_path: Path) -> None:
    config = _virtual(
        tmp_path,
        2,
        {"buffer_size": 1, "updates": 2},
        simulation={"node_config": {"raise-ids": "0,1"}},
    )
    outcome = run_virtual_simulation(config)
    assert outcome.result.status == "failed"
    assert outcome.result.error == "no round committed (every round failed)"
    detail = _detail(config)
    assert [r.status for r in detail.rounds] == ["failed", "failed"]
    assert all("every one of the 2 idle clients failed" in (r.error or "") for r in detail.rounds)
    assert all(p.status == "failed" for p in _fits(detail))
    assert len(_fits(detail)) == 4  # each client once per version, no retry storm


def test_evaluation_runs_every_n_versions_and_at_the_last(tmp_path: Path) -> None:
    config = _virtual(
        tmp_path,
        4,
        {"buffer_size": 1, "concurrency": 2, "updates": 5},
        evaluation={"every": 2, "clients": 2, "server": "geofl_testapp:server_evaluate"},
    )
    run_virtual_simulation(config)
    detail = _detail(config)
    server = [r.number for r in detail.rounds if r.server_eval_loss is not None]
    federated = [r.number for r in detail.rounds if r.eval_loss is not None]
    assert server == [2, 4, 5] and federated == [2, 4]
    evaluations = [p for p in detail.participations if p.kind == "evaluate"]
    assert {p.round_number for p in evaluations} == {2, 4}
    assert all(p.status == "ok" for p in evaluations)


class _KilledError(Exception):
    """Stands for the coordinator process dying after a commit."""


def test_a_coordinator_that_died_resumes_after_its_last_committed_version(
    tmp_path: Path,
) -> None:
    config = _virtual(tmp_path, 2, {"buffer_size": 1, "updates": 5, "staleness": {"max": 50}})

    def die_after_two(record: Any, status: str) -> None:
        if record.number == 2:
            raise _KilledError

    with pytest.raises(_KilledError):
        run_virtual_simulation(config, observers=[RoundEndCallback(die_after_two)])
    assert [r.status for r in _detail(config).rounds] == ["committed", "committed"]
    outcome = run_virtual_simulation(config)
    assert outcome.result.status == "completed" and outcome.result.resumed_from == 2
    detail = _detail(config)
    assert [(r.number, r.status) for r in detail.rounds] == [(n, "committed") for n in range(1, 6)]
    expected = _expected_model(detail, _sim_shift, lambda p: 100.0, StalenessConfig(max=50))
    np.testing.assert_allclose(final_weights(config)["w"], expected, rtol=1e-6)


# ------------------------------------------------------------------ real gRPC


def test_buffers_over_grpc_apply_the_discounted_mean(tmp_path: Path, serve: Any) -> None:
    staleness = {"function": "polynomial", "exponent": 1.0, "max": 50}
    config = run_config(
        tmp_path,
        run={"name": "fedbuff", "rounds": 3, "seed": 2},
        schedule=_fedbuff(buffer_size=2, concurrency=3, staleness=staleness),
        evaluation={"every": 0, "server": "geofl_testapp:server_evaluate"},
    )
    server = serve(config)
    for partition in range(3):
        server.add_client(partition)
    result = server.wait()
    assert result.status == "completed"
    detail = _detail(config)
    assert [(r.number, r.status, r.num_succeeded) for r in detail.rounds] == [
        (n, "committed", 2) for n in (1, 2, 3)
    ]
    # evaluation.every: 0 -> the server evaluates the last version only.
    assert [r.server_eval_loss is not None for r in detail.rounds] == [False, False, True]
    expected = _expected_model(detail, _grpc_shift, _grpc_examples, StalenessConfig(**staleness))
    np.testing.assert_allclose(final_weights(config)["w"], expected, rtol=1e-6)
    assert {p.status for p in _fits(detail)} <= {"ok", "dropped"}
    # Every settled task fed the link estimator, whose estimates were recorded per version.
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        measured = queries.latest_measurements(session, result.run_id)
    assert {m.node_id for m in measured} == {p.node_id for p in _fits(detail)}


class _CrashError(Exception):
    """Stops the runtime as a killed process would stop."""


class _CrashOnFit(ClientRuntime):
    """Dies on its first fit task: no result, no more heartbeats."""

    def _handle(self, task: pb.Task) -> None:
        if task.kind == pb.TASK_KIND_FIT:
            raise _CrashError("crashed during fit")
        super()._handle(task)

    def run(self) -> None:
        with contextlib.suppress(_CrashError):
            super().run()


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_crashed_client_is_dropped_and_its_slot_refilled(tmp_path: Path, serve: Any) -> None:
    config = run_config(
        tmp_path,
        run={"name": "crash", "rounds": 10, "seed": 2},
        strategy={"name": "fedavg", "clients_per_round": 2, "min_clients": 1},
        schedule=_fedbuff(buffer_size=1),
        evaluation={"every": 0, "server": None},
    )
    server: ServerHandle = serve(config)
    server.add_client(0, runtime_class=_CrashOnFit)
    registry = server.coordinator.registry
    _until(lambda: any(s.current for s in registry.online()), "the first client got no task")
    for partition in (1, 2):
        server.add_client(partition, behaviour="slow", delay_s=0.3)
    assert server.wait().status == "completed"
    detail = _detail(config)
    (crashed,) = [p for p in _fits(detail) if p.node_name == "node-0"]
    assert crashed.status == "dropped" and "heartbeats" in (crashed.reason or "")
    assert [r.status for r in detail.rounds] == ["committed"] * 10
    # Until the crash was noticed one slot trained; then both healthy clients did at once.
    healthy = [p for p in _fits(detail) if p.status == "ok"]
    before = [p for p in healthy if p.started_at < crashed.finished_at]
    after = [p for p in healthy if p.started_at >= crashed.finished_at]
    assert before and not _overlapping(before)
    assert _overlapping(after)


def _overlapping(fits: list[ParticipationRecord]) -> bool:
    """Whether two of ``fits`` were in flight at the same time."""
    return any(
        a.started_at < b.finished_at and b.started_at < a.finished_at
        for i, a in enumerate(fits)
        for b in fits[i + 1 :]
    )


def test_secure_aggregation_runs_over_the_buffer_in_groups(tmp_path: Path, serve: Any) -> None:
    staleness = {"function": "polynomial", "exponent": 0.5, "max": 10}
    config = run_config(
        tmp_path,
        run={"name": "secure-fedbuff", "rounds": 3, "seed": 3},
        strategy={"name": "fedavg", "clients_per_round": 4, "min_clients": 2},
        schedule={**_fedbuff(buffer_size=2, staleness=staleness), "deadline_s": 30},
        evaluation={"every": 0, "server": None},
        secure_aggregation={
            "enabled": True,
            "degree": "full",
            "max_examples": 1000,
            "stage_deadline_s": 20,
        },
    )
    server = serve(config)
    for partition in range(4):
        server.add_client(partition)
    assert server.wait(timeout=90).status == "completed"
    detail = _detail(config)
    assert [r.status for r in detail.rounds] == ["committed"] * 3
    kinds = {(p.kind, p.status) for p in detail.participations if p.status == "ok"}
    assert kinds == {("advertise", "ok"), ("share", "ok"), ("fit", "ok"), ("unmask", "ok")}
    for round_ in detail.rounds:
        group = [p for p in _fits(detail, round_.number) if p.status == "ok"]
        assert len(group) == 2  # one group's sum per version
        assert len({p.metrics[STALENESS_METRIC] for p in group}) == 1
    expected = _expected_model(detail, _grpc_shift, _grpc_examples, StalenessConfig(**staleness))
    # The masked sum is quantized in the ring: each coordinate within a few steps.
    np.testing.assert_allclose(final_weights(config)["w"], expected, atol=1e-5)


def test_secure_groups_run_on_the_virtual_clock(tmp_path: Path) -> None:
    """The virtual clients serve each group's SecAgg+ stages; the unmasked means are FedBuff's."""
    staleness = {"function": "polynomial", "exponent": 0.5, "max": 10}
    config = _virtual(
        tmp_path,
        4,
        {"buffer_size": 2, "staleness": staleness},
        run={"name": "secure-fedbuff-virtual", "rounds": 3, "seed": 3},
        strategy={"name": "fedavg", "clients_per_round": 4, "min_clients": 2},
        secure_aggregation={"enabled": True, "degree": "full", "max_examples": 100},
    )
    outcome = run_virtual_simulation(config)
    assert outcome.result.status == "completed", outcome.result
    detail = _detail(config)
    assert [r.status for r in detail.rounds] == ["committed"] * 3
    kinds = {p.kind for p in detail.participations if p.status == "ok"}
    assert kinds == {"advertise", "share", "fit", "unmask"}
    expected = _expected_model(detail, _sim_shift, lambda p: 100.0, StalenessConfig(**staleness))
    np.testing.assert_allclose(final_weights(config)["w"], expected, atol=1e-4)


def test_relays_take_part_as_ordinary_nodes(
    tmp_path: Path,
    serve: Any,
    region: Callable[..., RegionHandle],  # noqa: F811
) -> None:
    config = coordinator_config(
        tmp_path,
        run={"rounds": 3},
        schedule=_fedbuff(buffer_size=1, staleness={"function": "constant"}),
        evaluation={"every": 0},
    )
    server = serve(config)
    handles = [region(server, name, parts) for name, parts in REGIONS.items()]
    assert server.wait(timeout=90).status == "completed"
    for handle in handles:
        handle.wait()
    detail = _detail(config)
    assert [r.status for r in detail.rounds] == ["committed"] * 3
    applied = [p for p in _fits(detail) if p.status == "ok"]
    assert [p.round_number for p in applied] == [1, 2, 3]
    assert {p.node_name for p in _fits(detail)} <= {"relay-a", "relay-b"}
    # Each version is one region's FedAvg of its clients' shifts (exact in float32).
    regional = {"relay-a": 5 / 2, "relay-b": 55 / 8}
    expected = sum(regional[p.node_name] for p in applied)
    assert math.isclose(expected * 8, round(expected * 8))
    np.testing.assert_array_equal(final_weights(config)["w"], np.full((4, 3), expected, np.float32))


def test_a_client_whose_every_arrival_is_stale_still_has_its_link_recorded(
    tmp_path: Path,
) -> None:
    # The far client's task is handed out for one version and lands versions later, as
    # the near one goes on alone: its estimate must still be recorded with some version.
    # The far task takes 0.75 s to fetch (notice, request, model), 0.1 s to train and
    # 0.25 s to upload: it lands about 11 near versions after it was handed out.
    far = {**NEAR, "rtt_ms": 500}
    config = _virtual(
        tmp_path,
        2,
        {"buffer_size": 1, "updates": 15, "staleness": {"max": 50}},
        {"near": NEAR, "far": far},
    )
    outcome = run_virtual_simulation(config)
    assert outcome.result.status == "completed"
    detail = _detail(config)
    stale = {p.node_id for p in _fits(detail) if p.status == "ok" and p.metrics["staleness"]}
    assert stale, "the far client's arrivals should be stale"
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        measured = queries.latest_measurements(session, outcome.result.run_id)
    assert {m.node_id for m in measured} == {p.node_id for p in _fits(detail)}
