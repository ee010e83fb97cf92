"""Connected nodes, their sessions, and the tasks handed to them.

The registry is the only state the RPC handlers and the round engine share.
Everything runs on one asyncio event loop, so no locks are needed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from geofl.protocols.compression import UploadPlan
from geofl.protocols.errors import (
    ErrorCode,
    ForbiddenError,
    RunFinishedError,
    SessionError,
    TaskError,
)
from geofl.protocols.tensors import ModelSpec
from geofl.protocols.types import Config, Scalar
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.nodes.clock import WALL_CLOCK, Clock
from geofl.server.nodes.identity import NodeIdentity
from geofl.server.nodes.outcomes import Outcome

log = logging.getLogger(__name__)

#: Settled task ids remembered, to tell a duplicate upload from an unknown task.
_SETTLED_MEMORY = 100_000
#: Model versions remembered per node as bases of difference downloads.
_GIVEN_MEMORY = 8

#: Secure-aggregation stages are tasks too; "message" tasks carry a Flower message (see
#: :mod:`geofl.server.flower`).
TaskKindName = Literal["fit", "evaluate", "advertise", "share", "unmask", "message"]


@dataclass
class TaskRecord:
    """A task handed to a node, and the future the engine awaits."""

    task_id: int
    node_id: int
    kind: TaskKindName
    round: int
    model_version: int
    config: Config
    deadline: float  # time.time() seconds
    future: asyncio.Future[Outcome]
    issued_at: float = 0.0
    started_at: float | None = None
    upload: UploadPlan | None = None
    #: Secure-aggregation stage input; on a fit task it makes the upload a masked one.
    secagg: pb.SecAggTask | None = None
    bytes_down: int = 0
    bytes_down_raw: int = 0
    downloaded: asyncio.Event = field(default_factory=asyncio.Event)
    #: A message task's Flower message, whose arrays are the tensors of model_version.
    flower: pb.FlowerContent | None = None
    #: The tensors of a message task's model version (fit/evaluate use the run's model).
    spec: ModelSpec | None = None
    #: The registry's clock; it dates the settlement (the engine may notice it later).
    clock: Clock = WALL_CLOCK
    settled_at: float | None = None
    #: When the node had the model (download finished, or it already held the version).
    downloaded_at: float | None = None
    #: Upload attempts that have started (a node submits once per attempt).
    attempts: set[int] = field(default_factory=set)

    def mark_downloaded(self) -> None:
        """The node holds the task's model now: the broadcast for it is done."""
        if self.downloaded_at is None:
            self.downloaded_at = self.clock.time()
        self.downloaded.set()

    def settle(self, outcome: Outcome) -> None:
        """Resolve the task once; later outcomes are ignored."""
        if not self.future.done():
            self.settled_at = self.clock.time()
            self.future.set_result(outcome)


@dataclass
class NodeSession:
    """One connected node."""

    node_id: int
    name: str
    region: str | None
    node_config: dict[str, Scalar]
    token: str
    last_seen: float = 0.0  # Registry.clock.monotonic() of the last contact
    #: Long polls (``GetTask``) the node has open: each says it is there, so a node
    #: waiting for work needs no heartbeats (gRPC cancels the poll if it goes away).
    polls_open: int = 0
    mailbox: asyncio.Queue[TaskRecord] = field(default_factory=asyncio.Queue)
    current: TaskRecord | None = None
    online: bool = True
    #: Taken offline for silence only: its next call (from its connection) brings it back.
    expired: bool = False
    #: The proven identity (None on a server that authenticates no one).
    identity: NodeIdentity | None = None
    #: The connection an authenticated session is bound to (gRPC peer), else None.
    peer: str | None = None


class ChangeSignal:
    """Tells every subscriber that the set of available nodes may have changed.

    The engines wake their selection waits on it; the Flower hub answers node queries.
    """

    def __init__(self) -> None:
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` on every change; returns the function that unsubscribes it."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def notify(self) -> None:
        """A node joined, left, or finished a task."""
        for listener in list(self._listeners):
            listener()


class SimulatedNodes(Protocol):
    """Nodes that live in this process: they take their tasks, and their presence is simulated.

    Networked nodes poll their mailbox and prove they are alive with heartbeats; the
    virtual fleet and simulated relays are handed each task at once, and are online
    exactly while :meth:`is_present` says so.
    """

    def deliver(self, session: NodeSession, task: TaskRecord) -> None:
        """Start serving ``task`` for ``session``."""

    def is_present(self, session: NodeSession) -> bool:
        """Whether ``session``'s node is online now."""


class Registry:
    """Sessions by token, tasks by id, and liveness."""

    def __init__(
        self,
        heartbeat_interval_s: float,
        patience: int = 3,
        clock: Clock = WALL_CLOCK,
        selectable: Mapping[str, Scalar] | None = None,
    ) -> None:
        self.clock = clock
        self.heartbeat_interval_s = heartbeat_interval_s
        self._selectable = dict(selectable or {})
        self.changes = ChangeSignal()
        self._simulated: SimulatedNodes | None = None
        self._patience = patience
        self._by_token: dict[str, NodeSession] = {}
        self._by_id: dict[int, NodeSession] = {}
        self._tasks: dict[int, TaskRecord] = {}
        #: Recently settled tasks, by id: their node (a late duplicate is told so).
        self._settled: OrderedDict[int, int] = OrderedDict()
        #: The last model versions each node was given a task on (a difference download
        #: may start from them); a few per node, so a long run's memory stays flat.
        self._given: dict[int, deque[int]] = {}
        self._next_task_id = int(time.time() * 1000) << 8  # unique across restarts
        self.finished = asyncio.Event()
        self.shutdown_delivered: set[int] = set()

    def attach(self, nodes: SimulatedNodes) -> None:
        """Serve every node through ``nodes`` (a simulation), before any task is handed out.

        Raises
        ------
        RuntimeError
            If simulated nodes are attached already, or a task was handed out before.
        """
        if self._simulated is not None or self._tasks:
            raise RuntimeError("simulated nodes attach once, before the first task")
        self._simulated = nodes

    # ------------------------------------------------------------ sessions

    def add(
        self,
        node_id: int,
        name: str,
        region: str | None,
        config: dict[str, Scalar],
        *,
        identity: NodeIdentity | None = None,
        peer: str | None = None,
    ) -> str:
        """Register a (re)joined node; an older session of the same node is replaced.

        An authenticated session (``identity``) is bound to the connection ``peer``. The
        old session's open task goes to the new one (see :meth:`_carry_over`).
        """
        token = secrets.token_urlsafe(24)
        session = NodeSession(node_id, name, region, config, token, self.clock.monotonic())
        session.identity, session.peer = identity, peer
        old = self._by_id.pop(node_id, None)
        if old is not None:
            self._by_token.pop(old.token, None)
            self._carry_over(old, session)
        self._by_token[token] = session
        self._by_id[node_id] = session
        self.changes.notify()
        return token

    def _carry_over(self, old: NodeSession, new: NodeSession) -> None:
        """Give the re-joined node its open task again instead of dropping it.

        A node re-joins when it could not reach the server for a while, e.g. its long
        poll timed out while the coordinator waited out a database outage; the task may
        have been handed to the old session in the meantime without the node ever
        hearing of it. A task whose upload has not started goes to the new session's
        mailbox (the node is sent it again); one being uploaded stays with the node,
        and the upload settles it.
        """
        task = old.current
        old.current = None
        if task is None or task.future.done():
            return
        new.current = task
        if task.attempts:
            return
        if self._simulated is not None:
            self._simulated.deliver(new, task)
        else:
            new.mailbox.put_nowait(task)

    def session(self, token: str | None, peer: str | None = None) -> NodeSession:
        """The live session for ``token``; touching it counts as a heartbeat.

        A session bound to a connection is only found from that connection (``peer``):
        a token presented from another one is unknown there.
        """
        session = self._by_token.get(token or "")
        if session is None or not (session.online or session.expired):
            raise SessionError("unknown node session; join again")
        if session.peer is not None and peer != session.peer:
            raise SessionError(
                f"the session of node {session.name!r} is bound to another connection; join again"
            )
        session.last_seen = self.clock.monotonic()
        if not session.online:
            self._revive(session)
        return session

    def _revive(self, session: NodeSession) -> None:
        """A node taken offline for silence called again: it is online again.

        Its call may only have waited in a queue (a saturated server, a slow network) or
        its network came back; making it join again would cost a join (with a signature
        check) per node, which in a join storm feeds the storm. The task it held was
        dropped when it went offline and stays so. Flower's SuperLink does the same: a
        node marked offline is online again at its next heartbeat.
        """
        session.online, session.expired = True, False
        log.info("node %d (%s) is back online", session.node_id, session.name)
        self.changes.notify()

    def bound_session(self, token: str | None) -> NodeSession | None:
        """The live session of ``token`` if it is bound to a connection (else ``None``)."""
        session = self._by_token.get(token or "")
        return session if session is not None and session.peer is not None else None

    def end_sessions(self, keep: Callable[[NodeIdentity], bool], reason: str) -> list[NodeSession]:
        """End every authenticated session whose identity ``keep`` refuses (revocation)."""
        ended = [
            s
            for s in self._by_id.values()
            if (s.online or s.expired) and s.identity is not None and not keep(s.identity)
        ]
        for session in ended:
            session.online = session.expired = False
            self._by_token.pop(session.token, None)
            self._drop_current(session, reason)
        if ended:
            self.changes.notify()
        return ended

    def available(self) -> list[NodeSession]:
        """Online, selectable nodes with no task in hand, in join order."""
        return [
            s for s in self._by_id.values() if s.online and s.current is None and self.selectable(s)
        ]

    def selectable(self, session: NodeSession) -> bool:
        """Whether rounds may give ``session`` work (``schedule.selection.node_config``)."""
        config = session.node_config
        return all(config.get(key) == value for key, value in self._selectable.items())

    def online(self) -> list[NodeSession]:
        """Every online node."""
        return [s for s in self._by_id.values() if s.online]

    def forgive_silence(self) -> None:
        """Count every online node as heard from now.

        After the server itself could not listen (its event loop waited out a database
        outage), missed heartbeats say nothing about the nodes.
        """
        now = self.clock.monotonic()
        for session in self._by_id.values():
            if session.online:
                session.last_seen = max(session.last_seen, now)

    def expire(self) -> list[NodeSession]:
        """Mark nodes that missed ``patience`` heartbeats offline; return them.

        A node with a long poll open is not silent: the poll is its heartbeat. A node
        that vanished without closing its connection is found once that poll times out
        (at most the server's longest poll) plus ``patience`` intervals. Its session
        stays known: a later call of it brings it back (see :meth:`session`).

        With simulated nodes attached, a node is online exactly while they say so, and
        one that comes back is online again.
        """
        if self._simulated is not None:
            return self._apply_presence(self._simulated)
        limit = self.clock.monotonic() - self._patience * self.heartbeat_interval_s
        gone = [
            s
            for s in self._by_id.values()
            if s.online and s.polls_open == 0 and s.last_seen < limit
        ]
        for session in gone:
            session.online, session.expired = False, True
            self._drop_current(session, "node stopped sending heartbeats")
        if gone:
            self.changes.notify()
        return gone

    def _apply_presence(self, nodes: SimulatedNodes) -> list[NodeSession]:
        gone: list[NodeSession] = []
        changed = False
        for session in self._by_id.values():
            here = nodes.is_present(session)
            if here == session.online:
                continue
            changed = True
            session.online = here
            if not here:
                gone.append(session)
                self._drop_current(session, "node went offline (availability trace)")
        if changed:
            self.changes.notify()
        return gone

    def _drop_current(self, session: NodeSession, reason: str) -> None:
        if session.current is not None:
            session.current.settle(Outcome("dropped", reason))
            session.current = None

    # ------------------------------------------------------------ tasks

    def assign(
        self,
        session: NodeSession,
        kind: TaskKindName,
        round_number: int,
        model_version: int,
        config: Config,
        deadline: float,
        upload: UploadPlan | None = None,
        secagg: pb.SecAggTask | None = None,
        *,
        flower: pb.FlowerContent | None = None,
        spec: ModelSpec | None = None,
    ) -> TaskRecord:
        """Create a task for ``session`` and put it in its mailbox."""
        if self.finished.is_set():
            raise RunFinishedError("the run is over")
        self._next_task_id += 1
        loop = asyncio.get_running_loop()
        task = TaskRecord(
            self._next_task_id,
            session.node_id,
            kind,
            round_number,
            model_version,
            config,
            deadline,
            loop.create_future(),
            upload=upload,
            secagg=secagg,
            issued_at=self.clock.time(),
            clock=self.clock,
            flower=flower,
            spec=spec,
        )
        self._tasks[task.task_id] = task
        given = self._given.setdefault(session.node_id, deque(maxlen=_GIVEN_MEMORY))
        if model_version not in given:
            given.append(model_version)
        session.current = task
        if self._simulated is not None:
            self._simulated.deliver(session, task)
        else:
            session.mailbox.put_nowait(task)
        task.future.add_done_callback(lambda _: self._release(task))
        return task

    def _release(self, task: TaskRecord) -> None:
        self._tasks.pop(task.task_id, None)
        self._settled[task.task_id] = task.node_id
        while len(self._settled) > _SETTLED_MEMORY:
            self._settled.popitem(last=False)
        session = self._by_id.get(task.node_id)
        if session is not None and session.current is task:
            session.current = None
            self.changes.notify()

    def task_for(self, session: NodeSession, task_id: int) -> TaskRecord:
        """The open task ``task_id`` of this node.

        Raises
        ------
        ForbiddenError
            If the task is (or was) another node's.
        TaskError
            ``DUPLICATE_RESULT`` if this node's task is settled already, else
            ``UNKNOWN_TASK``.
        """
        task = self._tasks.get(task_id)
        owner = task.node_id if task is not None else self._settled.get(task_id)
        if owner is not None and owner != session.node_id:
            raise ForbiddenError(f"task {task_id} was given to another node, not to this one")
        if task is None or task.future.done():
            if owner is not None:
                raise TaskError(
                    f"task {task_id} is settled already", code=ErrorCode.DUPLICATE_RESULT
                )
            raise TaskError(f"task {task_id} is not open for node {session.node_id}")
        return task

    def start_upload(self, task: TaskRecord, attempt: int) -> None:
        """Admit one upload per attempt of ``task``; a second one is a replay.

        Raises
        ------
        TaskError
            ``DUPLICATE_RESULT`` if an upload of this attempt started already.
        """
        if attempt in task.attempts:
            raise TaskError(
                f"task {task.task_id} attempt {attempt} was uploaded already",
                code=ErrorCode.DUPLICATE_RESULT,
            )
        task.attempts.add(attempt)

    def was_given(self, node_id: int, model_version: int) -> bool:
        """Whether ``node_id`` was handed a task on ``model_version`` (so may hold it)."""
        return model_version in self._given.get(node_id, ())


__all__ = [
    "ChangeSignal",
    "NodeSession",
    "Registry",
    "SimulatedNodes",
    "TaskKindName",
    "TaskRecord",
]
