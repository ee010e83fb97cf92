"""Compressed uploads and broadcasts over real gRPC: bytes, exactness, bad payloads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from geofl.client.connection import Connection
from geofl.protocols.codecs import encode_tensor, parse_chain
from geofl.protocols.errors import ProtocolError
from geofl.protocols.tensors import EncodedTensor
from geofl.protocols.v1 import geofl_pb2 as pb

from .conftest import final_weights, run_config
from .intruders import round_beside_honest_clients, upload_header
from .test_rounds import _detail


def test_quantized_uploads_with_error_feedback(tmp_path: Path, serve: Any) -> None:
    config = run_config(
        tmp_path,
        run={"rounds": 3},
        evaluation={"every": 0, "server": None},
        model="geofl_testapp:make_large_model",
        strategy={"clients_per_round": 2, "min_clients": 2},
        compression={"up": [{"qsgd": {"bits": 8}}], "error_feedback": True},
    )
    server = serve(config)
    server.add_client(0, app="geofl_testapp:shift_app")
    server.add_client(1, app="geofl_testapp:shift_app")
    result = server.wait()
    detail = _detail(config, result.run_id)
    assert [r.status for r in detail.rounds] == ["committed"] * 3
    for r in detail.rounds:
        # 8-bit codes for the 24 MB tensor: a quarter of the bytes, plus per-block scales.
        assert r.bytes_up < 0.27 * r.bytes_up_raw
        assert r.bytes_up_raw > 2 * 24_000_000
    # Each client adds 1 or 2 per round: 1.5 per round on average, within 8-bit error.
    weights = final_weights(config, result.run_id)
    np.testing.assert_allclose(weights["big"], 4.5, atol=0.05)
    assert abs(float(weights["big"].mean()) - 4.5) < 1e-3  # unbiased rounding


def test_compressed_broadcasts_are_exact_differences(tmp_path: Path, serve: Any) -> None:
    config = run_config(
        tmp_path,
        run={"rounds": 3},
        evaluation={"every": 1, "server": None},
        model="geofl_testapp:make_large_model",
        strategy={"clients_per_round": 2, "min_clients": 2},
        compression={"down": "fp16"},
    )
    server = serve(config)
    runtimes = [server.add_client(i, app="geofl_testapp:shift_app") for i in range(2)]
    result = server.wait()
    detail = _detail(config, result.run_id)

    def downloads(kind: str, number: int) -> list[Any]:
        return [p for p in detail.participations if p.kind == kind and p.round_number == number]

    # Round 1's fit starts from nothing cached: a full, exact download.
    assert all(p.bytes_down >= p.bytes_down_raw > 24_000_000 for p in downloads("fit", 1))
    for number in (1, 2, 3):
        # Evaluating version r, the clients hold version r - 1: fp16 differences.
        assert all(
            0 < p.bytes_down < 0.55 * p.bytes_down_raw for p in downloads("evaluate", number)
        )
    for number in (2, 3):
        # The next fit trains the version just evaluated: nothing to download.
        assert all(p.bytes_down == 0 for p in downloads("fit", number))
    store = server.coordinator._state.models
    chain = parse_chain("fp16")
    for runtime in runtimes:
        version, held = runtime._cache  # what the client reconstructed
        view = store.view(version, chain)
        if view is not None:  # the last version is still published
            for name in held:
                np.testing.assert_array_equal(held[name], view[name])
    # The server's model stays exact: 1.5 per round from exact client deltas.
    np.testing.assert_allclose(final_weights(config, result.run_id)["big"], 4.5, atol=2e-3)


def test_undecodable_payload_is_rejected_and_recorded(tmp_path: Path, serve: Any) -> None:
    chain = parse_chain({"qsgd": {"bits": 8}})
    good = encode_tensor(np.ones((4, 3), np.float32), chain, seed=1)

    def send_garbage(conn: Connection, task: pb.Task) -> None:
        tensors = {
            "w": EncodedTensor(good[: len(good) // 2], chain, "float32", (4, 3)),
            "b": np.ones(3, np.float32),
            "steps": np.ones((), np.int64),
        }
        header = upload_header(task, payload_bytes=len(good) // 2 + 12 + 8)
        conn.submit(header, tensors, 1 << 16, 10)

    seen = round_beside_honest_clients(tmp_path, serve, "garbage", send_garbage)
    # The update is decoded when it is staged (before the ack, storage.stage_uploads), so
    # the client hears the refusal; without staging, decoding fails later, at the fold.
    assert len(seen.errors) == 1 and "compressed payload" in str(seen.errors[0]), seen.errors
    bad = seen.participations_of("garbage")
    assert [p.status for p in bad] == ["rejected"]
    assert "w" in (bad[0].reason or "") or "payload" in (bad[0].reason or "")
    assert seen.detail.rounds[0].num_succeeded == 2


def test_unknown_codec_on_the_wire_is_refused(tmp_path: Path, serve: Any) -> None:
    def unknown_codec(conn: Connection, task: pb.Task) -> None:
        from geofl.protocols import streams

        chunks = list(
            streams.iter_chunks(
                {"w": EncodedTensor(b"\x00" * 16, parse_chain("fp16"), "float32", (4, 3))}, 1 << 16
            )
        )
        chunks[0].encoding.steps[0].codec = 99  # type: ignore[assignment]
        header = upload_header(task)
        messages = [pb.UploadMessage(header=header).SerializeToString()]
        messages += [pb.UploadMessage(chunk=c).SerializeToString() for c in chunks]
        with pytest.raises(ProtocolError, match="unknown codec id 99"):
            try:
                conn._submit(iter(messages), metadata=conn._metadata(), timeout=10)
            except Exception as exc:
                from geofl.client.connection import translate

                raise translate(exc) from exc  # type: ignore[arg-type]

    seen = round_beside_honest_clients(tmp_path, serve, "garbage", unknown_codec)
    assert not seen.errors, seen.errors  # the refusal was the one expected
    assert [p.status for p in seen.participations_of("garbage")] == ["rejected"]
    assert seen.detail.rounds[0].status == "committed"
    assert seen.detail.rounds[0].num_succeeded == 2


def test_runs_show_reports_compression_per_round_and_region(tmp_path: Path) -> None:
    from .processes import run_geofl, write_config

    config = write_config(
        tmp_path,
        model="geofl_testapp:make_large_model",
        evaluation={"every": 0},
        compression={
            "up": [{"qsgd": {"bits": 4}}],
            "min_bytes": 0,
            "regions": {"eu": {"up": "fp16"}},
        },
        simulation={"app": "geofl_testapp:shift_app", "node_config": {}},
    )
    run = run_geofl(tmp_path, "simulate", "-c", str(config), "--set", "run.rounds=1")
    assert run.returncode == 0, run.stderr
    db = f"sqlite:///{tmp_path / 'runs' / 'geofl.db'}"
    shown = run_geofl(tmp_path, "runs", "show", "1", "--db", db)
    assert "traffic by region" in shown.stdout
    detail = json.loads(run_geofl(tmp_path, "runs", "show", "1", "--db", db, "--json").stdout)
    (round_,) = detail["rounds"]
    ratio = round_["bytes_up"] / round_["bytes_up_raw"]
    assert 0.12 < ratio < 0.14  # 4-bit codes plus per-block scales


def test_region_overrides_choose_each_clients_codecs(tmp_path: Path, serve: Any) -> None:
    config = run_config(
        tmp_path,
        run={"rounds": 2},
        evaluation={"every": 0, "server": None},
        model="geofl_testapp:make_large_model",
        strategy={"clients_per_round": 2, "min_clients": 2},
        compression={
            "up": [{"qsgd": {"bits": 4}}],
            "down": "fp16",
            "regions": {"eu": {"up": "fp16", "down": []}},
        },
    )
    server = serve(config)
    server.add_client(0, app="geofl_testapp:shift_app", region="eu")
    server.add_client(1, app="geofl_testapp:shift_app", region="ap")
    result = server.wait()
    detail = _detail(config, result.run_id)
    for p in detail.participations:
        ratio = p.bytes_up / p.bytes_up_raw
        if p.node_region == "eu":
            assert 0.49 < ratio < 0.51  # fp16
        else:
            assert 0.12 < ratio < 0.14  # 4-bit
    eu_round2 = [p for p in detail.participations if p.round_number == 2 and p.node_region == "eu"]
    ap_round2 = [p for p in detail.participations if p.round_number == 2 and p.node_region == "ap"]
    assert eu_round2[0].bytes_down >= eu_round2[0].bytes_down_raw  # eu: uncompressed broadcast
    assert ap_round2[0].bytes_down < 0.55 * ap_round2[0].bytes_down_raw  # ap: fp16 difference
