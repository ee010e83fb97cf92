"""The client's side of the wire: a channel, the stub, and error translation."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from geofl.protocols import serde, streams
from geofl.protocols.errors import GeoflError, WireError, error_from_details
from geofl.protocols.tensors import Tensorish
from geofl.protocols.types import Scalar, Weights, WeightsView
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.protocols.v1 import geofl_pb2_grpc as pb_grpc

PROTOCOL_VERSIONS = (1,)
SESSION_METADATA_KEY = "geofl-session"
SERVICE_NAME = "geofl.v1.Coordinator"


class ServerUnavailableError(GeoflError):
    """The server cannot be reached right now (retry with backoff)."""


def default_node_name() -> str:
    """``host-pid``: unique per process on a machine."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class Session:
    """What the server told us when we joined."""

    node_id: int
    token: str
    heartbeat_interval_s: float
    run_id: int
    run_name: str
    run_config: dict[str, Scalar]


def translate(error: grpc.RpcError) -> Exception:
    """The most specific exception for a failed call."""
    code = error.code() if isinstance(error, grpc.Call) else None
    details = error.details() if isinstance(error, grpc.Call) else None
    specific = error_from_details(details)
    if specific is not None:
        return specific
    if code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    ):
        return ServerUnavailableError(f"{code.name if code else 'error'}: {details}")
    return WireError(f"server error {code.name if code else '?'}: {details}")


class Connection:
    """A channel to the coordinator with typed calls."""

    def __init__(self, address: str, root_certificates: Path | None = None) -> None:
        options = [
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.max_receive_message_length", 8 << 20),
        ]
        if root_certificates is not None:
            creds = grpc.ssl_channel_credentials(root_certificates.read_bytes())
            self._channel = grpc.secure_channel(address, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = pb_grpc.CoordinatorStub(self._channel)  # type: ignore[no-untyped-call]
        # Bulk streams carry bytes that serde encodes and decodes (exact byte counts,
        # malformed chunks as catalogued errors); see geofl.server.transport.add_to_server.
        self._download = self._channel.unary_stream(
            f"/{SERVICE_NAME}/Download",
            request_serializer=pb.DownloadRequest.SerializeToString,
            response_deserializer=None,
        )
        self._submit = self._channel.stream_unary(
            f"/{SERVICE_NAME}/Submit",
            request_serializer=None,
            response_deserializer=pb.SubmitReply.FromString,
        )
        self._token = ""

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return ((SESSION_METADATA_KEY, self._token),)

    def join(
        self, node_name: str, region: str | None, node_config: dict[str, Scalar], timeout: float
    ) -> Session:
        """Register with the server and negotiate the protocol version."""
        request = pb.JoinRequest(
            protocol_versions=PROTOCOL_VERSIONS, node_name=node_name, region=region or ""
        )
        serde.fill_scalar_map(request.node_config, node_config)
        try:
            reply: pb.JoinReply = self._stub.Join(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise translate(exc) from exc
        self._token = reply.session_token
        return Session(
            reply.node_id,
            reply.session_token,
            reply.heartbeat_interval_s,
            reply.run_id,
            reply.run_name,
            serde.scalar_map(reply.run_config),
        )

    def heartbeat(self, timeout: float) -> None:
        """Tell the server we are alive."""
        try:
            self._stub.Heartbeat(pb.HeartbeatRequest(), metadata=self._metadata(), timeout=timeout)
        except grpc.RpcError as exc:
            raise translate(exc) from exc

    def get_task(self, poll_timeout_s: float, held_version: int | None = None) -> pb.Task:
        """Long-poll for the next task, telling the server which model version we hold."""
        request = pb.GetTaskRequest(poll_timeout_s=poll_timeout_s)
        if held_version is not None:
            request.held_version, request.has_model = held_version, True
        try:
            task: pb.Task = self._stub.GetTask(
                request,
                metadata=self._metadata(),
                timeout=poll_timeout_s + 10.0,
            )
        except grpc.RpcError as exc:
            raise translate(exc) from exc
        return task

    def download(
        self, task: pb.Task, timeout: float | None, base: tuple[int, WeightsView] | None = None
    ) -> tuple[Weights, int]:
        """Stream the task's model version; returns the weights and the bytes received.

        With ``base`` (a version the client holds and its weights) the server may send
        only the compressed difference, which is added to the base here.
        """
        sink = streams.ArraySink(base[1] if base is not None else None)
        limit = 2 * max(task.model_bytes, 1) + (64 << 10)
        assembler = streams.Assembler(sink, max_total_bytes=limit)
        received = 0
        request = pb.DownloadRequest(task_id=task.task_id, model_version=task.model_version)
        if base is not None:
            request.base_version, request.has_base = base[0], True
        try:
            for raw in self._download(request, metadata=self._metadata(), timeout=timeout):
                assembler.feed(*serde.decode_chunk_view(raw))
                received += len(raw)
        except grpc.RpcError as exc:
            raise translate(exc) from exc
        assembler.finish()
        return sink.weights, received

    def submit(
        self,
        header: pb.UploadHeader,
        tensors: Mapping[str, Tensorish] | None,
        chunk_bytes: int,
        timeout: float | None,
    ) -> int:
        """Stream a result; returns the bytes sent.  Raises if the server refuses it."""
        return self.submit_messages(streams.encode_upload(header, tensors, chunk_bytes), timeout)

    def submit_messages(self, messages: Iterator[bytes], timeout: float | None) -> int:
        """Stream serialized :class:`pb.UploadMessage` s (the first one a header).

        ``messages`` may block between items (a partial-sync upload waits for training);
        returns the bytes sent. Raises if the server refuses the result.
        """
        sent = 0

        def counted() -> Iterator[bytes]:
            nonlocal sent
            for raw in messages:
                sent += len(raw)
                yield raw

        try:
            reply: pb.SubmitReply = self._submit(
                counted(), metadata=self._metadata(), timeout=timeout
            )
        except grpc.RpcError as exc:
            raise translate(exc) from exc
        if not reply.accepted:
            raise WireError(f"server refused the result: {reply.error_code} {reply.message}")
        return sent


__all__ = ["Connection", "ServerUnavailableError", "Session", "default_node_name", "translate"]
