"""Flower messages on geofl's wire: a ``RecordDict`` as ``FlowerContent`` plus named tensors.

A Flower message's arrays never travel inside one gRPC message.  Array ``j`` of the
``i``-th ArrayRecord becomes the tensor named ``"i.j"`` and streams in chunks like any
model (a Download of the task's model version, or a Submit with ``UPDATE_KIND_FULL``);
:class:`pb.FlowerContent` carries the rest: the message type, the group id, the
ConfigRecords and MetricRecords (Flower's own protobuf serde, never pickle) and the
layout that rebuilds the RecordDict in its order.  Server and client both call this
module, so the two sides cannot disagree on the layout.  It needs ``flwr``; nothing
else in :mod:`geofl.protocols` imports it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, MetricRecord, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoFlowerRecordDict
from google.protobuf.message import DecodeError

from geofl.protocols.errors import ErrorCode, ProtocolError, TensorError
from geofl.protocols.tensors import SUPPORTED_DTYPES
from geofl.protocols.types import Weights
from geofl.protocols.v1 import geofl_pb2 as pb

#: Largest serialized FlowerContent (config and metric records): it rides in one gRPC
#: message, whose receive limit is 8 MiB on both sides.  Bulk data belongs in arrays.
MAX_CONTENT_BYTES = 4 << 20

_NUMPY_STYPE = "numpy.ndarray"


def tensor_name(record_index: int, array_index: int) -> str:
    """The wire name of array ``array_index`` of the ``record_index``-th ArrayRecord."""
    return f"{record_index}.{array_index}"


def array_records(records: RecordDict) -> list[tuple[str, ArrayRecord]]:
    """The ArrayRecords of ``records`` in order, with their keys."""
    return [(key, value) for key, value in records.items() if isinstance(value, ArrayRecord)]


def layout_to_wire(records: RecordDict, message_type: str, group_id: str) -> pb.FlowerContent:
    """Everything of a message but its arrays' data.

    Raises
    ------
    TensorError
        If the config and metric records exceed :data:`MAX_CONTENT_BYTES`.
    """
    content = pb.FlowerContent(message_type=message_type, group_id=group_id)
    others = RecordDict()
    for key, record in records.items():
        content.record_order.append(key)
        if isinstance(record, ArrayRecord):
            content.array_records.add(key=key, array_keys=list(record.keys()))
        else:
            others[key] = record
    content.records = recorddict_to_proto(others).SerializeToString()
    _check_size(content)
    return content


def error_to_wire(error: Error, message_type: str, group_id: str) -> pb.FlowerContent:
    """A reply that carries a Flower :class:`Error` instead of content."""
    content = pb.FlowerContent(message_type=message_type, group_id=group_id)
    content.error.code = int(error.code)
    content.error.reason = (error.reason or "")[: MAX_CONTENT_BYTES // 2]
    return content


def _check_size(content: pb.FlowerContent) -> None:
    size = content.ByteSize()
    if size > MAX_CONTENT_BYTES:
        raise TensorError(
            f"the message's config and metric records take {size} bytes; geofl sends them in "
            f"one gRPC message (limit {MAX_CONTENT_BYTES} bytes): put bulk data in an "
            "ArrayRecord, whose arrays stream in chunks",
            code=ErrorCode.TOO_LARGE,
        )


def _as_numpy(record_key: str, array_key: str, array: Array) -> np.ndarray:
    where = f"array {array_key!r} of ArrayRecord {record_key!r}"
    if array.stype != _NUMPY_STYPE:
        raise TensorError(f"{where} is serialized as {array.stype!r}; geofl carries numpy arrays")
    values = array.numpy()
    if values.dtype.name not in SUPPORTED_DTYPES:
        raise TensorError(
            f"{where} has dtype {values.dtype}; geofl carries {', '.join(SUPPORTED_DTYPES)}: "
            "convert it (e.g. .astype('float32')) before sending"
        )
    return values


def arrays_to_tensors(records: RecordDict) -> Weights:
    """The arrays of ``records`` as numpy tensors named by :func:`tensor_name`.

    Raises
    ------
    TensorError
        If an array is not a numpy array or has a dtype geofl does not carry.
    """
    tensors: Weights = {}
    for i, (record_key, record) in enumerate(array_records(records)):
        for j, (array_key, array) in enumerate(record.items()):
            tensors[tensor_name(i, j)] = _as_numpy(record_key, array_key, array)
    return tensors


def _other_records(content: pb.FlowerContent) -> RecordDict:
    try:
        proto = ProtoFlowerRecordDict.FromString(content.records)
        records = recorddict_from_proto(proto)
    except (DecodeError, ValueError) as exc:
        raise ProtocolError(f"FlowerContent.records is not a Flower RecordDict: {exc}") from exc
    for key, record in records.items():
        if not isinstance(record, ConfigRecord | MetricRecord):
            raise ProtocolError(f"FlowerContent.records holds {type(record).__name__} {key!r}")
    return records


def _rebuilt_arrays(
    content: pb.FlowerContent, tensors: Mapping[str, np.ndarray]
) -> dict[str, ArrayRecord]:
    rebuilt: dict[str, ArrayRecord] = {}
    expected: set[str] = set()
    for i, layout in enumerate(content.array_records):
        record = ArrayRecord()
        for j, array_key in enumerate(layout.array_keys):
            name = tensor_name(i, j)
            if name not in tensors:
                raise ProtocolError(f"tensor {name!r} (array {array_key!r}) did not arrive")
            expected.add(name)
            record[array_key] = Array(np.asarray(tensors[name]))
        rebuilt[layout.key] = record
    extra = sorted(set(tensors) - expected)
    if extra:
        raise ProtocolError(f"tensors {extra} are not in the message's layout")
    return rebuilt


def records_from_wire(content: pb.FlowerContent, tensors: Mapping[str, np.ndarray]) -> RecordDict:
    """Rebuild the RecordDict from its wire layout and the tensors that streamed.

    Raises
    ------
    ProtocolError
        If the records do not parse, a tensor is missing or extra, or the key order
        does not name every record exactly once.
    """
    others = _other_records(content)
    arrays = _rebuilt_arrays(content, tensors)
    order = list(content.record_order)
    known = set(arrays) | set(others.keys())
    if len(order) != len(set(order)) or set(order) != known or len(known) != len(order):
        raise ProtocolError(
            f"FlowerContent.record_order {order} does not name each record once ({sorted(known)})"
        )
    result = RecordDict()
    for key in order:
        result[key] = arrays[key] if key in arrays else others[key]
    return result


def error_from_wire(content: pb.FlowerContent) -> Error | None:
    """The Flower :class:`Error` a reply carries, if any."""
    if not content.HasField("error"):
        return None
    return Error(code=int(content.error.code), reason=content.error.reason or None)


__all__ = [
    "MAX_CONTENT_BYTES",
    "array_records",
    "arrays_to_tensors",
    "error_from_wire",
    "error_to_wire",
    "layout_to_wire",
    "records_from_wire",
    "tensor_name",
]
