"""Whole runs over real gRPC on loopback: aggregation, records, and bad clients."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from geofl.storage import open_database, queries

from .conftest import final_weights, run_config


def _detail(config: Any, run_id: int) -> Any:
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        return queries.run_detail(session, run_id)


def test_fedavg_rounds_aggregate_exactly_and_are_recorded(
    tmp_path: Path, serve: Any, database_url: str
) -> None:
    """The whole round over gRPC, recorded on SQLite and on PostgreSQL."""
    config = run_config(tmp_path, storage={"url": database_url})
    server = serve(config)
    for partition in range(3):
        server.add_client(partition)
    result = server.wait()
    assert result.status == "completed"
    # Each round adds the example-weighted mean of 1, 2, 3 with weights 10, 20, 30.
    step = (10 * 1 + 20 * 2 + 30 * 3) / 60
    weights = final_weights(config, result.run_id)
    np.testing.assert_allclose(weights["w"], np.full((4, 3), 2 * step, np.float32), rtol=1e-6)
    assert int(weights["steps"]) == 2
    detail = _detail(config, result.run_id)
    assert detail.run.status == "completed"
    assert [r.status for r in detail.rounds] == ["committed", "committed"]
    for r in detail.rounds:
        assert (r.num_selected, r.num_succeeded, r.num_failed) == (3, 3, 0)
        assert r.bytes_up > 3 * 60 and r.bytes_down > 3 * 60  # 3 clients x 60 bytes of tensors
        assert r.eval_metrics["accuracy"] == pytest.approx((0.5 + 0.6 + 0.7) / 3)
        assert r.server_eval_metrics["w_mean"] == pytest.approx(step * r.number, rel=1e-6)
        assert r.train_loss == pytest.approx((10 * 0 + 20 * 1 + 30 * 2) / 60)
    kinds = {(p.kind, p.status) for p in detail.participations}
    assert kinds == {("fit", "ok"), ("evaluate", "ok")}
    assert all(runtime.tasks_done >= 2 for runtime in server.runtimes)


def test_failing_and_mismatched_clients_are_recorded_and_the_round_goes_on(
    tmp_path: Path, serve: Any
) -> None:
    config = run_config(
        tmp_path, strategy={"clients_per_round": 4, "min_clients": 2}, evaluation={"every": 0}
    )
    server = serve(config)
    server.add_client(0)
    server.add_client(1)
    server.add_client(2, behaviour="raise")
    server.add_client(3, behaviour="wrong-shape")
    result = server.wait()
    assert result.status == "completed"
    detail = _detail(config, result.run_id)
    assert [r.num_succeeded for r in detail.rounds] == [2, 2]
    by_node = {p.node_name: p for p in detail.participations if p.round_number == 1}
    assert by_node["node-2"].status == "failed"
    assert "deliberate failure in fit" in (by_node["node-2"].reason or "")
    assert by_node["node-3"].status == "failed"
    assert "w: float32[4, 3]" in (by_node["node-3"].reason or "")
    # Only the two good clients (1 and 2 added, weights 10 and 20) moved the model.
    step = (10 * 1 + 20 * 2) / 30
    np.testing.assert_allclose(final_weights(config, result.run_id)["b"], 2 * step, rtol=1e-6)


def test_round_fails_cleanly_below_min_clients(tmp_path: Path, serve: Any) -> None:
    config = run_config(
        tmp_path, strategy={"clients_per_round": 2, "min_clients": 2}, evaluation={"every": 0}
    )
    server = serve(config)
    server.add_client(0)
    server.add_client(1, behaviour="raise")
    result = server.wait()
    assert (result.status, result.error) == ("failed", "no round committed (every round failed)")
    detail = _detail(config, result.run_id)
    assert [r.status for r in detail.rounds] == ["failed", "failed"]
    assert "1 of 2 clients succeeded" in (detail.rounds[0].error or "")
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        assert queries.latest_checkpoint(session, result.run_id) is None


def test_straggler_past_the_deadline_is_recorded_late(tmp_path: Path, serve: Any) -> None:
    config = run_config(
        tmp_path, run={"rounds": 1}, evaluation={"every": 0}, schedule={"deadline_s": 1.5}
    )
    server = serve(config)
    server.add_client(0)
    server.add_client(1)
    server.add_client(2, behaviour="slow", delay_s=3.0)
    result = server.wait()
    detail = _detail(config, result.run_id)
    statuses = {p.node_name: p.status for p in detail.participations}
    assert statuses == {"node-0": "ok", "node-1": "ok", "node-2": "late"}
    assert detail.rounds[0].status == "committed"


def test_model_larger_than_grpc_message_limit_streams_in_chunks(tmp_path: Path, serve: Any) -> None:
    config = run_config(
        tmp_path,
        run={"rounds": 1},
        evaluation={"every": 0, "server": None},
        model="geofl_testapp:make_large_model",
        strategy={"clients_per_round": 2, "min_clients": 2},
    )
    server = serve(config)
    server.add_client(0, app="geofl_testapp:shift_app")
    server.add_client(1, app="geofl_testapp:shift_app")
    result = server.wait()
    weights = final_weights(config, result.run_id)
    np.testing.assert_array_equal(weights["big"], np.full(6_000_000, 1.5, np.float32))
    detail = _detail(config, result.run_id)
    fits = [p for p in detail.participations if p.kind == "fit"]
    assert all(p.bytes_up > 24_000_000 and p.bytes_down > 24_000_000 for p in fits)


def test_uploads_spilled_to_disk_aggregate_the_same(tmp_path: Path, serve: Any) -> None:
    """With no staging memory every upload goes to a temporary file (memory-mapped)."""
    config = run_config(
        tmp_path,
        evaluation={"every": 0, "server": None},
        model="geofl_testapp:make_large_model",
        server={"upload_buffer_bytes": 0},
        strategy={"clients_per_round": 2, "min_clients": 2},
    )
    server = serve(config)
    server.add_client(0, app="geofl_testapp:shift_app")
    server.add_client(1, app="geofl_testapp:shift_app")
    result = server.wait()
    weights = final_weights(config, result.run_id)
    np.testing.assert_array_equal(weights["big"], np.full(6_000_000, 3.0, np.float32))
    assert server.coordinator._state.upload_budget.peak == 0


def test_selection_node_config_keeps_other_nodes_connected_but_idle(
    tmp_path: Path, serve: Any
) -> None:
    config = run_config(
        tmp_path,
        run={"rounds": 2},
        evaluation={"every": 0},
        strategy={"clients_per_round": 3, "min_clients": 2},
        schedule={"selection": {"node_config": {"pool": "real"}}},
    )
    server = serve(config)
    server.add_client(0, pool="real")
    server.add_client(1, pool="real")
    server.add_client(2, pool="crowd")
    result = server.wait()
    assert result.status == "completed"
    detail = _detail(config, result.run_id)
    trained = {p.node_name for p in detail.participations}
    assert trained == {"node-0", "node-1"}
    assert [r.num_succeeded for r in detail.rounds] == [2, 2]
