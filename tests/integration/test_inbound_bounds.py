"""Out-of-range result headers over real gRPC: a rejected participation, never a crash.

``num_examples = 2**63`` once overflowed ``participations.num_examples`` (a 32-bit
INTEGER) and ended the coordinator. Every figure of an UploadHeader is now bounded
(:mod:`geofl.server.nodes.bounds`); a hostile client is refused with the reason, and the
round commits with the honest clients.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from geofl.client.connection import Connection
from geofl.protocols.errors import ProtocolError
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.protocols.v1 import geofl_pb2_grpc as pb_grpc
from geofl.storage import CheckpointRecord, CheckpointStore, open_database, queries

from .conftest import run_config
from .intruders import GOOD_UPDATE as GOOD
from .intruders import raw_client, round_beside_honest_clients, upload_header


def _with(**fields: Any) -> Any:
    """A header maker: a correct header with ``fields`` (and ``metrics``) set over it."""
    metrics = fields.pop("metrics", {})

    def header(task: pb.Task) -> pb.UploadHeader:
        message = upload_header(task, **fields)
        for key, scalar in metrics.items():
            message.metrics[key].CopyFrom(scalar)
        return message

    return header


BAD_HEADERS = {
    # uint64 on the wire: "negative" counts arrive as huge ones (two's complement).
    "num_examples_2^63": (_with(num_examples=2**63), "num_examples <= 2147483647"),
    "num_examples_negative": (_with(num_examples=2**64 - 5), "num_examples <= 2147483647"),
    "num_examples_2^31": (_with(num_examples=2**31), "got 2147483648"),
    "num_examples_zero": (_with(num_examples=0), "1 <= num_examples"),
    "loss_nan": (_with(loss=float("nan")), "loss must be a finite number"),
    "loss_inf": (_with(loss=float("inf")), "loss must be a finite number"),
    "compute_s_negative": (_with(compute_s=-1.0), "compute_s must be within"),
    "compute_s_nan": (_with(compute_s=float("nan")), "compute_s must be within"),
    "metric_nan": (_with(metrics={"acc": pb.Scalar(double=float("nan"))}), "must be finite"),
    "metric_inf": (_with(metrics={"acc": pb.Scalar(double=float("-inf"))}), "must be finite"),
    "metric_huge_string": (
        _with(metrics={"note": pb.Scalar(string="x" * 1_000_000)}),
        "holds 1000000 bytes, at most 4096",
    ),
    "metric_huge_bytes": (
        _with(metrics={"blob": pb.Scalar(bytes=b"\0" * 100_000)}),
        "holds 100000 bytes",
    ),
    "metric_huge_int": (_with(metrics={"n": pb.Scalar(int=2**62)}), "beyond +-2**53"),
    "metric_long_name": (_with(metrics={"k" * 500: pb.Scalar(int=1)}), "metric name must have"),
    "too_many_metrics": (
        _with(metrics={f"m{i}": pb.Scalar(int=i) for i in range(300)}),
        "300 metrics in one message",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_HEADERS))
def test_out_of_range_header_is_a_rejected_participation(
    tmp_path: Path, serve: Any, case: str
) -> None:
    make_header, reason = BAD_HEADERS[case]
    seen = round_beside_honest_clients(
        tmp_path,
        serve,
        "evil",
        lambda conn, task: conn.submit(make_header(task), GOOD, 1 << 16, 10),
    )
    assert seen.result.status == "completed"
    assert len(seen.errors) == 1 and isinstance(seen.errors[0], ProtocolError), seen.errors
    assert reason in str(seen.errors[0])
    evil = seen.participations_of("evil")
    assert [p.status for p in evil] == ["rejected"]
    assert reason in (evil[0].reason or "")
    assert seen.detail.rounds[0].status == "committed"
    assert seen.detail.rounds[0].num_succeeded == 2


def test_max_examples_per_client_caps_a_clients_weight(tmp_path: Path, serve: Any) -> None:
    """A client claiming 2**31 - 1 examples weighs no more than the cap (10 here)."""
    config = run_config(
        tmp_path,
        run={"rounds": 1},
        evaluation={"every": 0},
        strategy={"clients_per_round": 2, "min_clients": 2, "max_examples_per_client": 10},
    )
    server = serve(config)
    server.add_client(0)  # adds 1 to every float tensor, reports 10 examples
    errors: list[BaseException] = []
    greedy = {**GOOD, "w": np.full((4, 3), 3.0, np.float32), "b": np.full(3, 3.0, np.float32)}
    raw = raw_client(
        server.port,
        "greedy",
        lambda conn, task: conn.submit(_with(num_examples=2**31 - 1)(task), greedy, 1 << 16, 10),
        errors,
    )
    result = server.wait()
    raw.join(10)
    assert result.status == "completed" and not errors, errors
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        detail = queries.run_detail(session, result.run_id)
        row = queries.latest_checkpoint(session, result.run_id)
    assert row is not None
    claimed = {p.node_name: p.num_examples for p in detail.participations}
    assert claimed["greedy"] == 2**31 - 1  # recorded as reported
    weights, _ = CheckpointStore(tmp_path / "ckpt").load(CheckpointRecord.from_row(row))
    # Equal weights (10 and a capped 10): the mean of +1 and +3. Uncapped it would be ~3.
    np.testing.assert_allclose(weights["b"], 2.0, rtol=1e-6)


@pytest.mark.parametrize(
    ("request_fields", "reason"),
    [
        ({"node_name": "n" * 300}, "node_name has 300 characters, at most 200"),
        ({"node_name": "ok", "region": "r" * 150}, "region has 150 characters, at most 100"),
    ],
    ids=["long-name", "long-region"],
)
def test_join_fields_beyond_the_nodes_columns_are_refused(
    tmp_path: Path, serve: Any, request_fields: dict[str, str], reason: str
) -> None:
    config = run_config(
        tmp_path,
        run={"rounds": 1},
        evaluation={"every": 0},
        strategy={"clients_per_round": 1, "min_clients": 1},
    )
    server = serve(config)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    stub = pb_grpc.CoordinatorStub(channel)
    with pytest.raises(grpc.RpcError) as refused:
        stub.Join(pb.JoinRequest(protocol_versions=[1], **request_fields), timeout=5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "GEOFL-E104" in (refused.value.details() or "")
    assert reason in (refused.value.details() or "")
    channel.close()
    server.add_client(0)
    assert server.wait().status == "completed"


def test_nan_poll_timeout_is_answered_not_an_internal_error(tmp_path: Path, serve: Any) -> None:
    config = run_config(
        tmp_path,
        run={"rounds": 1},
        evaluation={"every": 0},
        strategy={"clients_per_round": 2, "min_clients": 2},
        schedule={"wait_for_clients_s": 30},
    )
    server = serve(config)
    conn = Connection(f"127.0.0.1:{server.port}")
    conn.join("poller", None, {}, timeout=5)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    stub = pb_grpc.CoordinatorStub(channel)
    # The client library would derive its own deadline from the NaN: a raw stub instead.
    request = pb.GetTaskRequest(poll_timeout_s=float("nan"))
    task = stub.GetTask(request, metadata=conn._metadata(), timeout=10)
    assert task.kind in (pb.TASK_KIND_WAIT, pb.TASK_KIND_FIT)
    channel.close()
    conn.close()
    server.add_client(0)
    server.add_client(1)
    # The poller never answers a task it is given: a round that selects it fails, and the
    # run fails if every round did. Either way the run ends, and it ends cleanly.
    assert server.wait().status in ("completed", "failed")
