"""Error-feedback state, per-tensor chain rules, and one very large tensor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from geofl.protocols.codecs import (
    CodecError,
    CompressionRules,
    ErrorFeedback,
    chain_for,
    decode_tensor,
    encode_tensor,
    encode_with_feedback,
    parse_chain,
)
from geofl.protocols.errors import NonFiniteError, TensorError

TOPK = parse_chain({"topk": {"k": 2}})


def test_residual_is_what_compression_dropped_and_is_added_back() -> None:
    memory = ErrorFeedback()
    delta = np.array([5.0, -1.0, 0.5, 3.0], np.float32)
    payload = encode_with_feedback(memory, "w", delta, TOPK, seed=0)
    np.testing.assert_array_equal(decode_tensor(payload, TOPK, "float32", (4,)), [5, 0, 0, 3])
    np.testing.assert_array_equal(memory.residual("w"), [0, -1, 0.5, 0])
    corrected = memory.compensate("w", np.zeros(4, np.float32))
    np.testing.assert_array_equal(corrected, [0, -1, 0.5, 0])
    assert corrected.dtype == np.float32
    payload = encode_with_feedback(memory, "w", np.zeros(4, np.float32), TOPK, seed=1)
    np.testing.assert_array_equal(decode_tensor(payload, TOPK, "float32", (4,)), [0, -1, 0.5, 0])
    assert memory.residual_norm() == 0.0


def test_state_survives_a_safetensors_round_trip(tmp_path: Path) -> None:
    memory = ErrorFeedback()
    rng = np.random.default_rng(0)
    for name in ("conv.weight", "fc.weight"):
        encode_with_feedback(
            memory, name, rng.standard_normal((8, 8)).astype(np.float32), TOPK, seed=0
        )
    save_file(memory.state_dict(), str(tmp_path / "ef.safetensors"))
    restored = ErrorFeedback()
    restored.load_state_dict(load_file(str(tmp_path / "ef.safetensors")))
    assert len(restored) == 2 and "fc.weight" in restored
    for name in ("conv.weight", "fc.weight"):
        np.testing.assert_array_equal(restored.residual(name), memory.residual(name))
    restored.reset(["fc.weight"])
    assert "fc.weight" not in restored and "conv.weight" in restored
    restored.reset()
    assert len(restored) == 0 and restored.residual("conv.weight") is None


def test_state_is_validated() -> None:
    memory = ErrorFeedback()
    with pytest.raises(NonFiniteError, match="residual 'w' holds NaN"):
        memory.load_state_dict({"w": np.array([np.nan], np.float32)})
    with pytest.raises(TensorError, match="residual 'w' is int64"):
        memory.load_state_dict({"w": np.array([1])})
    memory.update("w", np.ones(3, np.float32), np.zeros(3, np.float32))
    with pytest.raises(TensorError, match=r"shape \(3,\), the update \(4,\); reset\(\)"):
        memory.compensate("w", np.ones(4, np.float32))
    memory.update("steps", np.array([3]), np.array([2]))  # integers carry no residual
    assert "steps" not in memory


def test_chain_for_uses_threshold_then_globs_then_default() -> None:
    rules = CompressionRules.from_config(
        [{"topk": {"ratio": 0.01}}, {"qsgd": {"bits": 8}}],
        min_bytes=1024,
        overrides={"*.embed*": "fp16", "head.*": None},
    )
    assert chain_for("fc.bias", 512, rules) == ()
    assert chain_for("tok.embedding", 4096, rules) == parse_chain("fp16")
    assert chain_for("head.weight", 4096, rules) == ()
    assert chain_for("fc.weight", 4096, rules) == rules.default
    assert chain_for("fc.weight", 4096, rules, dtype="int64") == ()
    with pytest.raises(CodecError, match="min_bytes must be >= 0"):
        CompressionRules(min_bytes=-1)


@pytest.mark.parametrize("label", ["fp16", "bf16", "qsgd8"])
def test_very_large_tensor_fast_codecs(label: str) -> None:
    """LARGE: 50 M float32 (200 MB) through the fast codecs only (a few seconds each)."""
    steps = parse_chain({"fp16": "fp16", "bf16": "bf16", "qsgd8": {"qsgd": {"bits": 8}}}[label])
    x = np.random.default_rng(0).standard_normal(50_000_000, dtype=np.float32)
    x[-1] = 7.0  # a value in the last (short) block
    payload = encode_tensor(x, steps, seed=0)
    y = decode_tensor(payload, steps, "float32", x.shape)
    tolerance = {"fp16": 2.0**-11, "bf16": 2.0**-8, "qsgd8": 1 / 127}[label]
    scale = np.abs(x) if label != "qsgd8" else np.float32(np.abs(x).max())
    assert (np.abs(y - x) <= tolerance * scale + 1e-7).all()
    assert y[-1] == pytest.approx(7.0, rel=tolerance)
