"""The byte format rejects malformed payloads clearly; the registry and params are complete."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import geofl.protocols.codecs as codecs
from geofl.protocols.codecs import (
    UNSPECIFIED_WIRE_ID,
    CodecError,
    CodecStep,
    chain_to_config,
    codec_by_id,
    decode_tensor,
    encode_tensor,
    parse_chain,
    registered_codecs,
)
from geofl.protocols.codecs.wire import serialize
from geofl.protocols.errors import NonFiniteError, ProtocolError

from .test_codecs_strategies import CODEC_CONFIGS, chain

U64 = "<u8"


def decode(payload: bytes, label: str, shape: tuple[int, ...] = (10,)) -> npt.NDArray[np.generic]:
    return decode_tensor(payload, chain(label), "float32", shape)


def crafted(wire_id: int, arrays: dict[str, npt.NDArray[np.generic]]) -> bytes:
    return serialize([wire_id], arrays)


def test_codec_error_is_a_protocol_error_and_a_value_error() -> None:
    assert issubclass(CodecError, ProtocolError) and issubclass(CodecError, ValueError)


def test_every_registered_codec_has_unique_name_id_and_a_contract_config() -> None:
    names = [codec.name for codec in registered_codecs()]
    ids = [codec.wire_id for codec in registered_codecs()]
    assert len(set(names)) == len(names) and len(set(ids)) == len(ids)
    assert UNSPECIFIED_WIRE_ID not in ids and all(1 <= i <= 255 for i in ids)
    configured = {step.name for label in CODEC_CONFIGS for step in chain(label)}
    assert configured == set(names), "add a CODEC_CONFIGS entry for each new codec"
    for codec in registered_codecs():
        assert codec_by_id(codec.wire_id) is codec
    for label in CODEC_CONFIGS:
        for step in chain(label):
            assert CodecStep.from_wire(step.codec.wire_id, step.params) == step


def test_wire_ids_are_frozen() -> None:
    """Wire ids are part of the protocol: changing one breaks every deployed peer."""
    assert {c.name: c.wire_id for c in registered_codecs()} == {
        "none": 1,
        "fp16": 2,
        "bf16": 3,
        "qsgd": 4,
        "topk": 5,
        "randk": 6,
        "powersgd": 7,
        "sign": 8,
    }


def test_public_names_exist() -> None:
    for name in codecs.__all__:
        assert hasattr(codecs, name), name


def test_unknown_codec_id_and_name_are_rejected() -> None:
    with pytest.raises(CodecError, match="unknown codec id 99"):
        CodecStep.from_wire(99, {})
    with pytest.raises(CodecError, match=r"unknown codec 'zstd'; known codecs: \["):
        parse_chain("zstd")
    payload = bytearray(encode_tensor(np.ones(10, np.float32), chain("qsgd8"), seed=0))
    payload[5] = 99  # the first wire id in the header
    with pytest.raises(CodecError, match=r"codec ids \[99\], expected \[4\]"):
        decode(bytes(payload), "qsgd8")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"qsgd": {"bits": 3}}, r"'bits' must be one of \[8, 4, 2\], got 3"),
        ({"qsgd": {"bits": True}}, r"'bits' must be one of"),
        ({"qsgd": {"block": 12}}, r"'block' must be a multiple of 8"),
        ({"qsgd": {"levels": 3}}, r"unknown parameter 'levels'; allowed: \['bits', 'block'"),
        ({"topk": {}}, r"exactly one of 'ratio' .* or 'k'"),
        ({"topk": {"ratio": 0.1, "k": 3}}, r"exactly one of"),
        ({"topk": {"ratio": 0.0}}, r"'ratio' must be > 0"),
        ({"topk": {"ratio": 1.5}}, r"'ratio' must be a float in 0.0..1.0"),
        ({"randk": {"ratio": float("nan")}}, r"'ratio' must be"),
        ({"powersgd": {"rank": 0}}, r"'rank' must be an? int in 1..4096"),
        ({"sign": {"block": "8"}}, r"'block' must be"),
    ],
)
def test_bad_params_name_the_parameter_and_allowed_values(config: object, message: str) -> None:
    with pytest.raises(CodecError, match=message):
        parse_chain(config)


def test_params_are_normalized_and_round_trip_through_config() -> None:
    steps = parse_chain([{"topk": {"ratio": 1}}, {"qsgd": {"bits": 4}}])
    assert dict(steps[0].params) == {"ratio": 1.0}
    assert dict(steps[1].params) == {"bits": 4, "block": 512, "stochastic": True}
    assert parse_chain(chain_to_config(steps)) == steps
    assert hash(steps[1]) == hash(CodecStep("qsgd", {"bits": 4, "block": 512}))


def test_value_codecs_must_follow_reshaping_codecs() -> None:
    with pytest.raises(CodecError, match="'topk' must come before value codec 'qsgd'"):
        parse_chain([{"qsgd": {}}, {"topk": {"k": 1}}])
    with pytest.raises(CodecError, match="at most 8 steps"):
        parse_chain(["none"] * 9)


def test_truncated_padded_and_foreign_payloads_are_rejected() -> None:
    payload = encode_tensor(np.ones(10, np.float32), chain("qsgd8"), seed=0)
    for cut in (3, 6, 12, len(payload) - 1):
        with pytest.raises(CodecError, match=r"truncated|magic"):
            decode(payload[:cut], "qsgd8")
    with pytest.raises(CodecError, match="1 bytes after its data"):
        decode(payload + b"\0", "qsgd8")
    with pytest.raises(CodecError, match="not a geofl compressed payload"):
        decode(b"\x80\x04pickle", "qsgd8")


def test_payload_for_another_shape_is_rejected() -> None:
    payload = encode_tensor(np.ones(10, np.float32), chain("fp16"), seed=0)
    with pytest.raises(CodecError, match="holds 10 elements, expected 12"):
        decode(payload, "fp16", (3, 4))
    payload = encode_tensor(np.ones(100, np.float32), chain("topk"), seed=0)
    with pytest.raises(CodecError, match="claims 100 elements, more than the tensor's 10"):
        decode(payload, "topk", (10,))


def topk_arrays(index_part: str, index: npt.NDArray[np.generic], n: int = 10) -> bytes:
    return crafted(
        5,
        {
            "x.s0.val": np.ones(2, np.float32),
            f"x.s0.{index_part}": index,
            "x.s0.shape": np.array([n], U64),
        },
    )


@pytest.mark.parametrize(
    ("part", "index", "message"),
    [
        ("gap", np.array([3, 6], np.uint8), r"index 10 out of range for 10 elements"),
        ("gap", np.array([3, 250], np.uint8), r"run past|out of range"),
        ("gap", np.array([3], np.uint8), r"2 unsigned ints"),
        ("gap", np.array([1.0, 2.0], np.float32), r"unsigned ints"),
        ("vgap", np.array([0x83, 0x00, 1], np.uint8), r"overlong or non-canonical"),
        ("vgap", np.array([1, 0x81], np.uint8), r"exactly 2 values"),
        ("vgap", np.array([1, 200], np.uint8), r"exactly 2 values|range"),
        ("bmp", np.array([0b11, 0b100], np.uint8), r"bits set past the tensor's end"),
        ("bmp", np.array([0b111, 0], np.uint8), r"selects 3 positions, expected 2"),
        ("bmp", np.array([0b11], np.uint8), r"bitmap must be 2 bytes"),
        ("idx", np.array([1, 2], np.uint8), r"unexpected part 'idx'"),
    ],
)
def test_malformed_topk_indices_are_rejected(
    part: str, index: npt.NDArray[np.generic], message: str
) -> None:
    with pytest.raises(CodecError, match=message):
        decode(topk_arrays(part, index), "topk-k")


def test_wellformed_crafted_topk_decodes() -> None:
    y = decode(topk_arrays("gap", np.array([3, 5], np.uint8)), "topk-k")
    np.testing.assert_array_equal(np.flatnonzero(y), [3, 9])


def qsgd_arrays(scale: float, codes: npt.NDArray[np.uint8]) -> bytes:
    return crafted(
        4,
        {
            "x.s0.q": codes,
            "x.s0.scale": np.array([scale], np.float32),
            "x.s0.shape": np.array([10], U64),
        },
    )


@pytest.mark.parametrize(
    ("scale", "codes", "message"),
    [
        (float("nan"), np.full(10, 127, np.uint8), r"scales must be finite and >= 0"),
        (-1.0, np.full(10, 127, np.uint8), r"scales must be finite and >= 0"),
        (1.0, np.full(10, 255, np.uint8), r"code 255 exceeds 254"),
        (1.0, np.full(9, 127, np.uint8), r"hold 9 bytes, expected 10"),
    ],
)
def test_malformed_qsgd_payloads_are_rejected(
    scale: float, codes: npt.NDArray[np.uint8], message: str
) -> None:
    steps = parse_chain({"qsgd": {"bits": 8, "block": 16}})
    with pytest.raises(CodecError, match=message):
        decode_tensor(qsgd_arrays(scale, codes), steps, "float32", (10,))


def test_non_finite_inputs_are_refused_at_encode() -> None:
    x = np.array([1.0, np.nan, 2.0], np.float32)
    for label in ("fp16", "bf16", "qsgd8", "topk", "randk", "sign"):
        with pytest.raises(NonFiniteError):
            encode_tensor(np.resize(x, 12), chain(label), seed=0)
    with pytest.raises(ValueError, match="overflows"):
        encode_tensor(np.array([7e4], np.float32), chain("fp16"), seed=0)


@settings(deadline=None, max_examples=300)
@given(
    st.sampled_from(sorted(CODEC_CONFIGS)),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    st.integers(0, 10_000),
)
def test_corrupted_payloads_decode_or_raise_codec_error(
    label: str, flips: list[tuple[int, int]], cut: int
) -> None:
    """Fuzz: arbitrary byte changes never crash the decoder with anything else."""
    x = np.random.default_rng(0).standard_normal((6, 9)).astype(np.float32)
    payload = bytearray(encode_tensor(x, chain(label), seed=3))
    for position, value in flips:
        payload[position % len(payload)] = value
    if cut % 3 == 0:
        payload = payload[: cut % len(payload)]
    try:
        y = decode_tensor(bytes(payload), chain(label), "float32", (6, 9))
    except CodecError:
        return
    assert y.shape == (6, 9) and y.dtype == np.float32
