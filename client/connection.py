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
from geofl.protocols.identity import join_message, load_private_key, raw_public_key
from geofl.protocols.tensors import Tensorish
from geofl.protocols.types import Scalar, Weights, WeightsView
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.protocols.v1 import geofl_pb2_grpc as pb_grpc

PROTOCOL_VERSIONS = (1,)
SESSION_METADATA_KEY = "geofl-session"
SERVICE_NAME = "geofl.v1.Coordinator"


class ServerUnavailableError(GeoflError):
    """The server cannot be reached right now (retry with backoff)."""


class CredentialsError(GeoflError):
    """A certificate or key file the client was given is missing or unreadable."""


class TlsVerificationError(GeoflError):
    """The TLS handshake failed on a certificate: retrying cannot help."""


#: Handshake failures gRPC reports in an UNAVAILABLE status that are certificate problems.
_CERTIFICATE_FAILURES = ("CERTIFICATE_VERIFY_FAILED", "Tls handshake failed", "Ssl handshake")
#: A server that refuses the client's certificate closes the socket during the handshake
#: (TLS 1.3 sends the alert after the client's view of the handshake): this many in a row,
#: before any call ever succeeded, are taken as that refusal.
_CLOSED_HANDSHAKES = 3


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CredentialsError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None


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
    #: The name the server registered (the credential's on an authenticating server).
    node_name: str = ""


def translate(error: grpc.RpcError) -> Exception:
    """The most specific exception for a failed call."""
    code = error.code() if isinstance(error, grpc.Call) else None
    details = error.details() if isinstance(error, grpc.Call) else None
    specific = error_from_details(details)
    if specific is not None:
        return specific
    if code is grpc.StatusCode.UNAVAILABLE and any(
        f in (details or "") for f in _CERTIFICATE_FAILURES
    ):
        return TlsVerificationError(f"TLS certificate verification failed: {details}")
    if code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    ):
        return ServerUnavailableError(f"{code.name if code else 'error'}: {details}")
    return WireError(f"server error {code.name if code else '?'}: {details}")


class Connection:
    """A channel to the coordinator with typed calls.

    ``client_certificate`` (certificate chain, key) makes it a mutual-TLS channel;
    ``node_key`` an Ed25519 key file that signs the server's join challenge.

    Raises
    ------
    CredentialsError
        If a certificate or key file is missing or unreadable.
    geofl.protocols.identity.KeyFileError
        If ``node_key`` is not an Ed25519 private key.
    """

    def __init__(
        self,
        address: str,
        root_certificates: Path | None = None,
        *,
        client_certificate: tuple[Path, Path] | None = None,
        node_key: Path | None = None,
    ) -> None:
        options = [
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.max_receive_message_length", 8 << 20),
            # One connection of its own: an authenticated session is bound to it, and gRPC
            # would otherwise share one connection among channels to the same address.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if node_key is not None:
            _read(node_key, "node key")
        self._key = load_private_key(node_key) if node_key is not None else None
        self._mutual = client_certificate is not None
        self._closed_handshakes = 0
        self._joined_once = False
        if root_certificates is not None or client_certificate is not None:
            roots = _read(root_certificates, "CA certificates") if root_certificates else None
            chain = key = None
            if client_certificate is not None:
                chain = _read(client_certificate[0], "client certificate")
                key = _read(client_certificate[1], "client certificate key")
            creds = grpc.ssl_channel_credentials(roots, key, chain)
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
            if self._key is not None:
                self._prove(request, timeout)
            reply: pb.JoinReply = self._stub.Join(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise self._join_failure(exc) from exc
        self._token = reply.session_token
        self._joined_once = True
        return Session(
            reply.node_id,
            reply.session_token,
            reply.heartbeat_interval_s,
            reply.run_id,
            reply.run_name,
            serde.scalar_map(reply.run_config),
            reply.node_name or node_name,
        )

    def _prove(self, request: pb.JoinRequest, timeout: float) -> None:
        """Sign a fresh server challenge for ``request`` with the node key."""
        if self._key is None:
            return
        challenge: pb.ChallengeReply = self._stub.Challenge(pb.ChallengeRequest(), timeout=timeout)
        message = join_message(
            challenge.run_id,
            challenge.run_name,
            challenge.nonce,
            challenge.channel,
            request.node_name,
        )
        request.proof.public_key = raw_public_key(self._key.public_key())
        request.proof.nonce = challenge.nonce
        request.proof.signature = self._key.sign(message)

    def _join_failure(self, exc: grpc.RpcError) -> Exception:
        """The error of a failed join; repeated closed handshakes of mutual TLS are a
        refused client certificate, not an outage."""
        error = translate(exc)
        details = exc.details() if isinstance(exc, grpc.Call) else ""
        if self._mutual and not self._joined_once and "Socket closed" in (details or ""):
            self._closed_handshakes += 1
            if self._closed_handshakes >= _CLOSED_HANDSHAKES:
                return TlsVerificationError(
                    f"the server closed the TLS handshake {self._closed_handshakes} times: it "
                    "does not accept this node's client certificate (or does not speak TLS)"
                )
        return error

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
        only the compressed difference, which is added to the base here, and in a
        Streaming DiLoCo run only the tensors that changed: the others are the base's.
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
        if base is None or len(sink.weights) == len(base[1]):
            return sink.weights, received
        weights = dict(base[1])  # in model order; what arrived replaces the kept copy
        weights.update(sink.weights)
        return weights, received

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


__all__ = [
    "Connection",
    "CredentialsError",
    "ServerUnavailableError",
    "Session",
    "TlsVerificationError",
    "default_node_name",
    "translate",
]
