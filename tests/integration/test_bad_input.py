"""Hostile or broken peers over real gRPC: the server rejects, records, and goes on."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from geofl.client.connection import Connection
from geofl.protocols import streams
from geofl.protocols.errors import ErrorCode, GeoflError, NonFiniteError, SessionError, TensorError
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.protocols.v1 import geofl_pb2_grpc as pb_grpc
from geofl.storage import open_database, queries

from .conftest import run_config


def _fit_task(conn: Connection) -> pb.Task:
    for _ in range(100):
        task = conn.get_task(poll_timeout_s=2.0)
        if task.kind == pb.TASK_KIND_FIT:
            return task
    raise AssertionError("no fit task arrived")


def _header(task: pb.Task) -> pb.UploadHeader:
    return pb.UploadHeader(
        task_id=task.task_id,
        round=task.round,
        attempt=1,
        status=pb.RESULT_STATUS_OK,
        update_kind=pb.UPDATE_KIND_DELTA,
        num_examples=10,
    )


def _raw_client(port: int, name: str, act: Any, errors: list[BaseException]) -> threading.Thread:
    """A hand-driven client that joins, takes one fit task and does ``act(conn, task)``."""

    def body() -> None:
        conn = Connection(f"127.0.0.1:{port}")
        try:
            conn.join(name, None, {}, timeout=5)
            act(conn, _fit_task(conn))
        except BaseException as exc:
            errors.append(exc)
        finally:
            conn.close()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


GOOD = {
    "w": np.ones((4, 3), np.float32),
    "b": np.ones(3, np.float32),
    "steps": np.ones((), np.int64),
}


@pytest.mark.parametrize(
    ("tensors", "error", "reason"),
    [
        ({**GOOD, "w": np.ones((3, 4), np.float32)}, TensorError, "expected w: float32[4, 3]"),
        ({**GOOD, "b": np.ones(3, np.float64)}, TensorError, "expected b: float32[3]"),
        ({"x": GOOD["w"], "b": GOOD["b"]}, TensorError, "expected w"),
        ({**GOOD, "b": np.array([0, np.nan, 0], np.float32)}, NonFiniteError, "NaN or Inf"),
        ({**GOOD, "b": np.array([np.inf, 0, 0], np.float32)}, NonFiniteError, "NaN or Inf"),
    ],
    ids=["shape", "dtype", "names", "nan", "inf"],
)
def test_server_rejects_bad_updates_and_records_why(
    tmp_path: Path, serve: Any, tensors: dict[str, np.ndarray], error: type, reason: str
) -> None:
    config = run_config(
        tmp_path,
        run={"rounds": 1},
        evaluation={"every": 0},
        strategy={"clients_per_round": 3, "min_clients": 2},
    )
    server = serve(config)
    server.add_client(0)
    server.add_client(1)
    errors: list[BaseException] = []
    raw = _raw_client(
        server.port,
        "evil",
        lambda conn, task: conn.submit(_header(task), tensors, 1 << 16, 10),
        errors,
    )
    result = server.wait()
    raw.join(10)
    assert len(errors) == 1 and isinstance(errors[0], error), errors
    assert reason in str(errors[0])
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        detail = queries.run_detail(session, result.run_id)
    evil = [p for p in detail.participations if p.node_name == "evil"]
    assert [p.status for p in evil] == ["rejected"]
    assert reason in (evil[0].reason or "")
    assert detail.rounds[0].status == "committed" and detail.rounds[0].num_succeeded == 2


def test_client_disconnecting_mid_upload_is_dropped_and_the_round_goes_on(
    tmp_path: Path, serve: Any
) -> None:
    config = run_config(
        tmp_path,
        run={"rounds": 1},
        evaluation={"every": 0},
        strategy={"clients_per_round": 3, "min_clients": 2},
    )
    server = serve(config)
    server.add_client(0)
    server.add_client(1)
    errors: list[BaseException] = []

    def cut(conn: Connection, task: pb.Task) -> None:
        channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        stub = pb_grpc.CoordinatorStub(channel)

        def messages() -> Iterator[pb.UploadMessage]:
            yield pb.UploadMessage(header=_header(task))
            chunks = streams.iter_chunks(GOOD, 8)
            yield pb.UploadMessage(chunk=next(chunks))
            time.sleep(0.3)
            channel.close()  # the connection goes away mid-stream

        call = stub.Submit.future(messages(), metadata=conn._metadata())
        with pytest.raises(grpc.RpcError):
            call.result(timeout=10)

    raw = _raw_client(server.port, "flaky", cut, errors)
    result = server.wait()
    raw.join(10)
    assert not errors, errors
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        detail = queries.run_detail(session, result.run_id)
    flaky = [p for p in detail.participations if p.node_name == "flaky"]
    assert [p.status for p in flaky] == ["dropped"]
    assert detail.rounds[0].num_succeeded == 2


def test_unknown_session_and_task_are_refused(tmp_path: Path, serve: Any) -> None:
    config = run_config(
        tmp_path,
        run={"rounds": 1},
        evaluation={"every": 0},
        strategy={"clients_per_round": 2, "min_clients": 2},
    )
    server = serve(config)
    conn = Connection(f"127.0.0.1:{server.port}")
    with pytest.raises(SessionError):
        conn.get_task(0.1)
    session = conn.join("probe", None, {}, timeout=5)
    assert session.node_id > 0
    bogus = pb.UploadHeader(
        task_id=12345, status=pb.RESULT_STATUS_OK, update_kind=pb.UPDATE_KIND_DELTA, num_examples=1
    )
    with pytest.raises(GeoflError) as refused:
        conn.submit(bogus, GOOD, 1 << 16, 5)
    assert refused.value.code is ErrorCode.UNKNOWN_TASK
    conn.close()
    # Let liveness retire the probe so that it is not selected for the round.
    deadline = time.monotonic() + 10
    while server.coordinator.registry.online():
        assert time.monotonic() < deadline, "the silent probe never went offline"
        time.sleep(0.1)
    server.add_client(0)
    server.add_client(1)
    assert server.wait().status == "completed"


def test_protocol_version_mismatch_is_a_clear_error(tmp_path: Path, serve: Any) -> None:
    config = run_config(
        tmp_path,
        run={"rounds": 1},
        evaluation={"every": 0},
        strategy={"clients_per_round": 1, "min_clients": 1},
    )
    server = serve(config)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    stub = pb_grpc.CoordinatorStub(channel)
    with pytest.raises(grpc.RpcError) as failed:
        stub.Join(pb.JoinRequest(protocol_versions=[99], node_name="future"), timeout=5)
    assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "GEOFL-E100" in (failed.value.details() or "")
    assert "[99]" in (failed.value.details() or "")
    channel.close()
    server.add_client(0)
    assert server.wait().status == "completed"


def test_client_that_vanishes_mid_round_is_dropped_by_liveness(tmp_path: Path, serve: Any) -> None:
    """No heartbeats after taking a task: dropped long before the 60 s round deadline."""
    config = run_config(
        tmp_path,
        run={"rounds": 1},
        evaluation={"every": 0},
        schedule={"deadline_s": 60},
        strategy={"clients_per_round": 3, "min_clients": 2},
    )
    server = serve(config)
    server.add_client(0)
    server.add_client(1)
    errors: list[BaseException] = []
    raw = _raw_client(server.port, "ghost", lambda conn, task: None, errors)
    result = server.wait(timeout=40)
    raw.join(10)
    assert not errors, errors
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        detail = queries.run_detail(session, result.run_id)
    ghost = [p for p in detail.participations if p.node_name == "ghost"]
    assert [p.status for p in ghost] == ["dropped"]
    assert "heartbeats" in (ghost[0].reason or "")
    assert detail.rounds[0].status == "committed" and detail.rounds[0].num_succeeded == 2
