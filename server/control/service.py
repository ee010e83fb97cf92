"""The control gRPC service: what ``geofl runs ... --server`` asks a coordinator.

It serves on its own address (``server.control.address``) beside the nodes' service, on
the coordinator's event loop. Reads go to the coordinator's database; ``StopRun`` goes to
the live run (:class:`LiveRun`). Every call but ``Challenge`` and ``Login`` needs an admin
session token (:mod:`geofl.server.control.admins`); refused logins are written to the
run's events as ``security.admin_refused``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol

import grpc

from geofl.protocols.errors import IdentityRefusedError
from geofl.protocols.v1 import control_pb2 as cpb
from geofl.protocols.v1 import control_pb2_grpc as cpb_grpc
from geofl.server.config.control import ControlConfig
from geofl.server.config.errors import ConfigError
from geofl.server.config.models import ServerConfig
from geofl.server.control.admins import AdminKeys, AdminSessions, login_message
from geofl.server.control.models import checkpoint_for, export_model
from geofl.server.nodes.identity import ChallengeBook
from geofl.storage import (
    CheckpointCorruptError,
    CheckpointStore,
    Database,
    RecordNotFoundError,
    RunNotFoundError,
    RunStatus,
    queries,
)
from geofl.storage.events import EventRecord

__all__ = ["ControlServicer", "LiveRun", "start_control_server"]

log = logging.getLogger(__name__)

#: How often a followed event stream looks for new rows.
FOLLOW_POLL_S = 0.25
_CHUNK = 1 << 20
_PAGE = 500
Context = grpc.aio.ServicerContext[Any, Any]


class LiveRun(Protocol):
    """The run a coordinator serves: what ``StopRun`` can reach."""

    run_id: int

    def request_stop(self, reason: str) -> bool:
        """Stop after the current round; whether this was the first request."""
        ...


@dataclass(frozen=True)
class ControlParts:
    """What the control service reads and acts on."""

    db: Database
    store: CheckpointStore
    admins: AdminKeys
    sessions: AdminSessions
    live: LiveRun
    #: The dashboard's base URL (``http://host:port``), if the coordinator serves one.
    dashboard_url: str | None = None


def _json(value: object) -> cpb.JsonReply:
    return cpb.JsonReply(json=json.dumps(value))


def _event(record: EventRecord) -> cpb.RunEvent:
    return cpb.RunEvent(
        id=record.id,
        run_id=record.run_id or 0,
        round=record.round or 0,
        kind=record.kind,
        message=record.message,
        data_json=json.dumps(record.data),
        created_at=record.created_at.isoformat(),
    )


class ControlServicer(cpb_grpc.ControlServicer):
    """The ``geofl.v1.Control`` service over one coordinator's database and live run."""

    def __init__(self, parts: ControlParts, challenges: ChallengeBook | None = None) -> None:
        self._p = parts
        self._challenges = challenges or ChallengeBook()

    # ------------------------------------------------------------ credentials

    async def _admin(self, context: Context) -> str:
        """The admin the call's bearer token names; aborts UNAUTHENTICATED otherwise."""
        metadata = dict(context.invocation_metadata() or ())
        header = metadata.get("authorization", "")
        token = header.removeprefix("Bearer ") if isinstance(header, str) else ""
        admin = self._p.sessions.verify(token) if token and token != header else None
        if admin is None:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "no valid admin session: log in with an admin key (geofl runs ... --key K)",
            )
        return admin

    def _audit(self, kind: str, message: str, data: dict[str, Any]) -> None:
        run_id = self._p.live.run_id
        self._p.db.transact(
            lambda session: queries.add_event(session, kind, message, run_id=run_id, data=data)
        )

    async def Challenge(  # noqa: N802 - gRPC naming
        self, request: cpb.AdminChallengeRequest, context: Context
    ) -> cpb.AdminChallengeReply:
        channel = context.peer()
        return cpb.AdminChallengeReply(
            nonce=self._challenges.issue(channel),
            channel=channel,
            ttl_s=self._challenges.ttl_s,
        )

    async def Login(  # noqa: N802 - gRPC naming
        self, request: cpb.AdminLoginRequest, context: Context
    ) -> cpb.AdminLoginReply:
        channel = context.peer()
        key = bytes(request.public_key)
        try:
            self._challenges.redeem(bytes(request.nonce), channel)
        except IdentityRefusedError as exc:
            await self._refuse(context, str(exc), key, channel)
        message = login_message(bytes(request.nonce), channel)
        admin = self._p.admins.admin_for(key, bytes(request.signature), message)
        if admin is None:
            reason = f"key {AdminKeys.describe(key)} is not an admin's, or the signature is wrong"
            await self._refuse(context, reason, key, channel)
        log.info("admin %s logged in from %s", admin, channel)
        return cpb.AdminLoginReply(
            token=self._p.sessions.issue(admin), admin=admin, ttl_s=self._p.sessions.ttl_s
        )

    async def _refuse(self, context: Context, reason: str, key: bytes, channel: str) -> NoReturn:
        log.warning("admin login refused from %s: %s", channel, reason)
        data = {"reason": reason, "peer": channel, "key": AdminKeys.describe(key) if key else ""}
        self._audit("security.admin_refused", reason, data)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"admin login refused: {reason}")
        raise AssertionError("abort returned")  # pragma: no cover - abort always raises

    # ------------------------------------------------------------ reads

    async def ListRuns(  # noqa: N802 - gRPC naming
        self, request: cpb.ListRunsRequest, context: Context
    ) -> cpb.JsonReply:
        await self._admin(context)
        with self._p.db.session() as session:
            return _json([run.to_dict() for run in queries.list_runs(session)])

    async def ShowRun(  # noqa: N802 - gRPC naming
        self, request: cpb.ShowRunRequest, context: Context
    ) -> cpb.JsonReply:
        await self._admin(context)
        try:
            with self._p.db.session() as session:
                detail = queries.run_detail(session, request.run_id)
                links = queries.latest_measurements(session, request.run_id)
                events = queries.events_of(session, request.run_id)
        except RunNotFoundError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        return _json(
            {
                **detail.to_dict(),
                "links": [m.to_dict() for m in links],
                "events": [e.to_dict() for e in events],
            }
        )

    async def StreamEvents(  # noqa: N802 - gRPC naming
        self, request: cpb.StreamEventsRequest, context: Context
    ) -> AsyncIterator[cpb.RunEvent]:
        await self._admin(context)
        after = request.after_id
        while True:
            try:
                with self._p.db.session() as session:
                    status = queries.get_run(session, request.run_id).status
                    page = queries.events_of(session, request.run_id, after_id=after, limit=_PAGE)
            except RunNotFoundError as exc:
                await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            for record in page:
                yield _event(record)
                after = record.id
            if len(page) == _PAGE:
                continue
            if not request.follow or status != RunStatus.RUNNING.value:
                return
            await asyncio.sleep(FOLLOW_POLL_S)

    async def PullModel(  # noqa: N802 - gRPC naming
        self, request: cpb.PullModelRequest, context: Context
    ) -> AsyncIterator[cpb.ModelChunk]:
        admin = await self._admin(context)
        try:
            with self._p.db.session() as session:
                number, record = checkpoint_for(session, request.run_id, request.round or None)
            model = await asyncio.to_thread(
                export_model, self._p.store, request.run_id, number, record
            )
        except (RecordNotFoundError, CheckpointCorruptError) as exc:  # RunNotFound included
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        log.info("admin %s pulled run %d round %d", admin, model.run_id, model.round)
        header = cpb.ModelHeader(
            round=model.round,
            size_bytes=len(model.data),
            sha256=model.sha256,
            num_tensors=model.num_tensors,
        )
        view = memoryview(model.data)
        yield cpb.ModelChunk(header=header, data=bytes(view[:_CHUNK]))
        for start in range(_CHUNK, len(view), _CHUNK):
            yield cpb.ModelChunk(data=bytes(view[start : start + _CHUNK]))

    # ------------------------------------------------------------ actions

    async def StopRun(  # noqa: N802 - gRPC naming
        self, request: cpb.StopRunRequest, context: Context
    ) -> cpb.StopRunReply:
        admin = await self._admin(context)
        live = self._p.live.run_id
        if request.run_id != live:
            try:
                with self._p.db.session() as session:
                    status = queries.get_run(session, request.run_id).status
            except RunNotFoundError as exc:
                await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"run {request.run_id} is {status}, not the run this coordinator serves "
                f"(run {live}); only a live run can be stopped",
            )
        reason = f"{request.reason or 'stopped'} (admin {admin})"
        first = self._p.live.request_stop(reason)
        with self._p.db.session() as session:
            status = queries.get_run(session, live).status
        return cpb.StopRunReply(first_request=first, status=status)

    async def DashboardLink(  # noqa: N802 - gRPC naming
        self, request: cpb.DashboardLinkRequest, context: Context
    ) -> cpb.DashboardLinkReply:
        admin = await self._admin(context)
        if self._p.dashboard_url is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this coordinator serves no dashboard (set server.dashboard.address)",
            )
        return cpb.DashboardLinkReply(
            token=self._p.sessions.issue_link(admin),
            ttl_s=self._p.sessions.link_ttl_s,
            url=self._p.dashboard_url,
        )


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _credentials(server: ServerConfig) -> grpc.ServerCredentials | None:
    """``server.tls``'s certificate and key (admins prove themselves by key, not certificate)."""
    tls = server.tls
    if tls is None:
        return None
    return grpc.ssl_server_credentials([(Path(tls.key).read_bytes(), Path(tls.cert).read_bytes())])


async def start_control_server(
    make_servicer: Callable[[], ControlServicer], control: ControlConfig, server: ServerConfig
) -> tuple[grpc.aio.Server, int]:
    """Serve the control API on ``control.address``; the server and its bound port.

    Raises
    ------
    ConfigError
        If the address is beyond loopback without TLS (and ``server.insecure`` is unset),
        or cannot be bound.
    """
    if not (server.insecure or _is_loopback(control.host) or server.tls is not None):
        raise ConfigError.single(
            "server",
            f"{control.address} listens beyond loopback without TLS: admin session tokens "
            "would cross the network in the clear. Configure server.tls, or set "
            "server.insecure: true to accept the risk",
            path="server.control.address",
        )
    grpc_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    cpb_grpc.add_ControlServicer_to_server(make_servicer(), grpc_server)  # type: ignore[no-untyped-call]
    credentials = _credentials(server)
    try:
        if credentials is None:
            port = grpc_server.add_insecure_port(control.address)
        else:
            port = grpc_server.add_secure_port(control.address, credentials)
    except RuntimeError:
        port = 0
    if port == 0:
        raise ConfigError.single(
            "server",
            f"cannot listen on {control.address} (address in use?)",
            path="server.control.address",
        )
    await grpc_server.start()
    return grpc_server, port
