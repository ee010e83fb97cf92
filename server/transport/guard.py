"""The coordinator's RPC boundary guard: decode requests itself, and record every refusal.

gRPC decodes a unary request before the handler runs; bytes that do not parse would
reach the peer as ``UNKNOWN`` with a Python exception's text, and the server would
keep no trace of them.  :class:`RpcGuard` is a server interceptor that takes the
decoding over, so malformed bytes become a catalogued ``E104 malformed message``,
and that counts every call that ended in a non-OK status, by method and code, in
a :class:`Rejections` ledger that tests, logs and metrics read.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError

from geofl.protocols.errors import ProtocolError

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
if TYPE_CHECKING:  # generic in grpc's stubs only
    _Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.aio.ServerInterceptor
Deserializer = Callable[[bytes], Any]


@dataclass(frozen=True)
class Rejection:
    """One refused call: which method, from where, with which status."""

    method: str
    peer: str
    status: str
    details: str


@dataclass
class Rejections:
    """Every refused call, counted by ``(method, status)``; the latest kept in full."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    recent: deque[Rejection] = field(default_factory=lambda: deque(maxlen=1000))

    def record(self, rejection: Rejection) -> None:
        self.counts[rejection.method, rejection.status] += 1
        self.recent.append(rejection)
        log.info(
            "refused %s from %s: %s %s",
            rejection.method,
            rejection.peer,
            rejection.status,
            rejection.details,
        )

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _method_name(details: grpc.HandlerCallDetails) -> str:
    method: str = details.method
    return method.rsplit("/", 1)[-1]


def _decoded(deserializer: Deserializer | None, raw: Any) -> Any:
    if deserializer is None or not isinstance(raw, bytes):
        return raw
    try:
        return deserializer(raw)
    except DecodeError as exc:
        raise ProtocolError(f"the request does not parse: {exc}") from exc


class RpcGuard(_Interceptor):
    """Decodes unary requests in the handler and records every non-OK status."""

    def __init__(self, rejections: Rejections) -> None:
        self.rejections = rejections

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = _method_name(handler_call_details)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary, handler.request_deserializer),
                None,
                handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(method, handler.unary_stream, handler.request_deserializer),
                None,
                handler.response_serializer,
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(method, handler.stream_unary, None),
                handler.request_deserializer,
                handler.response_serializer,
            )
        return handler

    def _unary(
        self, method: str, behaviour: Any, deserializer: Deserializer | None
    ) -> Callable[[Any, Context], Awaitable[Any]]:
        async def guarded(request: Any, context: Context) -> Any:
            try:
                return await behaviour(_decoded(deserializer, request), context)
            except ProtocolError as exc:
                await self._abort(method, context, exc)
            except BaseException:
                self._note(method, context)
                raise

        return guarded

    def _streaming(
        self, method: str, behaviour: Any, deserializer: Deserializer | None
    ) -> Callable[[Any, Context], AsyncIterator[Any]]:
        async def guarded(request: Any, context: Context) -> AsyncIterator[Any]:
            try:
                async for item in behaviour(_decoded(deserializer, request), context):
                    yield item
            except ProtocolError as exc:
                await self._abort(method, context, exc)
            except BaseException:
                self._note(method, context)
                raise

        return guarded

    async def _abort(self, method: str, context: Context, error: ProtocolError) -> None:
        self.rejections.record(
            Rejection(method, context.peer(), error.code.status.name, error.wire_details())
        )
        await context.abort(error.code.status, error.wire_details())

    def _note(self, method: str, context: Context) -> None:
        code = context.code()
        if code is None or code == grpc.StatusCode.OK:
            return  # cancelled by the peer, or a bug the servicer already reports
        status = code.name if isinstance(code, grpc.StatusCode) else str(code)
        self.rejections.record(Rejection(method, context.peer(), status, context.details() or ""))


__all__ = ["Rejection", "Rejections", "RpcGuard"]
