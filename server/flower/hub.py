"""The event-loop side of the Flower grid: messages become geofl tasks, replies come back.

A ServerApp runs in its own thread; each grid call reaches this hub on the
coordinator's event loop, which owns the registry, so nothing here needs a lock.
A pushed message becomes a ``"message"`` task in the node's mailbox (the node's
long-poll GetTask returns at once), and its arrays are published as a model version
that the node downloads in chunks.  Messages whose arrays are the same objects share
one version, and the version of the latest push stays published: a strategy's
evaluate messages and the next round's train messages carry the same global model,
so a node that holds it downloads nothing the second time.

A task settles with the node's reply, when its TTL expires, when the node drops out
(offline or re-joined: its mailbox is gone), or when the run ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from flwr.app import Message

from geofl.protocols.tensors import ModelSpec
from geofl.protocols.types import Weights
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.flower.errors import GridClosedError
from geofl.server.flower.recording import RoundBook, ServerSource
from geofl.server.models.store import ModelStore
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import NodeSession, Registry, TaskRecord

__all__ = ["MessageHub", "Outgoing", "PreparedArrays", "Settled"]

RoundKind = Literal["fit", "evaluate"]


@dataclass(frozen=True)
class PreparedArrays:
    """The arrays of a message as tensors, with the identity of their source objects.

    ``key`` identifies the source ArrayRecords' contents; ``keep`` holds the objects
    whose ``id()`` the key uses, so an id is never reused while the key is alive.
    """

    key: Hashable
    keep: tuple[Any, ...]
    tensors: Weights
    spec: ModelSpec


@dataclass(frozen=True)
class Outgoing:
    """A Flower message prepared for sending (in the ServerApp's thread)."""

    message: Message
    content: pb.FlowerContent
    arrays: PreparedArrays
    #: The round a train/evaluate message belongs to (0: not known).
    round_number: int
    #: None for messages that are not part of a round (query, custom types).
    kind: RoundKind | None
    #: A train/evaluate message's ``group_id`` when it names no round ("final"): no round's.
    group: str | None = None


@dataclass(frozen=True)
class Settled:
    """A message whose task has settled: the instruction and what became of it."""

    message: Message
    outcome: Outcome


@dataclass
class _Pending:
    message: Message
    session: NodeSession | None
    task: TaskRecord | None
    version: int
    round_number: int
    kind: RoundKind | None
    outcome: Outcome | None = None
    timer: asyncio.TimerHandle | None = None
    group: str | None = None


@dataclass
class _Version:
    number: int
    arrays: PreparedArrays
    users: int = 0


@dataclass
class _VersionBook:
    """Published versions by array identity; the latest push's versions stay published."""

    models: ModelStore
    by_key: dict[Hashable, _Version] = field(default_factory=dict)
    keys: dict[int, Hashable] = field(default_factory=dict)
    latest: set[Hashable] = field(default_factory=set)
    next_number: int = 1

    def acquire(self, arrays: PreparedArrays) -> int:
        entry = self.by_key.get(arrays.key)
        if entry is None:
            entry = _Version(self.next_number, arrays)
            self.next_number += 1
            self.models.put(entry.number, arrays.tensors)
            self.by_key[arrays.key] = entry
            self.keys[entry.number] = arrays.key
        entry.users += 1
        return entry.number

    def mark_latest(self, keys: set[Hashable]) -> None:
        previous, self.latest = self.latest, keys
        for key in previous - keys:
            self._drop_if_unused(key)

    def release(self, number: int) -> None:
        key = self.keys.get(number)
        entry = None if key is None else self.by_key.get(key)
        if key is None or entry is None:
            return
        entry.users -= 1
        if entry.users == 0:
            self.models.release_encoded(number)  # re-encoded if a node asks again
        self._drop_if_unused(key)

    def _drop_if_unused(self, key: Hashable) -> None:
        entry = self.by_key.get(key)
        if entry is not None and entry.users == 0 and key not in self.latest:
            del self.by_key[key], self.keys[entry.number]
            self.models.drop(entry.number)


class MessageHub:
    """Pending messages of one run; every method runs on the coordinator's loop."""

    def __init__(self, registry: Registry, models: ModelStore, rounds: RoundBook) -> None:
        self._registry = registry
        self._versions = _VersionBook(models)
        self._rounds = rounds
        self._pending: dict[str, _Pending] = {}
        self._closed = False
        self._reason = ""
        registry.changes.subscribe(self._nodes_changed)

    # ------------------------------------------------------------ grid calls

    async def node_ids(self) -> list[int]:
        """Ids of the online nodes."""
        if self._closed:
            raise GridClosedError(f"the run is over: {self._reason}")
        self._registry.expire()
        return [session.node_id for session in self._registry.online()]

    async def push(self, batch: Sequence[Outgoing]) -> list[str]:
        """Hand each message to its node; returns their message ids."""
        if self._closed:
            raise GridClosedError(f"the run is over: {self._reason}")
        sessions = {session.node_id: session for session in self._registry.online()}
        cohort = sum(1 for outgoing in batch if outgoing.kind is not None)
        ids = []
        for outgoing in batch:
            dst = outgoing.message.metadata.dst_node_id
            ids.append(self._push_one(outgoing, sessions.get(dst), cohort))
        self._versions.mark_latest({outgoing.arrays.key for outgoing in batch})
        return ids

    async def wait(self, message_ids: Sequence[str], timeout: float | None) -> None:
        """Return when every listed message has settled, or after ``timeout`` seconds."""
        futures = [
            p.task.future
            for p in (self._pending.get(i) for i in message_ids)
            if p is not None and p.task is not None and p.outcome is None
        ]
        if futures:
            await asyncio.wait(futures, timeout=timeout)

    async def take(self, message_ids: Sequence[str]) -> list[Settled]:
        """The settled messages among ``message_ids``, removed from the hub."""
        settled = []
        for message_id in message_ids:
            pending = self._pending.get(message_id)
            if pending is not None and pending.outcome is not None:
                del self._pending[message_id]
                settled.append(Settled(pending.message, pending.outcome))
        return settled

    async def abandon(self, message_ids: Sequence[str], reason: str) -> None:
        """Give up on messages nobody will pull: their tasks settle ``late``."""
        for message_id in message_ids:
            pending = self._pending.pop(message_id, None)
            if pending is not None and pending.task is not None:
                pending.task.settle(Outcome("late", reason))

    async def computed(
        self,
        number: int,
        source: ServerSource,
        metrics: Mapping[str, object],
        loss: float | None = None,
    ) -> None:
        """Record what the strategy computed on the server for round ``number``."""
        self._rounds.computed(number, source, metrics, loss)

    def close(self, reason: str) -> None:
        """End of the run: settle every open task as dropped, take no more messages."""
        self._closed, self._reason = True, reason
        for pending in list(self._pending.values()):
            if pending.task is not None:
                pending.task.settle(Outcome("dropped", reason))

    # ------------------------------------------------------------ internals

    def _push_one(self, outgoing: Outgoing, session: NodeSession | None, cohort: int) -> str:
        message = outgoing.message
        message_id = message.metadata.message_id
        number = 0
        if outgoing.kind is not None and outgoing.group is None:
            number = self._rounds.pushed(outgoing.round_number, outgoing.kind, cohort)
        if session is None:
            reason = f"node {message.metadata.dst_node_id} is not connected"
            self._pending[message_id] = _Pending(
                message, None, None, 0, number, outgoing.kind, Outcome("dropped", reason)
            )
            return message_id
        version = self._versions.acquire(outgoing.arrays)
        deadline = message.metadata.created_at + message.metadata.ttl
        task = self._registry.assign(
            session,
            "message",
            number,
            version,
            {},
            deadline,
            flower=outgoing.content,
            spec=outgoing.arrays.spec,
        )
        pending = _Pending(message, session, task, version, number, outgoing.kind)
        if outgoing.kind is not None and outgoing.group is not None:
            pending.group = outgoing.group
            self._rounds.group_pushed(outgoing.group, outgoing.kind)
        loop = asyncio.get_running_loop()
        expired = Outcome("late", "no reply within the message's TTL")
        pending.timer = loop.call_later(max(0.0, deadline - time.time()), task.settle, expired)
        task.future.add_done_callback(lambda _: self._settled(pending))
        self._pending[message_id] = pending
        return message_id

    def _settled(self, pending: _Pending) -> None:
        task = pending.task
        if task is None:
            return
        pending.outcome = task.future.result()
        if pending.timer is not None:
            pending.timer.cancel()
        self._versions.release(pending.version)
        if pending.kind is not None and pending.group is not None:
            self._rounds.group_settled(pending.group, pending.kind, pending.outcome)
        elif pending.kind is not None:
            self._rounds.settled(pending.round_number, pending.kind, task, pending.outcome)

    def _nodes_changed(self) -> None:
        """Settle the tasks of nodes that went offline or re-joined (their mailbox is gone)."""
        live = {session.node_id: session for session in self._registry.online()}
        for pending in list(self._pending.values()):
            if pending.task is None or pending.outcome is not None:
                continue
            if live.get(pending.task.node_id) is not pending.session:
                pending.task.settle(Outcome("dropped", "the node went offline or re-joined"))
