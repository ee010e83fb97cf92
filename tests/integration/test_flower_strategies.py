"""Flower 1.42 strategies aggregating in geofl-native YAML runs, over real gRPC on loopback.

Three clients of the test app add ``1 + partition`` (1, 2, 3) to every float tensor and 1 to
the integer ``steps``, reporting 10, 20 and 30 examples, so what Flower's math makes of each
round is known in closed form.
"""

from __future__ import annotations

import asyncio
import math
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from geofl.server.config import RunConfig, load_config
from geofl.server.coordinator import Coordinator
from geofl.server.rounds.observers import RoundEndCallback
from geofl.server.rounds.records import RoundRecord
from geofl.storage import CheckpointRecord, CheckpointStore, open_database, queries

from .conftest import ServerHandle
from .processes import free_port

with warnings.catch_warnings():  # flwr's import chain trips deprecation warnings (click)
    warnings.simplefilter("ignore", DeprecationWarning)
    pytest.importorskip("flwr.serverapp.strategy")

ETA, BETA_1, BETA_2, TAU = 0.1, 0.9, 0.99, 1e-3
#: Example-weighted mean of the clients' shifts 1, 2, 3 (weights 10, 20, 30).
MEAN_SHIFT = (10 * 1 + 20 * 2 + 30 * 3) / 60


def _yaml_run(tmp_path: Path, strategy: str, *, port: int = 0, extra: str = "") -> RunConfig:
    text = f"""\
run: {{name: flower-itest, rounds: 2, seed: 1}}
model: geofl_testapp:make_model
strategy:
{strategy}
  clients_per_round: 3
  min_clients: 3
schedule: {{deadline_s: 20, wait_for_clients_s: 20}}
evaluation: {{every: 1, server: "geofl_testapp:server_evaluate"}}
storage: {{url: "sqlite:///geofl.db", checkpoints: ckpt}}
server: {{address: "127.0.0.1:{port}", heartbeat_interval_s: 0.5{extra}}}
"""
    path = tmp_path / "run.yml"
    path.write_text(text, encoding="utf-8")
    return load_config(path)


def _checkpoint(config: RunConfig, run_id: int) -> tuple[dict[str, Any], dict[str, Any]]:
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        row = queries.latest_checkpoint(session, run_id)
        assert row is not None
        record = CheckpointRecord.from_row(row)
    return CheckpointStore(Path(config.storage.checkpoints)).load(record)


def _detail(config: RunConfig, run_id: int) -> Any:
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        return queries.run_detail(session, run_id)


def _fedadam_by_hand(rounds: int) -> tuple[float, float, float]:
    """Flower's FedAdam (bias-corrected step, exponent ``round + 1``) on the test app.

    Every round the FedAvg aggregate moves each float value by ``MEAN_SHIFT``; returns the
    value after ``rounds`` rounds and the moments ``m`` and ``v`` of a float tensor.
    """
    value = m = v = 0.0
    for server_round in range(1, rounds + 1):
        delta = MEAN_SHIFT
        m = BETA_1 * m + (1 - BETA_1) * delta
        v = BETA_2 * v + (1 - BETA_2) * delta**2
        exponent = server_round + 1
        step = ETA * math.sqrt(1 - BETA_2**exponent) / (1 - BETA_1**exponent)
        value = float(np.float32(value + step * m / (math.sqrt(v) + TAU)))
    return value, m, v


def test_flower_fedmedian_takes_the_median_client_each_round(tmp_path: Path, serve: Any) -> None:
    # No staging memory: every upload is spooled to a file, kept memory-mapped for Flower.
    config = _yaml_run(tmp_path, "  flower: FedMedian", extra=", upload_buffer_bytes: 0")
    server = serve(config)
    for partition in range(3):
        server.add_client(partition)
    result = server.wait()
    assert result.status == "completed"
    detail = _detail(config, result.run_id)
    assert [r.status for r in detail.rounds] == ["committed", "committed"]
    assert [(r.num_selected, r.num_succeeded) for r in detail.rounds] == [(3, 3), (3, 3)]
    # Round 1: clients hold 1, 2, 3 -> median 2; round 2: 3, 4, 5 -> median 4.
    assert [r.server_eval_metrics["w_mean"] for r in detail.rounds] == [2.0, 4.0]
    weights, state = _checkpoint(config, result.run_id)
    np.testing.assert_array_equal(weights["w"], np.full((4, 3), 4.0, np.float32))
    np.testing.assert_array_equal(weights["b"], np.full(3, 4.0, np.float32))
    assert weights["steps"].dtype == np.int64 and int(weights["steps"]) == 2
    assert state == {}
    for r in detail.rounds:  # metrics through Flower's aggregate_evaluate: weighted means
        assert r.train_loss == pytest.approx((10 * 0 + 20 * 1 + 30 * 2) / 60)
        assert r.eval_metrics["accuracy"] == pytest.approx((0.5 + 0.6 + 0.7) / 3)


def _assert_fedadam_result(config: RunConfig, run_id: int) -> None:
    value, m, v = _fedadam_by_hand(2)
    weights, state = _checkpoint(config, run_id)
    np.testing.assert_allclose(weights["w"], np.full((4, 3), value, np.float32), rtol=1e-5)
    np.testing.assert_allclose(weights["b"], np.full(3, value, np.float32), rtol=1e-5)
    assert weights["w"].dtype == np.float32
    assert int(weights["steps"]) == 0  # Flower's Adam step on the counter rounds back to 0
    assert set(state) == {f"{slot}/{k}" for slot in ("m_t", "v_t") for k in ("w", "b", "steps")}
    np.testing.assert_allclose(state["m_t/w"], m, rtol=1e-5)
    np.testing.assert_allclose(state["v_t/w"], v, rtol=1e-5)


def test_flower_fedadam_steps_as_flowers_math_says(tmp_path: Path, serve: Any) -> None:
    config = _yaml_run(tmp_path, f"  flower: FedAdam\n  args: {{eta: {ETA}}}")
    server = serve(config)
    for partition in range(3):
        server.add_client(partition)
    result = server.wait()
    assert result.status == "completed"
    detail = _detail(config, result.run_id)
    assert [r.status for r in detail.rounds] == ["committed", "committed"]
    first, _, _ = _fedadam_by_hand(1)
    assert detail.rounds[0].server_eval_metrics["w_mean"] == pytest.approx(first, rel=1e-5)
    _assert_fedadam_result(config, result.run_id)


class _CrashError(Exception):
    """Stands in for the coordinator dying right after a commit."""


def _crash_after_round_one(record: RoundRecord, status: str) -> None:
    if record.number == 1 and status == "committed":
        raise _CrashError


def test_flower_fedadam_moments_survive_a_coordinator_restart(tmp_path: Path, serve: Any) -> None:
    port = free_port()
    config = _yaml_run(tmp_path, f"  flower: FedAdam\n  args: {{eta: {ETA}}}", port=port)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def first_life() -> None:
        coordinator = Coordinator(config, observers=[RoundEndCallback(_crash_after_round_one)])
        try:
            await coordinator.run()
        finally:
            await coordinator.stop()

    try:
        crashed = asyncio.run_coroutine_threadsafe(first_life(), loop)
        clients = ServerHandle(None, port, crashed)  # type: ignore[arg-type]
        for partition in range(3):
            clients.add_client(partition)
        with pytest.raises(_CrashError):
            crashed.result(timeout=60)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
    resumed = serve(config)  # same name and config: resumes after round 1
    assert resumed.coordinator.start_round == 2
    result = resumed.wait()
    for client in clients.clients:
        client.join(timeout=15)
        assert not client.is_alive(), "a client did not exit after the run"
    assert not clients.errors, clients.errors
    assert result.status == "completed" and result.resumed_from == 1
    assert [r.status for r in _detail(config, result.run_id).rounds] == ["committed"] * 2
    # Round 2 from zeroed moments would land elsewhere: the moments came back from round 1.
    _assert_fedadam_result(config, result.run_id)
