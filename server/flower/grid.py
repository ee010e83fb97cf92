"""Flower's ``Grid`` over geofl's transport, for a ServerApp running in its own thread.

Every call converts what it can in the calling (ServerApp) thread — Flower arrays to
numpy and back, which is the CPU work — and hands the rest to the
:class:`~geofl.server.flower.hub.MessageHub` on the coordinator's event loop.  Calls are
thread-safe, so the legacy ``ServerApp(server_fn=...)`` path, which sends from a pool
of threads, works too.  ``send_and_receive`` returns as soon as the last reply is in:
no polling interval.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import uuid
from collections.abc import Coroutine, Hashable, Iterable, Mapping
from typing import Any, TypeVar

from flwr.app import Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.run import Run

from geofl.protocols.errors import ProtocolError
from geofl.protocols.flower import (
    array_records,
    arrays_to_tensors,
    error_from_wire,
    layout_to_wire,
    records_from_wire,
)
from geofl.protocols.tensors import spec_of
from geofl.server.flower.errors import GridClosedError, UnsupportedFlowerFeatureError
from geofl.server.flower.hub import MessageHub, Outgoing, PreparedArrays, RoundKind
from geofl.server.flower.recording import ServerSource
from geofl.server.nodes.outcomes import MessageReply, Outcome

__all__ = ["GeoflGrid", "group_of", "round_of"]

_T = TypeVar("_T")
#: Seconds between checks that the event loop is still there while a call waits.
_LOOP_CHECK_S = 1.0
_ROUND_KINDS: dict[str, RoundKind] = {"train": "fit", "evaluate": "evaluate"}
#: The ConfigRecord key of the stages of Flower's SecAgg+ workflow.
_SECAGG_RECORD = "secaggplus_configs"
_SYSTEM_MESSAGE_TYPE = "system"
_STATUS_ERRORS = {
    "dropped": ErrorCode.NODE_UNAVAILABLE,
    "late": ErrorCode.REPLY_MESSAGE_UNAVAILABLE,
    "failed": ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
    "rejected": ErrorCode.UNKNOWN,
}


def round_of(message: Message) -> tuple[int, RoundKind | None]:
    """The round a message belongs to (0: not known) and its kind (None: not a round).

    Train and evaluate messages (``"train"``, ``"evaluate.<action>"`` ...) belong to the
    round their ``group_id`` names, else to the ``server-round`` of a ConfigRecord.
    """
    kind = _ROUND_KINDS.get(message.metadata.message_type.split(".")[0])
    if kind is None:
        return 0, None
    group = message.metadata.group_id
    if group.isdigit() and int(group) > 0:
        return int(group), kind
    for record in message.content.config_records.values():
        value = record.get("server-round")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, kind
    return 0, kind


def group_of(message: Message) -> str | None:
    """The ``group_id`` of a train/evaluate message when it names no round, else None.

    Flower's strategies and workflows set ``group_id`` to the round number; a ServerApp
    that sends, say, a final evaluation with ``group_id="final"`` means no round by it.
    """
    group = message.metadata.group_id
    if not group or group.isdigit():
        return None
    return group


def _arrays_key(records: RecordDict) -> tuple[Hashable, tuple[Any, ...]]:
    """Identity of the records' arrays (ids of the objects) and the objects to keep alive.

    ``Array.data`` is immutable bytes, so while these objects live, equal keys mean
    equal arrays; replacing an array or its data changes the key.
    """
    parts: list[Hashable] = []
    keep: list[Any] = []
    for record_key, record in array_records(records):
        items = tuple(
            (key, id(array), id(array.data), array.dtype, tuple(array.shape))
            for key, array in record.items()
        )
        parts.append((record_key, items))
        keep.extend(record.values())
    return tuple(parts), tuple(keep)


class GeoflGrid(Grid):
    """The grid a ServerApp gets when geofl runs it."""

    def __init__(self, hub: MessageHub, loop: asyncio.AbstractEventLoop, run: Run) -> None:
        self._hub = hub
        self._loop = loop
        self._run = run
        self._prepared: dict[Hashable, PreparedArrays] = {}

    # ------------------------------------------------------------ the Grid API

    def set_run(self, run: Run) -> None:
        """Set the run this grid operates in."""
        if not isinstance(run, Run):
            raise TypeError(f"run must be a flwr Run, got {type(run).__name__}")
        self._run = run

    @property
    def run(self) -> Run:
        """A copy of the run's information."""
        return dataclasses.replace(self._run)

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """A new message (Flower deprecates this for the ``Message`` constructor)."""
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        """Ids of the connected nodes."""
        return self._call(self._hub.node_ids())

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Send each message to its ``dst_node_id``; returns their message ids.

        Raises
        ------
        ValueError
            If a message is not a valid instruction (an error, a reply, a TTL <= 0).
        geofl.protocols.errors.TensorError
            If an array cannot travel (a dtype geofl does not carry, oversized configs).
        """
        prepared: dict[Hashable, PreparedArrays] = {}
        batch = [self._outgoing(message, prepared) for message in messages]
        ids = self._call(self._hub.push(batch))
        self._prepared = prepared  # the latest arrays, reused when they are sent again
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies that have arrived for ``message_ids`` (each is returned once)."""
        settled = self._call(self._hub.take(list(message_ids)))
        return [_reply(s.message, s.outcome) for s in settled]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Push ``messages`` and return their replies once all arrived or ``timeout`` passed.

        Messages still unanswered at the timeout are withdrawn: their nodes' late
        replies are refused and recorded ``late``.
        """
        ids = list(self.push_messages(messages))
        self._call(self._hub.wait(ids, timeout))
        replies = list(self.pull_messages(ids))
        if len(replies) < len(ids):
            self._call(self._hub.abandon(ids, "no reply within send_and_receive's timeout"))
        return replies

    # ------------------------------------------------------------ geofl's records

    def record_computed(
        self,
        number: int,
        source: ServerSource,
        metrics: Mapping[str, object],
        loss: float | None = None,
    ) -> None:
        """Record what the strategy computed on the server (see :mod:`.strategy_results`)."""
        self._call(self._hub.computed(number, source, dict(metrics), loss))

    # ------------------------------------------------------------ internals

    def _call(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        if self._loop.is_closed():
            coroutine.close()
            raise GridClosedError("the geofl server has stopped")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        while True:
            try:
                return future.result(timeout=_LOOP_CHECK_S)
            except concurrent.futures.TimeoutError:
                if self._loop.is_closed() or not self._loop.is_running():
                    future.cancel()
                    raise GridClosedError("the geofl server has stopped") from None

    def _outgoing(self, message: Message, prepared: dict[Hashable, PreparedArrays]) -> Outgoing:
        _check_instruction(message)
        # Flower's own grids assign the id the same way: the metadata has no setter.
        message.metadata.__dict__["_message_id"] = str(uuid.uuid4())
        records = message.content
        number, kind = round_of(message)
        return Outgoing(
            message=message,
            content=layout_to_wire(
                records, message.metadata.message_type, message.metadata.group_id
            ),
            arrays=self._arrays(records, prepared),
            round_number=number,
            kind=kind,
            group=group_of(message) if kind is not None else None,
        )

    def _arrays(
        self, records: RecordDict, prepared: dict[Hashable, PreparedArrays]
    ) -> PreparedArrays:
        key, keep = _arrays_key(records)
        found = prepared.get(key) or self._prepared.get(key)
        if found is None:
            tensors = arrays_to_tensors(records)
            found = PreparedArrays(key, keep, tensors, spec_of(tensors))
        prepared[key] = found
        return found


def _check_instruction(message: Message) -> None:
    """Flower's own checks of an outgoing message, and what geofl cannot deliver."""
    metadata = message.metadata
    if message.has_error() or not message.has_content():
        raise ValueError(f"a message to a node must carry content, not an error: {message}")
    if metadata.reply_to_message_id or metadata.ttl <= 0:
        raise ValueError(f"not a valid instruction message (a reply, or TTL <= 0): {message}")
    if not isinstance(message.content, RecordDict):
        raise ValueError(f"message content must be a RecordDict: {message}")
    if metadata.dst_task_id is not None or metadata.message_type == _SYSTEM_MESSAGE_TYPE:
        raise UnsupportedFlowerFeatureError(
            f"a {metadata.message_type!r} message to task {metadata.dst_task_id}: geofl delivers "
            "train, evaluate and query messages to nodes, not system messages or messages to "
            "tasks; send it to the node (dst_node_id) with one of those types"
        )
    if _SECAGG_RECORD in message.content.config_records:
        raise UnsupportedFlowerFeatureError(
            "the ServerApp runs Flower's SecAgg+ workflow (SecAggPlusWorkflow/SecAggWorkflow), "
            "whose stages need Flower's secaggplus_mod in every ClientApp; geofl's clients take "
            "that mod out. Run DefaultWorkflow without a secure-aggregation fit_workflow"
        )


def _reply(instruction: Message, outcome: Outcome) -> Message:
    """The Flower reply for a settled message: the node's content or an error."""
    update = outcome.payload
    if isinstance(update, MessageReply):
        error = error_from_wire(update.content)
        if error is not None:
            return Message(error, reply_to=instruction)
        if outcome.status == "ok":
            try:
                return Message(
                    records_from_wire(update.content, update.tensors), reply_to=instruction
                )
            except ProtocolError as exc:
                reason = f"the node's reply did not decode: {exc}"
                return Message(Error(ErrorCode.UNKNOWN, reason), reply_to=instruction)
    code = _STATUS_ERRORS.get(outcome.status, ErrorCode.UNKNOWN)
    reason = outcome.reason or outcome.status
    return Message(Error(code, f"{outcome.status}: {reason}"), reply_to=instruction)
