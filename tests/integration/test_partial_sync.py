"""Layer-wise partial synchronization of DiLoCo rounds, end to end.

The test app's ``step_app`` adds ``rate x steps`` to every float tensor (``rate`` = 1 +
partition id; integers get ``+ steps``) and reports ``10 x steps`` examples, so what each
layer group carries after its segment, and the model the server builds from them, are
known exactly. With outer lr 1 and no momentum, DiLoCo's step is the example-weighted
mean of the clients' deltas.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from sqlalchemy import select

from geofl.client.runtime import ClientRuntime
from geofl.protocols import streams
from geofl.protocols.errors import GeoflError
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.config import ConfigError, RunConfig
from geofl.server.simulation.links import LinkModel
from geofl.server.simulation.virtual import run_virtual_simulation
from geofl.storage import open_database, queries
from geofl.storage.models import Node, Participation, Round
from tests.integration.conftest import STORED_DURATION_ABS, final_weights, run_config

LOCAL_STEPS = 4
# tail_segments(4, 2, tail_steps=2): two segments of two steps each.
SEGMENTS = (2, 2)
SAMPLES_PER_S = 100.0
# Bytes of the planner's groups for geofl_testapp:make_model: [w] then [b, steps].
GROUP_BYTES = (4 * 3 * 4, 3 * 4 + 8)
EXPLICIT_GROUPS = [["w"], ["b", "steps"]]
APP = "geofl_testapp:step_app"


def _schedule(**partial: Any) -> dict[str, Any]:
    return {
        "mode": "diloco",
        "deadline_s": 600,
        "wait_for_clients_s": 5,
        "diloco": {"local_steps": LOCAL_STEPS, "outer_lr": 1.0, "outer_momentum": 0.0},
        "partial_sync": {"tail_steps": 2, **(partial or {"sync_points": 2})},
    }


def _virtual(
    tmp_path: Path, rounds: int = 2, node_config: dict[str, Any] | None = None, **partial: Any
) -> RunConfig:
    return run_config(
        tmp_path,
        run={"rounds": rounds},
        strategy={"name": "fedavg", "clients_per_round": 4, "min_clients": 2},
        schedule=_schedule(**partial),
        evaluation={"every": 0, "server": "geofl_testapp:server_evaluate"},
        simulation={
            "clients": 4,
            "app": APP,
            "clock": "virtual",
            "workers": 0,
            # 1 kbit/s up: a 48-byte group occupies the uplink longer than a segment trains.
            "regions": {"near": {"share": 1.0, "rtt_ms": 20, "up_mbps": 0.001, "down_mbps": 40}},
            "compute": {"samples_per_s": SAMPLES_PER_S},
            "node_config": node_config or {},
        },
    )


def _grpc(tmp_path: Path, rounds: int, clients: int, **partial: Any) -> RunConfig:
    schedule = _schedule(**partial) | {"deadline_s": 20, "wait_for_clients_s": 20}
    return run_config(
        tmp_path,
        run={"rounds": rounds},
        strategy={"name": "fedavg", "clients_per_round": clients, "min_clients": 2},
        schedule=schedule,
        evaluation={"every": 0},
    )


def _fits(config: RunConfig) -> list[tuple[Participation, Node, int]]:
    """Every fit participation with its node and round number."""
    with open_database(config.storage.url) as db, db.session() as session:
        rows = session.execute(
            select(Participation, Node, Round.number)
            .join(Node, Participation.node_id == Node.id)
            .join(Round, Participation.round_id == Round.id)
            .where(Participation.kind == "fit")
        )
        fits = [(p, n, int(number)) for p, n, number in rows]
        session.expunge_all()
    return fits


def _detail(config: RunConfig, run_id: int) -> Any:
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        return queries.run_detail(session, run_id)


def _round_count(config: RunConfig) -> int:
    if not Path(config.storage.url.removeprefix("sqlite:///")).exists():
        return 0
    with open_database(config.storage.url) as db, db.session() as session:
        return len(list(session.scalars(select(Round))))


# ---------------------------------------------------------------- virtual clock


def test_group_uploads_overlap_the_remaining_segments(tmp_path: Path) -> None:
    config = _virtual(tmp_path)
    outcome = run_virtual_simulation(config)
    assert outcome.result.status == "completed"
    links = LinkModel.from_config(config.simulation, config.run.seed)
    fits = _fits(config)
    assert len(fits) == 8 and all(p.status == "ok" for p, _, _ in fits)
    for participation, node, _ in fits:
        link = links.link(int(node.name.removeprefix("sim-")))
        assert link.jitter_s == 0 and link.loss == 0  # the closed form below assumes both
        assert participation.bytes_up == sum(GROUP_BYTES)
        download_s = link.fetch_s(participation.bytes_down)
        compute_s = sum(10 * steps for steps in SEGMENTS) / link.samples_per_s
        # One sender: group k goes once its segment has trained and group k-1 is through.
        sender_free = 0.0
        trained = 0.0
        for steps, nbytes in zip(SEGMENTS, GROUP_BYTES, strict=True):
            trained += 10 * steps / link.samples_per_s
            sender_free = max(sender_free, trained) + 8 * nbytes / link.up_bps
        exposed_upload_s = sender_free + link.rtt_s / 2 - compute_s
        expected = download_s + compute_s + exposed_upload_s
        assert participation.duration_s == pytest.approx(expected, abs=STORED_DURATION_ABS)
        assert participation.compute_s == pytest.approx(compute_s, abs=1e-6)
        whole_model_after_compute = (
            download_s + compute_s + link.upload_s(participation.bytes_up or 0)
        )
        assert (participation.duration_s or 0) < whole_model_after_compute - 0.1


def test_groups_sent_early_carry_their_segment_and_the_rest_follows_next_round(
    tmp_path: Path,
) -> None:
    rates = np.array([1.0, 2.0, 3.0, 4.0])
    one_round = _virtual(tmp_path / "planned", rounds=1)
    run_virtual_simulation(one_round)
    weights = final_weights(one_round)
    # Planned groups [w], [b, steps]; equal examples (40 each), so the plain mean of rates.
    np.testing.assert_array_equal(weights["w"], np.full((4, 3), rates.mean() * SEGMENTS[0]))
    np.testing.assert_array_equal(weights["b"], np.full(3, rates.mean() * LOCAL_STEPS))
    assert int(weights["steps"]) == LOCAL_STEPS
    assert {(p.num_examples, p.status) for p, _, _ in _fits(one_round)} == {(40, "ok")}

    two_rounds = _virtual(tmp_path / "explicit", rounds=2, groups=EXPLICIT_GROUPS)
    run_virtual_simulation(two_rounds)
    weights = final_weights(two_rounds)
    # Round 2's w delta is its first segment plus round 1's unsent last segment (kept).
    first_w = rates.mean() * SEGMENTS[0]
    second_w = rates.mean() * (SEGMENTS[0] + SEGMENTS[1])
    np.testing.assert_array_equal(weights["w"], np.full((4, 3), first_w + second_w))
    np.testing.assert_array_equal(weights["b"], np.full(3, 2 * rates.mean() * LOCAL_STEPS))
    assert int(weights["steps"]) == 2 * LOCAL_STEPS


def test_a_client_failing_after_its_first_group_is_a_failed_fit(tmp_path: Path) -> None:
    config = _virtual(tmp_path, rounds=1, node_config={"behaviour": "raise-late"})
    run_virtual_simulation(config)
    fits = _fits(config)
    assert len(fits) == 4
    for participation, _, _ in fits:
        assert participation.status == "failed"
        assert "deliberate failure in the second segment" in (participation.reason or "")
    with open_database(config.storage.url) as db, db.session() as session:
        assert [r.status for r in session.scalars(select(Round))] == ["failed"]


# ---------------------------------------------------------------- gRPC


def test_partial_sync_rounds_over_grpc_keep_the_unsent_progress(tmp_path: Path, serve: Any) -> None:
    config = _grpc(tmp_path, rounds=2, clients=3, groups=EXPLICIT_GROUPS)
    server = serve(config)
    for partition in range(3):
        server.add_client(partition, app=APP)
    result = server.wait()
    assert result.status == "completed"
    mean_rate = (1.0 + 2.0 + 3.0) / 3
    weights = final_weights(config)
    w_expected = mean_rate * SEGMENTS[0] + mean_rate * LOCAL_STEPS
    np.testing.assert_array_equal(weights["w"], np.full((4, 3), w_expected, np.float32))
    np.testing.assert_array_equal(weights["b"], np.full(3, 2 * mean_rate * LOCAL_STEPS))
    assert int(weights["steps"]) == 2 * LOCAL_STEPS
    detail = _detail(config, result.run_id)
    assert [r.status for r in detail.rounds] == ["committed", "committed"]
    fits = [p for p in detail.participations if p.kind == "fit"]
    assert len(fits) == 6
    assert all(p.status == "ok" and p.bytes_up > sum(GROUP_BYTES) for p in fits)
    assert {p.num_examples for p in fits} == {10 * LOCAL_STEPS}


def test_a_client_failing_mid_round_over_grpc_is_a_failed_fit(tmp_path: Path, serve: Any) -> None:
    """Group 0 was already streamed when the app fails: the trailer reports the failure."""
    config = _grpc(tmp_path, rounds=1, clients=3, groups=EXPLICIT_GROUPS)
    server = serve(config)
    for partition in range(2):
        server.add_client(partition, app=APP)
    server.add_client(2, app=APP, behaviour="raise-late")
    result = server.wait()
    assert result.status == "completed"
    detail = _detail(config, result.run_id)
    assert [r.status for r in detail.rounds] == ["committed"]
    fits = sorted((p for p in detail.participations if p.kind == "fit"), key=lambda p: p.status)
    assert [p.status for p in fits] == ["failed", "ok", "ok"]
    assert "deliberate failure in the second segment" in (fits[0].reason or "")
    # Only the two honest clients (rates 1 and 2, equal examples) made the model.
    weights = final_weights(config)
    np.testing.assert_array_equal(weights["b"], np.full(3, 1.5 * LOCAL_STEPS, np.float32))


# ---------------------------------------------------------------- bad input


def test_explicit_groups_that_never_sync_a_tensor_are_refused_before_a_round(
    tmp_path: Path, serve: Any
) -> None:
    virtual = _virtual(tmp_path / "virtual", groups=[["w"], ["b"]])
    with pytest.raises(ConfigError, match=r"never synchronizes tensors \['steps'\]"):
        run_virtual_simulation(virtual)
    assert _round_count(virtual) == 0
    grpc = _grpc(tmp_path / "grpc", rounds=1, clients=2, groups=[["w"], ["b"]])
    with pytest.raises(ConfigError, match=r"'steps'"):
        serve(grpc)
    assert _round_count(grpc) == 0


def test_partial_sync_outside_diloco_is_refused_at_parse_time(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"partial_sync needs schedule\.mode diloco"):
        run_config(tmp_path, schedule={"mode": "sync", "partial_sync": {"sync_points": 2}})


# ---------------------------------------------------------------- servicer protocol


class _ForgedUploads(ClientRuntime):
    """Answers a partial-sync fit with a hand-made stream (node config ``forge``).

    ``no-trailer``: every group in order, but the stream ends without the trailer;
    ``out-of-order``: the second group's tensors first. The server's refusal is kept.
    """

    refusals: ClassVar[dict[str, str]] = {}

    def _handle_overlapped(self, task: pb.Task) -> None:
        forge = str(self._opt.node_config["forge"])
        weights = self._model(task)
        delta = {name: np.ones_like(value) for name, value in weights.items()}
        order = ["w", "b", "steps"] if forge == "no-trailer" else ["b", "steps", "w"]
        header = pb.UploadHeader(
            task_id=task.task_id,
            round=task.round,
            attempt=1,
            update_kind=pb.UPDATE_KIND_DELTA,
            trailer_follows=True,
        )

        def messages() -> Iterator[bytes]:
            yield pb.UploadMessage(header=header).SerializeToString()
            for name in order:
                for chunk in streams.iter_chunks({name: delta[name]}, 1 << 16):
                    yield pb.UploadMessage(chunk=chunk).SerializeToString()

        try:
            self._conn.submit_messages(messages(), timeout=10)
        except GeoflError as exc:
            _ForgedUploads.refusals[forge] = str(exc)
        self.tasks_done += 1


def test_servicer_refuses_uploads_without_trailer_or_out_of_group_order(
    tmp_path: Path, serve: Any
) -> None:
    _ForgedUploads.refusals = {}
    config = _grpc(tmp_path, rounds=1, clients=4, groups=EXPLICIT_GROUPS)
    server = serve(config)
    server.add_client(0, app=APP)
    server.add_client(1, app=APP)
    server.add_client(2, app=APP, runtime_class=_ForgedUploads, forge="no-trailer")
    server.add_client(3, app=APP, runtime_class=_ForgedUploads, forge="out-of-order")
    result = server.wait()
    assert set(_ForgedUploads.refusals) == {"no-trailer", "out-of-order"}
    detail = _detail(config, result.run_id)
    assert detail.rounds[0].status == "committed"
    by_node = {p.node_name: p for p in detail.participations if p.kind == "fit"}
    assert by_node["node-2"].status == "dropped"
    assert "without the trailer" in (by_node["node-2"].reason or "")
    assert by_node["node-3"].status == "rejected"
    assert "expected w: float32[4, 3]" in (by_node["node-3"].reason or "")
    # Only the honest clients (rates 1 and 2) moved the model.
    weights = final_weights(config)
    np.testing.assert_array_equal(weights["b"], np.full(3, 1.5 * LOCAL_STEPS, np.float32))
