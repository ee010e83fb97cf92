"""The client's upload compressor: error feedback kept across restarts, reset by rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from geofl.client.compressor import UploadCompressor
from geofl.protocols.codecs import decode_tensor, parse_chain
from geofl.protocols.compression import UploadPlan
from geofl.protocols.tensors import EncodedTensor

PLAN = UploadPlan(
    parse_chain({"topk": {"ratio": 0.1}}), min_bytes=0, error_feedback=True, max_staleness=2
)
DELTA = {"w": np.linspace(-1, 1, 100, dtype=np.float32), "b": np.ones(2, np.float32)}


def _decoded(item: object) -> np.ndarray:
    assert isinstance(item, EncodedTensor)
    return decode_tensor(item.payload, item.chain, item.dtype, item.shape)


def test_residual_is_what_compression_dropped(tmp_path: Path) -> None:
    compressor = UploadCompressor(tmp_path / "state.safetensors")
    sent, size = compressor.encode(DELTA, PLAN, run_id=1, round_number=1, seed=3)
    decoded = _decoded(sent["w"])
    assert np.count_nonzero(decoded) == 10
    np.testing.assert_allclose(compressor.feedback.residual("w"), DELTA["w"] - decoded)
    assert size == sum(len(v.payload) for v in sent.values() if isinstance(v, EncodedTensor))


def test_residual_survives_a_restart_and_is_added_to_the_next_update(tmp_path: Path) -> None:
    path = tmp_path / "state.safetensors"
    first = UploadCompressor(path)
    first.encode(DELTA, PLAN, run_id=1, round_number=1, seed=3)
    residual = first.feedback.residual("w")
    restarted = UploadCompressor(path)
    np.testing.assert_array_equal(restarted.feedback.residual("w"), residual)
    zero = {"w": np.zeros(100, np.float32), "b": np.zeros(2, np.float32)}
    sent, _ = restarted.encode(zero, PLAN, run_id=1, round_number=2, seed=4)
    assert np.count_nonzero(_decoded(sent["w"])) == 10  # the residual is being sent


def test_residual_resets_when_stale_or_for_another_run(tmp_path: Path) -> None:
    compressor = UploadCompressor(tmp_path / "state.safetensors")
    compressor.encode(DELTA, PLAN, run_id=1, round_number=1, seed=3)
    zero = {"w": np.zeros(100, np.float32), "b": np.zeros(2, np.float32)}
    sent, _ = compressor.encode(zero, PLAN, run_id=1, round_number=4, seed=4)  # 3 > 2 rounds
    assert np.count_nonzero(_decoded(sent["w"])) == 0
    compressor.encode(DELTA, PLAN, run_id=1, round_number=5, seed=5)
    sent, _ = compressor.encode(zero, PLAN, run_id=2, round_number=6, seed=6)
    assert np.count_nonzero(_decoded(sent["w"])) == 0


def test_small_and_integer_tensors_travel_raw(tmp_path: Path) -> None:
    plan = UploadPlan(parse_chain("fp16"), min_bytes=64)
    delta = {
        "big": np.ones(100, np.float32),
        "small": np.ones(3, np.float32),
        "count": np.ones(100, np.int64),
    }
    sent, _ = UploadCompressor().encode(delta, plan, run_id=1, round_number=1, seed=1)
    assert isinstance(sent["big"], EncodedTensor)
    assert not isinstance(sent["small"], EncodedTensor)
    assert not isinstance(sent["count"], EncodedTensor)


def test_corrupt_state_file_costs_only_the_residual(tmp_path: Path) -> None:
    path = tmp_path / "state.safetensors"
    path.write_bytes(b"not a safetensors file")
    compressor = UploadCompressor(path)
    assert len(compressor.feedback) == 0
    compressor.encode(DELTA, PLAN, run_id=1, round_number=1, seed=1)
    assert UploadCompressor(path).last_round == 1
