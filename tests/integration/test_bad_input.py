"""Hostile or broken peers over real gRPC: the server rejects, records, and goes on."""

from __future__ import annotations

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
from .intruders import GOOD_UPDATE as GOOD
from .intruders import raw_client, round_beside_honest_clients, upload_header


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
    seen = round_beside_honest_clients(
        tmp_path,
        serve,
        "evil",
        lambda conn, task: conn.submit(upload_header(task), tensors, 1 << 16, 10),
    )
    assert len(seen.errors) == 1 and isinstance(seen.errors[0], error), seen.errors
    assert reason in str(seen.errors[0])
    evil = seen.participations_of("evil")
    assert [p.status for p in evil] == ["rejected"]
    assert reason in (evil[0].reason or "")
    assert seen.detail.rounds[0].status == "committed"
    assert seen.detail.rounds[0].num_succeeded == 2


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
            yield pb.UploadMessage(header=upload_header(task))
            chunks = streams.iter_chunks(GOOD, 8)
            yield pb.UploadMessage(chunk=next(chunks))
            time.sleep(0.3)
            channel.close()  # the connection goes away mid-stream

        call = stub.Submit.future(messages(), metadata=conn._metadata())
        with pytest.raises(grpc.RpcError):
            call.result(timeout=10)

    raw = raw_client(server.port, "flaky", cut, errors)
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
    seen = round_beside_honest_clients(
        tmp_path, serve, "ghost", lambda conn, task: None, wait_s=40, schedule={"deadline_s": 60}
    )
    assert not seen.errors, seen.errors
    ghost = seen.participations_of("ghost")
    assert [p.status for p in ghost] == ["dropped"]
    assert "heartbeats" in (ghost[0].reason or "")
    assert seen.detail.rounds[0].status == "committed"
    assert seen.detail.rounds[0].num_succeeded == 2
