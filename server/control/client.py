"""The admin's side of the control API: log in with a key, then ask the coordinator.

Synchronous (a command line asks, prints, exits). :class:`ControlClient` logs in on first
use: it asks for a nonce, signs :func:`~geofl.server.control.admins.login_message` with
the admin's Ed25519 key and keeps the session token for the calls that follow. Replies
come back as the same records the offline ``--db`` commands read from the database.
"""

from __future__ import annotations

import hashlib
import json
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc

from geofl.protocols.errors import GeoflError
from geofl.protocols.identity import load_private_key, raw_public_key
from geofl.protocols.v1 import control_pb2 as cpb
from geofl.protocols.v1 import control_pb2_grpc as cpb_grpc
from geofl.server.control.admins import login_message
from geofl.storage.events import EventRecord
from geofl.storage.measurements import NodeMeasurementRecord
from geofl.storage.records import RunDetail, RunSummary

__all__ = ["ControlClient", "ControlError", "RemoteModel", "RunReport"]

_MAX_MESSAGE = 8 << 20


class ControlError(GeoflError):
    """The control API refused a call or could not be reached; ``status`` says which."""

    def __init__(self, message: str, status: grpc.StatusCode) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RunReport:
    """What ``geofl runs show`` prints: the run, its measured links and its events."""

    detail: RunDetail
    links: list[NodeMeasurementRecord]
    events: list[EventRecord]


@dataclass(frozen=True)
class RemoteModel:
    """A pulled round's model: the safetensors file's bytes (digest verified)."""

    round: int
    data: bytes
    sha256: str
    num_tensors: int


def event_from_wire(message: cpb.RunEvent) -> EventRecord:
    """An event as the stream carries it, back as the database's record."""
    return EventRecord(
        id=message.id,
        run_id=message.run_id or None,
        round=message.round or None,
        kind=message.kind,
        message=message.message,
        data=json.loads(message.data_json or "{}"),
        created_at=datetime.fromisoformat(message.created_at),
    )


def _channel(address: str, ca: Path | None, tls: bool) -> grpc.Channel:
    options = [("grpc.max_receive_message_length", _MAX_MESSAGE)]
    if ca is None and not tls:
        return grpc.insecure_channel(address, options=options)
    roots = ca.read_bytes() if ca is not None else None
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(roots), options=options)


class ControlClient:
    """One admin's connection to a coordinator's control API (``server.control.address``)."""

    def __init__(
        self,
        address: str,
        key: Path,
        *,
        ca: Path | None = None,
        tls: bool = False,
        timeout_s: float = 30.0,
    ) -> None:
        """``key``: the admin's private key (``geofl keys new``); ``ca`` (or ``tls``, with
        the system's roots) connects over TLS, verifying the server's certificate.

        Raises
        ------
        KeyFileError
            If ``key`` is missing or not an Ed25519 private key.
        """
        self._key = load_private_key(key)
        self._channel = _channel(address, ca, tls)
        self._stub = cpb_grpc.ControlStub(self._channel)  # type: ignore[no-untyped-call]
        self._address = address
        self._timeout_s = timeout_s
        self._token: str | None = None
        self.admin: str | None = None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ plumbing

    def _fail(self, exc: grpc.RpcError) -> ControlError:
        status = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        if status is grpc.StatusCode.UNAVAILABLE:
            details = f"control API at {self._address} unreachable ({details})"
        return ControlError(details or status.name, status)

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        if self._token is None:
            self.login()
        return (("authorization", f"Bearer {self._token}"),)

    def _call(self, method: str, request: Any) -> Any:
        try:
            metadata = self._metadata()
            return getattr(self._stub, method)(request, metadata=metadata, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            raise self._fail(exc) from None

    def login(self) -> str:
        """Prove the admin key and keep a session token; the admin's name.

        Raises
        ------
        ControlError
            If the server is unreachable or refuses the key (``UNAUTHENTICATED``).
        """
        try:
            challenge = self._stub.Challenge(cpb.AdminChallengeRequest(), timeout=self._timeout_s)
            signature = self._key.sign(login_message(challenge.nonce, challenge.channel))
            reply = self._stub.Login(
                cpb.AdminLoginRequest(
                    public_key=raw_public_key(self._key.public_key()),
                    nonce=challenge.nonce,
                    signature=signature,
                ),
                timeout=self._timeout_s,
            )
        except grpc.RpcError as exc:
            raise self._fail(exc) from None
        self._token, self.admin = reply.token, reply.admin
        return str(reply.admin)

    # ------------------------------------------------------------ calls

    def list_runs(self) -> list[RunSummary]:
        """Every run in the coordinator's database, oldest first."""
        reply = self._call("ListRuns", cpb.ListRunsRequest())
        return [RunSummary.from_dict(run) for run in json.loads(reply.json)]

    def show_run(self, run_id: int) -> RunReport:
        """One run: rounds, participations, measured links, events."""
        data: dict[str, Any] = json.loads(
            self._call("ShowRun", cpb.ShowRunRequest(run_id=run_id)).json
        )
        links = [NodeMeasurementRecord(**m) for m in data.pop("links")]
        events = [
            EventRecord(**{**e, "created_at": datetime.fromisoformat(e["created_at"])})
            for e in data.pop("events")
        ]
        return RunReport(RunDetail.from_dict(data), links, events)

    def stop_run(self, run_id: int, reason: str = "") -> tuple[bool, str]:
        """Ask the live run to stop after its current round: (first request?, status now)."""
        reply = self._call("StopRun", cpb.StopRunRequest(run_id=run_id, reason=reason))
        return bool(reply.first_request), str(reply.status)

    def events(
        self, run_id: int, *, after_id: int = 0, follow: bool = False
    ) -> Iterator[EventRecord]:
        """The run's events, oldest first; with ``follow``, until the run stops running."""
        request = cpb.StreamEventsRequest(run_id=run_id, after_id=after_id, follow=follow)
        try:
            stream = self._stub.StreamEvents(request, metadata=self._metadata())
            for message in stream:
                yield event_from_wire(message)
        except grpc.RpcError as exc:
            raise self._fail(exc) from None

    def pull(self, run_id: int, round: int | None = None) -> RemoteModel:
        """The model of ``round`` (``None``: the newest with a checkpoint).

        Raises
        ------
        ControlError
            If there is no such checkpoint (``NOT_FOUND``), or the bytes that arrived do
            not match the digest the server announced (``DATA_LOSS``).
        """
        request = cpb.PullModelRequest(run_id=run_id, round=round or 0)
        header: cpb.ModelHeader | None = None
        parts: list[bytes] = []
        try:
            for chunk in self._stub.PullModel(request, metadata=self._metadata()):
                if chunk.HasField("header"):
                    header = chunk.header
                parts.append(chunk.data)
        except grpc.RpcError as exc:
            raise self._fail(exc) from None
        data = b"".join(parts)
        if header is None or hashlib.sha256(data).hexdigest() != header.sha256:
            raise ControlError(
                f"the model of run {run_id} arrived damaged (SHA-256 mismatch)",
                grpc.StatusCode.DATA_LOSS,
            )
        return RemoteModel(header.round, data, header.sha256, header.num_tensors)

    def dashboard_link(self) -> tuple[str, float]:
        """A one-time dashboard login link (``URL/login?token=...``) and its seconds to live."""
        reply = self._call("DashboardLink", cpb.DashboardLinkRequest())
        query = urllib.parse.urlencode({"token": reply.token})
        return f"{reply.url.rstrip('/')}/login?{query}", float(reply.ttl_s)
