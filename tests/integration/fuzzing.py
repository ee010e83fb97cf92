"""Hypothesis strategies that mutate the coordinator's wire messages, and a raw RPC driver.

Two kinds of mutation, both starting from a message a correct client would send:

- *field* mutations overwrite some fields of the message with hostile values of the
  field's own type (extreme integers, NaN and infinities, huge or odd strings, unknown
  enum numbers, random sub-messages), so the message still parses and reaches the
  handler's checks;
- *byte* mutations damage the serialized bytes (truncation, flipped bytes, inserted
  garbage, random bytes), so parsing itself is attacked.

:class:`RawPeer` sends such bytes to a server with no client library in the way and
tallies the statuses that came back.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from geofl.protocols import streams
from geofl.protocols.errors import ErrorCode, error_from_details
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.transport.servicer import SERVICE_NAME, SESSION_METADATA_KEY

from .intruders import upload_header

MAX_STRING = 5_000

_INT_EDGES = {
    FieldDescriptor.TYPE_UINT64: [0, 1, 2**31, 2**32 - 1, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1],
    FieldDescriptor.TYPE_UINT32: [0, 1, 2**16, 2**31 - 1, 2**31, 2**32 - 1],
    FieldDescriptor.TYPE_FIXED32: [0, 1, 2**32 - 1],
    FieldDescriptor.TYPE_INT64: [-(2**63), -1, 0, 1, 2**63 - 1],
    FieldDescriptor.TYPE_SINT64: [-(2**63), -1, 0, 1, 2**63 - 1],
    FieldDescriptor.TYPE_INT32: [-(2**31), -1, 0, 1, 2**31 - 1],
}
_INT_RANGES = {
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
}
_ODD_STRINGS = ["", " ", "\x00", "../../etc/passwd", "é" * 40, "x" * MAX_STRING, "%s%n{0}"]
_ODD_FLOATS = [math.nan, math.inf, -math.inf, -0.0, 1e308, -1e308, 5e-324]


def _scalar(fd: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = fd.type
    if kind in _INT_RANGES:
        low, high = _INT_RANGES[kind]
        return st.one_of(st.sampled_from(_INT_EDGES[kind]), st.integers(low, high))
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.one_of(st.sampled_from(_ODD_FLOATS), st.floats(allow_nan=True))
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_STRING:
        return st.one_of(st.sampled_from(_ODD_STRINGS), st.text(max_size=40))
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=256)
    if kind == FieldDescriptor.TYPE_ENUM:
        return st.integers(-(2**31), 2**31 - 1)  # proto3 enums are open: any number parses
    raise AssertionError(f"no strategy for field {fd.full_name} of type {kind}")


def _field_value(fd: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        return messages(fd.message_type, depth + 1)
    return _scalar(fd)


def _is_map(fd: FieldDescriptor) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry


@st.composite
def _filled(draw: st.DrawFn, message: Message, fd: FieldDescriptor, depth: int) -> None:
    """Overwrite ``message.<fd>`` with a hostile value of the field's type."""
    target = getattr(message, fd.name)
    if _is_map(fd):
        target.clear()
        key_fd, value_fd = (
            fd.message_type.fields_by_name["key"],
            fd.message_type.fields_by_name["value"],
        )
        for _ in range(draw(st.integers(0, 3))):
            key = draw(_scalar(key_fd))
            if value_fd.type == FieldDescriptor.TYPE_MESSAGE:
                target[key].CopyFrom(draw(messages(value_fd.message_type, depth + 1)))
            else:
                target[key] = draw(_scalar(value_fd))
        return
    if fd.label == FieldDescriptor.LABEL_REPEATED:
        del target[:]
        values = draw(st.lists(_field_value(fd, depth), max_size=4))
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            for value in values:
                target.add().CopyFrom(value)
        else:
            target.extend(values)
        return
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        getattr(message, fd.name).CopyFrom(draw(messages(fd.message_type, depth + 1)))
    else:
        setattr(message, fd.name, draw(_scalar(fd)))


@st.composite
def messages(draw: st.DrawFn, descriptor: Descriptor, depth: int = 0) -> Message:
    """A message of ``descriptor``'s type with random, often hostile, field values."""
    message = pb_class(descriptor)()
    if depth >= 3:
        return message
    fields = list(descriptor.fields)
    if not fields:
        return message
    for fd in draw(st.lists(st.sampled_from(fields), unique=True, max_size=6)):
        draw(_filled(message, fd, depth))
    return message


def pb_class(descriptor: Descriptor) -> type[Message]:
    """The generated class of ``descriptor`` (every wire message lives in ``geofl_pb2``)."""
    cls: type[Message] = getattr(pb, descriptor.name)
    return cls


@st.composite
def field_mutation(draw: st.DrawFn, valid: Message) -> Message:
    """``valid`` with one to four of its fields overwritten."""
    mutated = type(valid)()
    mutated.CopyFrom(valid)
    fields = list(valid.DESCRIPTOR.fields)
    if not fields:  # e.g. HeartbeatRequest: only unknown fields can be added
        return mutated
    for fd in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=4, unique=True)):
        draw(_filled(mutated, fd, 0))
    return mutated


@st.composite
def byte_mutation(draw: st.DrawFn, valid: bytes) -> bytes:
    """``valid`` damaged at the byte level: cut, flipped, padded with garbage, or replaced.

    Positions are drawn independently of ``len(valid)`` and wrapped onto it, so the same
    draws attack messages of any length (hypothesis requires draws not to depend on
    outside state, such as a task id's length).
    """
    how = draw(st.sampled_from(["truncate", "flip", "insert", "random", "unknown-field"]))
    data = bytearray(valid)
    position = st.integers(0, 1 << 16)
    if how == "truncate" and data:
        return bytes(data[: draw(position) % len(data)])
    if how == "flip" and data:
        for _ in range(draw(st.integers(1, 4))):
            data[draw(position) % len(data)] ^= draw(st.integers(1, 255))
        return bytes(data)
    if how == "insert":
        at = draw(position) % (len(data) + 1)
        return bytes(data[:at]) + draw(st.binary(min_size=1, max_size=32)) + bytes(data[at:])
    if how == "unknown-field":  # a well-formed field number that no schema defines
        return bytes(data) + b"\xf8\xff\x03" + bytes([draw(st.integers(0, 127))])
    return draw(st.binary(max_size=200))


def wire_bytes(valid: Message) -> st.SearchStrategy[bytes]:
    """Serialized hostile variants of ``valid``: field mutations and byte mutations."""
    serialized = valid.SerializeToString()
    return st.one_of(
        field_mutation(valid).map(lambda m: m.SerializeToString()),
        byte_mutation(serialized),
        messages(valid.DESCRIPTOR).map(lambda m: m.SerializeToString()),
    )


# ------------------------------------------------------------------- uploads

MODEL = {
    "w": np.zeros((4, 3), np.float32),
    "b": np.zeros(3, np.float32),
    "steps": np.zeros((), np.int64),
}


def valid_header(task: pb.Task) -> pb.UploadHeader:
    """The header a correct client sends for ``task``: a zero delta of 10 examples."""
    return upload_header(task, num_tensors=len(MODEL))


def valid_upload(task: pb.Task) -> list[bytes]:
    """The serialized upload stream of a correct client: header, then chunks of 16 bytes."""
    return list(streams.encode_upload(valid_header(task), MODEL, 16))


@st.composite
def hostile_upload(draw: st.DrawFn, task: pb.Task) -> list[bytes]:
    """A Submit stream for ``task`` that a hostile or broken client might send."""
    stream = valid_upload(task)
    position = st.integers(0, 1 << 16)  # wrapped onto the stream: see byte_mutation
    how = draw(st.sampled_from(["header", "chunk-fields", "bytes", "order", "drop", "extra"]))
    if how == "header":
        header = draw(field_mutation(valid_header(task)))
        stream[0] = pb.UploadMessage(header=header).SerializeToString()
    elif how == "chunk-fields":
        index = 1 + draw(position) % (len(stream) - 1)
        chunk = pb.UploadMessage.FromString(stream[index]).chunk
        stream[index] = pb.UploadMessage(chunk=draw(field_mutation(chunk))).SerializeToString()
    elif how == "bytes":
        index = draw(position) % len(stream)
        stream[index] = draw(byte_mutation(stream[index]))
    elif how == "order":
        stream = list(draw(st.permutations(stream)))
    elif how == "drop":
        del stream[draw(position) % len(stream)]
    else:
        extra = draw(messages(pb.UploadMessage.DESCRIPTOR)).SerializeToString()
        stream.insert(draw(position) % (len(stream) + 1), extra)
    return stream


# ------------------------------------------------------------------- driver

#: Statuses a correct server may answer to hostile input: each with a catalogued code.
CATALOGUED = {code.status for code in ErrorCode} - {grpc.StatusCode.INTERNAL}


@dataclass
class Tally:
    """What a fuzzer saw: calls made and the statuses that came back."""

    calls: int = 0
    refused: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: Long polls that were still waiting when the caller's deadline came (not a refusal).
    polls_timed_out: int = 0

    @property
    def total_refused(self) -> int:
        return sum(self.refused.values())


class UncataloguedStatusError(AssertionError):
    """The server answered hostile input with a status that names no catalogued error."""


def check_refusal(method: str, error: grpc.RpcError) -> str:
    """The status name of a refusal; raises unless it carries a catalogued error code."""
    code: grpc.StatusCode = error.code()  # type: ignore[attr-defined]
    details: str = error.details() or ""  # type: ignore[attr-defined]
    wire = error_from_details(details)
    if code not in CATALOGUED or wire is None or wire.code.status != code:
        raise UncataloguedStatusError(f"{method} answered {code.name} {details!r}")
    return code.name


class RawPeer:
    """Sends raw bytes to the coordinator's methods and tallies the answers."""

    def __init__(self, port: int, call_timeout_s: float = 5.0) -> None:
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)]
        )
        self.timeout = call_timeout_s
        self.tally = Tally()
        self._unary: dict[str, Callable[..., bytes]] = {
            name: self.channel.unary_unary(f"/{SERVICE_NAME}/{name}")
            for name in ("Challenge", "Join", "Heartbeat", "GetTask")
        }
        self._download = self.channel.unary_stream(f"/{SERVICE_NAME}/Download")
        self._submit = self.channel.stream_unary(f"/{SERVICE_NAME}/Submit")

    def close(self) -> None:
        self.channel.close()

    def call(
        self, method: str, request: bytes | Iterable[bytes], token: str | None
    ) -> bytes | None:
        """One call of ``method``; its reply, or ``None`` if the server refused it."""
        metadata = () if token is None else ((SESSION_METADATA_KEY, token),)
        self.tally.calls += 1
        try:
            if method == "Download":
                return b"".join(self._download(request, metadata=metadata, timeout=self.timeout))
            if method == "Submit":
                return self._submit(
                    iter(_as_list(request)), metadata=metadata, timeout=self.timeout
                )  # type: ignore[no-any-return]
            return self._unary[method](request, metadata=metadata, timeout=self.timeout)
        except grpc.RpcError as error:
            if method == "GetTask" and error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:  # type: ignore[attr-defined]
                self.tally.polls_timed_out += 1
                return None
            self.tally.refused[method, check_refusal(method, error)] += 1
            return None


def _as_list(request: bytes | Iterable[bytes]) -> Iterator[bytes]:
    if isinstance(request, bytes):
        yield request
    else:
        yield from request
