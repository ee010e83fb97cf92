"""Flower messages on geofl's wire: RecordDicts round-trip exactly; every fault is named."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from geofl.protocols import streams
from geofl.protocols.errors import ErrorCode, ProtocolError, TensorError
from geofl.protocols.tensors import SUPPORTED_DTYPES
from geofl.protocols.v1 import geofl_pb2 as pb

with warnings.catch_warnings():  # flwr's import chain trips deprecation warnings (click)
    warnings.simplefilter("ignore", DeprecationWarning)
    flwr_app = pytest.importorskip("flwr.app")

from geofl.protocols.flower import (
    MAX_CONTENT_BYTES,
    arrays_to_tensors,
    error_from_wire,
    error_to_wire,
    layout_to_wire,
    records_from_wire,
)

Array, ArrayRecord = flwr_app.Array, flwr_app.ArrayRecord
ConfigRecord, MetricRecord, RecordDict = (
    flwr_app.ConfigRecord,
    flwr_app.MetricRecord,
    flwr_app.RecordDict,
)

arrays = st.sampled_from(SUPPORTED_DTYPES).flatmap(
    lambda dt: hnp.arrays(np.dtype(dt), hnp.array_shapes(min_dims=0, max_dims=3, max_side=5))
)
keys = st.text(min_size=1, max_size=6)
array_records = st.dictionaries(keys, arrays, max_size=3)


def _through_the_wire(records: RecordDict) -> RecordDict:
    """Serialize the layout, stream the tensors in small chunks, and rebuild."""
    content = pb.FlowerContent.FromString(layout_to_wire(records, "train", "3").SerializeToString())
    sink = streams.ArraySink()
    assembler = streams.Assembler(sink)
    for chunk in streams.iter_chunks(arrays_to_tensors(records), 16):
        assembler.feed(pb.TensorChunk.FromString(chunk.SerializeToString()))
    assembler.finish()
    return records_from_wire(content, sink.weights)


def _mixed() -> RecordDict:
    return RecordDict(
        {
            "config": ConfigRecord({"lr": 0.1, "name": "x", "blob": b"\x00\x01", "ks": [1, 2]}),
            "arrays": ArrayRecord({"w": Array(np.ones((2, 3), np.float32))}),
            "metrics": MetricRecord({"num-examples": 10, "loss": [0.5, 0.25]}),
            "extra": ArrayRecord({"b": Array(np.arange(3, dtype=np.int64))}),
        }
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(array_records, max_size=3))
def test_array_records_round_trip_bit_exactly(records: list[dict[str, np.ndarray]]) -> None:
    sent = RecordDict(
        {f"r{i}": ArrayRecord({k: Array(v) for k, v in r.items()}) for i, r in enumerate(records)}
    )
    got = _through_the_wire(sent)
    assert list(got.keys()) == list(sent.keys())
    for key, record in sent.array_records.items():
        assert list(got[key].keys()) == list(record.keys())
        for name, array in record.items():
            want, have = array.numpy(), got[key][name].numpy()
            assert have.dtype == want.dtype and have.shape == want.shape
            assert have.tobytes() == want.tobytes()


def test_mixed_records_keep_order_types_and_values() -> None:
    got = _through_the_wire(_mixed())
    assert list(got.keys()) == ["config", "arrays", "metrics", "extra"]
    assert dict(got["config"]) == {"lr": 0.1, "name": "x", "blob": b"\x00\x01", "ks": [1, 2]}
    assert dict(got["metrics"]) == {"num-examples": 10, "loss": [0.5, 0.25]}
    np.testing.assert_array_equal(got["extra"]["b"].numpy(), np.arange(3))


def test_errors_travel_instead_of_content() -> None:
    content = error_to_wire(flwr_app.Error(2, "boom"), "evaluate", "1")
    error = error_from_wire(pb.FlowerContent.FromString(content.SerializeToString()))
    assert error is not None and (error.code, error.reason) == (2, "boom")
    assert error_from_wire(layout_to_wire(_mixed(), "train", "1")) is None


def test_unsupported_dtype_is_named_with_what_to_do() -> None:
    records = RecordDict({"arrays": ArrayRecord({"c": Array(np.zeros(2, np.uint64))})})
    with pytest.raises(
        TensorError, match=r"array 'c' of ArrayRecord 'arrays' has dtype uint64.*astype"
    ):
        arrays_to_tensors(records)


def test_oversized_config_records_are_refused() -> None:
    records = RecordDict({"config": ConfigRecord({"blob": b"x" * (MAX_CONTENT_BYTES + 1)})})
    with pytest.raises(TensorError, match="put bulk data in an ArrayRecord") as raised:
        layout_to_wire(records, "train", "")
    assert raised.value.code is ErrorCode.TOO_LARGE


def test_missing_extra_and_misordered_parts_are_protocol_errors() -> None:
    records = _mixed()
    content, tensors = layout_to_wire(records, "train", ""), arrays_to_tensors(records)
    with pytest.raises(ProtocolError, match=r"tensor '0.0' \(array 'w'\) did not arrive"):
        records_from_wire(content, {k: v for k, v in tensors.items() if k != "0.0"})
    with pytest.raises(ProtocolError, match=r"tensors \['9.9'\] are not in the message's layout"):
        records_from_wire(content, {**tensors, "9.9": np.zeros(1)})
    content.record_order.append("config")
    with pytest.raises(ProtocolError, match="record_order"):
        records_from_wire(content, tensors)
    content.ClearField("record_order")
    content.records = b"\xff\xff"
    with pytest.raises(ProtocolError, match="not a Flower RecordDict"):
        records_from_wire(content, tensors)
