"""The Coordinator gRPC service: thin handlers over the registry and the model store.

Every handler body runs inside :func:`_translated`, the one place where internal
errors become catalogued gRPC statuses.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import cast

import grpc

from geofl.protocols import partial_sync, serde, streaming, streams
from geofl.protocols.errors import (
    ErrorCode,
    ForbiddenError,
    ProtocolError,
    SessionError,
    TaskError,
    TensorError,
    TruncatedStreamError,
    WireError,
)
from geofl.protocols.secagg import RingArray
from geofl.protocols.shared_lowrank import vector_length
from geofl.protocols.tensors import (
    MASKED_TENSOR,
    ModelSpec,
    TensorSpec,
    model_bytes,
)
from geofl.protocols.types import Scalar
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.protocols.v1 import geofl_pb2_grpc as pb_grpc
from geofl.server.config import CompressionConfig
from geofl.server.models.spool import MemoryBudget, SpoolSink
from geofl.server.models.store import ModelStore
from geofl.server.nodes.bounds import (
    Reported,
    check_join,
    check_metrics,
    check_reported,
    error_text,
    poll_timeout,
)
from geofl.server.nodes.fragments import pad_to_model
from geofl.server.nodes.identity import ChallengeBook, JoinCheck, NodeIdentity
from geofl.server.nodes.outcomes import (
    DeltaUpdate,
    MaskedVector,
    MessageReply,
    Outcome,
    StageResult,
)
from geofl.server.nodes.registry import NodeSession, Registry, TaskRecord
from geofl.server.nodes.updates import announced_size, delta_check
from geofl.server.transport.guard import Rejections

log = logging.getLogger(__name__)

SUPPORTED_PROTOCOL_VERSIONS = (1,)
SESSION_METADATA_KEY = "geofl-session"
SERVICE_NAME = "geofl.v1.Coordinator"
_MAX_POLL_S = 60.0

_KIND = {
    "fit": pb.TASK_KIND_FIT,
    "evaluate": pb.TASK_KIND_EVALUATE,
    "advertise": pb.TASK_KIND_SECAGG_ADVERTISE,
    "share": pb.TASK_KIND_SECAGG_SHARE,
    "unmask": pb.TASK_KIND_SECAGG_UNMASK,
    "message": pb.TASK_KIND_MESSAGE,
}


@dataclass
class ServerState:
    """What the handlers need to know about the run."""

    registry: Registry
    run_id: int
    run_name: str
    spec: ModelSpec
    join_node: Callable[[str, str | None, dict[str, Scalar]], int]
    run_config: dict[str, Scalar] = field(default_factory=dict)
    models: ModelStore = field(default_factory=ModelStore)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    upload_budget: MemoryBudget = field(default_factory=MemoryBudget)
    rejections: Rejections = field(default_factory=Rejections)
    #: Largest reply to a message task (its arrays), bytes.
    max_message_bytes: int = 8 << 30
    #: Regions a node may name when it joins (empty: any).
    regions: frozenset[str] = frozenset()
    #: Who may join: keys (server.auth), certificates (server.tls.client_ca), or anyone.
    join_check: JoinCheck = field(default_factory=JoinCheck)
    challenges: ChallengeBook = field(default_factory=ChallengeBook)
    #: Hears every refused identity, forbidden request and replay: (kind, details).
    on_refusal: Callable[[str, dict[str, Scalar]], None] | None = None
    #: Makes an accepted plain fit update durable before it is acknowledged (None: the
    #: update lives only in the spool; see :mod:`geofl.server.models.staging`).
    stage_update: Callable[[TaskRecord, Outcome], Awaitable[None]] | None = None


#: Refusals that are recorded: someone tried what is not theirs.
_RECORDED = {
    ErrorCode.IDENTITY_REFUSED: "identity",
    ErrorCode.FORBIDDEN: "forbidden",
    ErrorCode.DUPLICATE_RESULT: "replay",
}


class _AbortError(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


@contextmanager
def _translated(on_refusal: Callable[[WireError], None] | None = None) -> Iterator[None]:
    """Map wire errors to their catalogued status; anything else is an internal error.

    A refusal of the kinds in ``_RECORDED`` is handed to ``on_refusal`` first.
    """
    try:
        yield
    except WireError as exc:
        if on_refusal is not None and exc.code in _RECORDED:
            on_refusal(exc)
        raise _AbortError(exc.code.status, exc.wire_details()) from exc
    except (asyncio.CancelledError, _AbortError):
        raise
    except Exception as exc:
        log.exception("internal error in RPC handler")
        internal = WireError("internal server error", code=ErrorCode.INTERNAL)
        raise _AbortError(grpc.StatusCode.INTERNAL, internal.wire_details()) from exc


async def _wait_for_mail(session: NodeSession, registry: Registry, timeout: float) -> None:
    """Wait until the node has mail, the run ends, or ``timeout``; never loses a task.

    A task taken off the mailbox while waiting is put back, also when the call is
    cancelled (the client went away), so the next poll still gets it.
    """
    getter = asyncio.ensure_future(session.mailbox.get())
    finished = asyncio.ensure_future(registry.finished.wait())
    try:
        await asyncio.wait({getter, finished}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        finished.cancel()
        getter.cancel()
        if getter.done() and not getter.cancelled():
            session.mailbox.put_nowait(getter.result())


def _token(context: grpc.aio.ServicerContext[object, object]) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == SESSION_METADATA_KEY:
            return value if isinstance(value, str) else value.decode()
    return None


class CoordinatorServicer(pb_grpc.CoordinatorServicer):
    """Handlers of ``geofl.v1.Coordinator``."""

    def __init__(self, state: ServerState) -> None:
        self._s = state
        #: Joins write their node's row one at a time (as they did on the event loop), so
        #: two joins of one name never race to insert it.
        self._joining = asyncio.Lock()

    def _recorder(
        self, context: grpc.aio.ServicerContext[object, object], rpc: str, who: str = ""
    ) -> Callable[[WireError], None]:
        """Log and record a refusal of ``rpc`` (the caller's name, if known, and peer)."""

        def record(exc: WireError) -> None:
            kind = _RECORDED[exc.code]
            peer = context.peer() or "?"
            log.warning("refused %s (%s) from %r at %s: %s", rpc, kind, who or "-", peer, exc)
            if self._s.on_refusal is not None:
                details: dict[str, Scalar] = {"rpc": rpc, "node": who, "peer": peer}
                details["reason"] = str(exc)
                self._s.on_refusal(kind, details)

        return record

    def _session(self, context: grpc.aio.ServicerContext[object, object], rpc: str) -> NodeSession:
        """The caller's session, from the connection it is bound to (if it is).

        A token presented from another connection than its session's is refused like an
        unknown one (the node joins again) and recorded: it may have been stolen.
        """
        token = _token(context)
        try:
            return self._s.registry.session(token, context.peer())
        except SessionError:
            owner = self._s.registry.bound_session(token)
            if owner is not None:
                stolen = ForbiddenError(
                    f"session token of node {owner.name!r} from another connection"
                )
                self._recorder(context, rpc, owner.name)(stolen)
            raise

    async def Challenge(  # noqa: N802 - gRPC naming
        self, request: pb.ChallengeRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.ChallengeReply:
        channel = context.peer()
        return pb.ChallengeReply(
            nonce=self._s.challenges.issue(channel),
            channel=channel,
            run_id=self._s.run_id,
            run_name=self._s.run_name,
            ttl_s=self._s.challenges.ttl_s,
        )

    async def Join(  # noqa: N802 - gRPC naming
        self, request: pb.JoinRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.JoinReply:
        try:
            with _translated(self._recorder(context, "Join", request.node_name[:128])):
                identity = self._s.join_check.identify(
                    request,
                    self._s.challenges,
                    context.auth_context(),
                    (self._s.run_id, self._s.run_name, context.peer()),
                )
                return await self._join(request, identity, context.peer())
        except _AbortError as abort:
            await context.abort(abort.code, abort.details)
            raise  # unreachable: abort raises

    async def _join(
        self, request: pb.JoinRequest, identity: NodeIdentity | None = None, peer: str = ""
    ) -> pb.JoinReply:
        common = set(request.protocol_versions) & set(SUPPORTED_PROTOCOL_VERSIONS)
        if not common:
            raise WireError(
                f"client speaks protocol versions {list(request.protocol_versions)}, "
                f"server speaks {list(SUPPORTED_PROTOCOL_VERSIONS)}",
                code=ErrorCode.PROTOCOL_VERSION,
            )
        name = identity.name if identity is not None else request.node_name
        if not name:
            raise ProtocolError("JoinRequest.node_name is empty")
        config = serde.scalar_map(request.node_config)
        region = request.region or (identity.region if identity is not None else None) or None
        check_join(name, region, config)
        if self._s.regions and region is not None and region not in self._s.regions:
            role = "relay" if config.get("relay") is True else "node"
            raise WireError(
                f"{role} {name!r} names region {region!r}, which this run does "
                f"not serve; its regions are {sorted(self._s.regions)} (server.regions)",
                code=ErrorCode.UNKNOWN_REGION,
            )
        # The node's row is written off the event loop: a database outage must not stop
        # the loop answering every other node meanwhile.
        async with self._joining:
            node_id = await asyncio.to_thread(self._s.join_node, name, region, config)
        bound = peer if identity is not None else None
        token = self._s.registry.add(node_id, name, region, config, identity=identity, peer=bound)
        how = f", {identity.credential}" if identity is not None else ""
        log.info("node %s (%s%s) joined as %d", name, region or "-", how, node_id)
        reply = pb.JoinReply(
            protocol_version=max(common),
            node_id=node_id,
            session_token=token,
            heartbeat_interval_s=self._s.registry.heartbeat_interval_s,
            run_name=self._s.run_name,
            run_id=self._s.run_id,
            max_chunk_bytes=4 << 20,
            node_name=name,
        )
        serde.fill_scalar_map(reply.run_config, self._s.run_config)
        return reply

    async def Heartbeat(  # noqa: N802
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.HeartbeatReply:
        try:
            with _translated():
                self._session(context, "Heartbeat")
                return pb.HeartbeatReply(heartbeat_interval_s=self._s.registry.heartbeat_interval_s)
        except _AbortError as abort:
            await context.abort(abort.code, abort.details)
            raise

    async def GetTask(  # noqa: N802
        self, request: pb.GetTaskRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.Task:
        try:
            with _translated():
                session = self._session(context, "GetTask")
                timeout = poll_timeout(request.poll_timeout_s, _MAX_POLL_S)
                held = request.held_version if request.has_model else None
                return await self._next_task(session, timeout, held)
        except _AbortError as abort:
            await context.abort(abort.code, abort.details)
            raise

    async def _next_task(
        self, session: NodeSession, timeout: float, held: int | None = None
    ) -> pb.Task:
        registry = self._s.registry
        if session.mailbox.empty() and not registry.finished.is_set():
            session.polls_open += 1
            try:
                await _wait_for_mail(session, registry, timeout)
            finally:
                session.polls_open -= 1
        session.last_seen = self._s.registry.clock.monotonic()
        while not session.mailbox.empty():
            task = session.mailbox.get_nowait()
            if not task.future.done():
                if held == task.model_version:
                    task.mark_downloaded()  # nothing to download: broadcast is done
                return self._task_message(task)
        if registry.finished.is_set():
            registry.shutdown_delivered.add(session.node_id)
            return pb.Task(kind=pb.TASK_KIND_SHUTDOWN, run_id=self._s.run_id, reason="run over")
        return pb.Task(kind=pb.TASK_KIND_WAIT, run_id=self._s.run_id)

    def _task_message(self, task: TaskRecord) -> pb.Task:
        task.started_at = self._s.registry.clock.time()
        spec = self._s.spec if task.spec is None else task.spec
        message = pb.Task(
            kind=_KIND[task.kind],
            task_id=task.task_id,
            run_id=self._s.run_id,
            round=task.round,
            model_version=task.model_version,
            deadline_unix_s=task.deadline,
            num_tensors=len(spec),
            model_bytes=model_bytes(spec),
        )
        serde.fill_scalar_map(message.config, task.config)
        if task.upload is not None and task.upload.chain:
            message.upload.CopyFrom(serde.plan_to_proto(task.upload))
        if task.secagg is not None:
            message.secagg.CopyFrom(task.secagg)
        if task.flower is not None:
            message.flower.CopyFrom(task.flower)
        return message

    async def Download(  # noqa: N802
        self, request: pb.DownloadRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[bytes]:
        try:
            with _translated(self._recorder(context, "Download")):
                session = self._session(context, "Download")
                task = self._s.registry.task_for(session, request.task_id)
                base = self._download_base(session, task, request)
                chain = self._s.compression.down_chain(session.region)
                broadcast = await self._s.models.broadcast(request.model_version, chain, base)
                if broadcast is None:
                    raise WireError(
                        f"model version {request.model_version} is not available",
                        code=ErrorCode.MODEL_UNAVAILABLE,
                    )
        except _AbortError as abort:
            await context.abort(abort.code, abort.details)
            raise
        for raw in broadcast.chunks:
            yield raw  # pre-encoded TensorChunk: see add_to_server
            # The client is reading (flow control let the chunk go): it is alive, even if
            # its heartbeats queue behind this transfer on a slow link.
            session.last_seen = self._s.registry.clock.monotonic()
        task.bytes_down += broadcast.wire_bytes
        task.bytes_down_raw += broadcast.raw_bytes
        task.mark_downloaded()

    def _download_base(
        self, session: NodeSession, task: TaskRecord, request: pb.DownloadRequest
    ) -> int | None:
        """The base of a difference download; only the task's version may be downloaded.

        A base the node was never given is ignored (the full model is sent): a difference
        to a version it does not hold would reveal that version.

        Raises
        ------
        ForbiddenError
            If the request names a model version other than its task's.
        """
        if request.model_version != task.model_version:
            raise ForbiddenError(
                f"task {task.task_id} is on model version {task.model_version}; version "
                f"{request.model_version} was not given to this node"
            )
        if not request.has_base or not self._s.registry.was_given(
            session.node_id, request.base_version
        ):
            return None
        return request.base_version

    async def Submit(  # noqa: N802
        self,
        request_iterator: AsyncIterator[bytes],
        context: grpc.aio.ServicerContext[object, object],
    ) -> pb.SubmitReply:
        try:
            with _translated(self._recorder(context, "Submit")):
                session = self._session(context, "Submit")
            with _translated(self._recorder(context, "Submit", session.name)):
                return await self._submit(session, request_iterator)
        except _AbortError as abort:
            await context.abort(abort.code, abort.details)
            raise

    async def _submit(self, session: NodeSession, messages: AsyncIterator[bytes]) -> pb.SubmitReply:
        raw = await anext(messages, None)
        first = serde.decode_upload(raw) if raw is not None else None
        if first is None or first.WhichOneof("body") != "header":
            raise ProtocolError("an upload must start with an UploadHeader")
        header = first.header
        task = self._s.registry.task_for(session, header.task_id)
        self._s.registry.start_upload(task, header.attempt)
        if self._s.registry.clock.time() > task.deadline:
            task.settle(Outcome("late", "result arrived after the round deadline"))
            raise TaskError("the task's deadline has passed", code=ErrorCode.TASK_EXPIRED)
        try:
            outcome = await self._receive(task, header, self._alive_while(session, messages))
            outcome.bytes_up += len(raw or b"")
            outcome.bytes_up_raw += len(raw or b"")
            await self._make_durable(task, outcome)
        except TruncatedStreamError as exc:
            task.settle(Outcome("dropped", f"upload ended early (client disconnected?): {exc}"))
            raise
        except WireError as exc:
            task.settle(Outcome("rejected", str(exc)))
            raise
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            task.settle(Outcome("dropped", "client disconnected during upload"))
            raise
        task.settle(outcome)
        return pb.SubmitReply(accepted=True)

    async def _make_durable(self, task: TaskRecord, outcome: Outcome) -> None:
        """Stage an accepted plain fit update on disk and in the database (if configured).

        Runs before the client hears ``accepted``: an acknowledged update survives the
        coordinator. An update that cannot be staged is freed; a database that stays
        away past its retries settles the task as dropped (the client may try again).
        """
        stage = self._s.stage_update
        if stage is None or outcome.status != "ok" or not isinstance(outcome.payload, DeltaUpdate):
            return
        try:
            await stage(task, outcome)
        except (WireError, asyncio.CancelledError):  # refused, or the client went away
            outcome.release()
            raise
        except Exception as exc:
            outcome.release()
            task.settle(Outcome("dropped", f"the server could not stage the update: {exc}"))
            raise

    async def _alive_while(
        self, session: NodeSession, messages: AsyncIterator[bytes]
    ) -> AsyncIterator[bytes]:
        """Pass ``messages`` through; every chunk from the node counts as a heartbeat.

        On a slow uplink a large upload can hold the node's heartbeats back (they share
        its connection) for longer than the heartbeat patience: the upload itself is the
        proof of life.
        """
        async for raw in messages:
            session.last_seen = self._s.registry.clock.monotonic()
            yield raw

    async def _receive(
        self, task: TaskRecord, header: pb.UploadHeader, messages: AsyncIterator[bytes]
    ) -> Outcome:
        if task.kind == "message":
            return await self._receive_reply(header, messages)
        if header.trailer_follows:
            return await self._receive_overlapped(task, header, messages)
        if header.status == pb.RESULT_STATUS_CLIENT_ERROR:
            metrics = check_metrics(serde.scalar_map(header.metrics))
            return Outcome("failed", error_text(header.error), metrics=metrics)
        if header.status != pb.RESULT_STATUS_OK:
            raise ProtocolError(f"UploadHeader.status {header.status} is not a valid status")
        if task.kind in ("advertise", "share", "unmask"):
            if header.update_kind != pb.UPDATE_KIND_NONE or not header.HasField("secagg"):
                raise ProtocolError(f"a {task.kind} result carries a SecAggResult and no tensors")
            return Outcome(
                "ok", payload=StageResult(header.secagg), compute_s=header.compute_s or None
            )
        reported = _reported(header, fit=task.kind == "fit")
        if task.kind == "evaluate":
            if header.update_kind != pb.UPDATE_KIND_NONE:
                raise ProtocolError("an evaluation result carries no tensors")
            return _ok(reported)
        if task.secagg is not None:
            return await self._receive_masked(task.secagg, header, reported, messages)
        sink, assembler = self._delta_receiver(header, self._s.spec)
        try:
            received = await _drain(assembler, messages)
        except BaseException:
            sink.discard()
            raise
        update = sink.update()
        outcome = _ok(reported)
        outcome.payload = DeltaUpdate(update, update.close)
        outcome.bytes_up = received
        outcome.bytes_up_raw = received - assembler.payload_bytes + assembler.total_bytes
        return outcome

    def _delta_receiver(
        self, header: pb.UploadHeader, expected: ModelSpec
    ) -> tuple[SpoolSink, streams.Assembler]:
        """Where a fit's DELTA update streams to, checked by the server's update rules."""
        if header.update_kind != pb.UPDATE_KIND_DELTA:
            raise ProtocolError("a fit result must carry a DELTA update")
        size = announced_size(int(header.payload_bytes), self._s.spec)
        sink = SpoolSink(self._s.upload_budget, size)
        return sink, streams.Assembler(sink, check=delta_check(expected, size))

    async def _receive_overlapped(
        self, task: TaskRecord, header: pb.UploadHeader, messages: AsyncIterator[bytes]
    ) -> Outcome:
        """An overlapped upload, streamed during training, then a trailer: a partial-sync
        round's layer groups, or a streaming round's fragment."""
        overlapped = partial_sync.CONFIG_KEY in task.config or streaming.is_streaming(task.config)
        if task.kind != "fit" or not overlapped or task.secagg is not None:
            raise ProtocolError(
                "trailer_follows is only for fit tasks of a partial-sync or streaming round"
            )
        order = streaming.expected_upload(self._s.spec, task.config)
        sink, assembler = self._delta_receiver(header, order)
        try:
            received, trailer = await _drain_until_trailer(assembler, messages)
            outcome = _trailer_outcome(trailer)
        except BaseException:
            sink.discard()
            raise
        if outcome.status != "ok":
            sink.discard()
            return outcome
        update = sink.update()
        outcome.payload = DeltaUpdate(pad_to_model(update, self._s.spec), update.close)
        outcome.bytes_up = received
        outcome.bytes_up_raw = received - assembler.payload_bytes + assembler.total_bytes
        return outcome

    async def _receive_masked(
        self,
        secagg: pb.SecAggTask,
        header: pb.UploadHeader,
        reported: Reported,
        messages: AsyncIterator[bytes],
    ) -> Outcome:
        """One ring vector: the flattened weighted update and the weight, masked."""
        if header.update_kind != pb.UPDATE_KIND_MASKED:
            raise ProtocolError("a fit result of a secure round must carry a MASKED update")
        length = vector_length(self._s.spec, secagg.setup)
        dtype = "uint16" if secagg.setup.ring_bits <= 16 else "uint32"
        expected = (TensorSpec(MASKED_TENSOR, dtype, (length,)),)
        sink = streams.ArraySink()
        assembler = streams.Assembler(sink, expected, max_total_bytes=expected[0].nbytes)
        received = await _drain(assembler, messages)
        outcome = _ok(reported)
        # The assembler checked its dtype against the ring's (uint16 or uint32).
        outcome.payload = MaskedVector(cast(RingArray, sink.weights[MASKED_TENSOR]))
        outcome.bytes_up = outcome.bytes_up_raw = received
        return outcome

    async def _receive_reply(
        self, header: pb.UploadHeader, messages: AsyncIterator[bytes]
    ) -> Outcome:
        """A message task's reply: its FlowerContent and complete arrays (or an error)."""
        if not header.HasField("flower"):
            raise ProtocolError("the reply to a message task must carry UploadHeader.flower")
        reply = MessageReply(header.flower, {})
        if header.status == pb.RESULT_STATUS_CLIENT_ERROR:
            return Outcome("failed", error_text(header.error), payload=reply)
        if header.status != pb.RESULT_STATUS_OK:
            raise ProtocolError(f"UploadHeader.status {header.status} is not a valid status")
        if header.update_kind not in (pb.UPDATE_KIND_FULL, pb.UPDATE_KIND_NONE):
            raise ProtocolError("a message reply carries FULL arrays or no tensors")
        announced = int(header.payload_bytes)
        if announced > self._s.max_message_bytes:
            raise TensorError(
                f"a reply of {announced} bytes is over the limit of {self._s.max_message_bytes}",
                code=ErrorCode.TOO_LARGE,
            )
        sink = streams.ArraySink()
        assembler = streams.Assembler(sink, max_total_bytes=announced)
        received = await _drain(assembler, messages)
        return Outcome(
            "ok",
            payload=MessageReply(header.flower, sink.weights),
            compute_s=header.compute_s or None,
            bytes_up=received,
            bytes_up_raw=received - assembler.payload_bytes + assembler.total_bytes,
        )


async def _drain(assembler: streams.Assembler, messages: AsyncIterator[bytes]) -> int:
    """Feed every chunk after the header to ``assembler``; the wire bytes received."""
    received = 0
    async for raw in messages:
        message, data = serde.decode_upload_view(raw)
        if message.WhichOneof("body") != "chunk":
            raise ProtocolError("only tensor chunks may follow the UploadHeader")
        assembler.feed(message.chunk, data)
        received += len(raw)
    assembler.finish()
    return received


async def _drain_until_trailer(
    assembler: streams.Assembler, messages: AsyncIterator[bytes]
) -> tuple[int, pb.UploadHeader]:
    """Feed the chunks to ``assembler`` up to the trailer; the wire bytes and the trailer."""
    received = 0
    async for raw in messages:
        received += len(raw)
        message, data = serde.decode_upload_view(raw)
        body = message.WhichOneof("body")
        if body == "trailer":
            if await anext(messages, None) is not None:
                raise ProtocolError("nothing may follow the upload's trailer")
            if message.trailer.status != pb.RESULT_STATUS_CLIENT_ERROR:
                assembler.finish()  # a failed fit may have stopped after any group
            return received, message.trailer
        if body != "chunk":
            raise ProtocolError("only tensor chunks and a trailer may follow the UploadHeader")
        assembler.feed(message.chunk, data)
    raise TruncatedStreamError("the upload ended without the trailer its header announced")


def _trailer_outcome(trailer: pb.UploadHeader) -> Outcome:
    """The outcome a partial-sync trailer reports (its tensors are added by the caller)."""
    if trailer.status == pb.RESULT_STATUS_CLIENT_ERROR:
        metrics = check_metrics(serde.scalar_map(trailer.metrics))
        return Outcome("failed", error_text(trailer.error), metrics=metrics)
    if trailer.status != pb.RESULT_STATUS_OK:
        raise ProtocolError(f"upload trailer status {trailer.status} is not a valid status")
    return _ok(_reported(trailer, fit=True))


def _reported(header: pb.UploadHeader, *, fit: bool) -> Reported:
    """A result header's figures, each checked against its bounds (ProtocolError if not)."""
    return check_reported(
        num_examples=int(header.num_examples),
        loss=header.loss,
        metrics=serde.scalar_map(header.metrics),
        compute_s=header.compute_s,
        fit=fit,
    )


def _ok(reported: Reported) -> Outcome:
    """A good result's outcome with the figures it reported (payload added by the caller)."""
    return Outcome(
        "ok",
        num_examples=reported.num_examples,
        loss=reported.loss,
        metrics=reported.metrics,
        compute_s=reported.compute_s,
    )


def _passthrough(data: bytes) -> bytes:
    return data


def add_to_server(servicer: CoordinatorServicer, server: grpc.aio.Server) -> None:
    """Register the service; bulk tensor streams travel as bytes that serde encodes.

    Download replies are pre-encoded chunks (shared by every client of a round) and
    Submit requests are decoded by the handler, so each side counts exact wire bytes
    and malformed messages become catalogued errors instead of opaque gRPC failures.
    """
    unary = grpc.unary_unary_rpc_method_handler
    handlers = {
        "Challenge": unary(
            servicer.Challenge, pb.ChallengeRequest.FromString, pb.ChallengeReply.SerializeToString
        ),
        "Join": unary(servicer.Join, pb.JoinRequest.FromString, pb.JoinReply.SerializeToString),
        "Heartbeat": unary(
            servicer.Heartbeat, pb.HeartbeatRequest.FromString, pb.HeartbeatReply.SerializeToString
        ),
        "GetTask": unary(servicer.GetTask, pb.GetTaskRequest.FromString, pb.Task.SerializeToString),
        "Download": grpc.unary_stream_rpc_method_handler(
            servicer.Download, pb.DownloadRequest.FromString, _passthrough
        ),
        "Submit": grpc.stream_unary_rpc_method_handler(
            servicer.Submit, _passthrough, pb.SubmitReply.SerializeToString
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))


__all__ = [
    "SESSION_METADATA_KEY",
    "SUPPORTED_PROTOCOL_VERSIONS",
    "CoordinatorServicer",
    "ServerState",
]
