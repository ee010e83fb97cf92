"""The dashboard's picture of a run: a round observer that keeps it, and hands out deltas.

The observer runs on the coordinator's event loop; the dashboard reads from its own thread.
Every event only updates plain dictionaries under one lock and notes what changed; the
dashboard's thread asks for :meth:`LiveState.take_delta` a few times a second and sends
the changes (one client's new status, one new round) to the browsers, never the whole
state; a client travels as a list of :data:`~geofl.server.dashboard.history.CLIENT_FIELDS`
(a thousand of them encode 2.5 times faster as lists than as objects). A browser that
connects gets :meth:`LiveState.snapshot` once. So a round of a thousand clients costs the
coordinator a thousand small updates, not a thousand messages, and one slow browser
cannot slow a round.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from geofl.protocols.types import WeightsView
from geofl.server.dashboard.history import CLIENT_FIELDS, FIELD, History, new_client, numeric
from geofl.server.nodes.clock import WALL_CLOCK, Clock
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import Registry, TaskRecord
from geofl.server.rounds.observers import RoundObserver
from geofl.server.rounds.records import Phase, RoundRecord, secagg_abort_stage
from geofl.server.scheduling.measurements import LinkEstimate

__all__ = ["NO_REGION", "SECAGG_STAGES", "LiveState"]

_REGION, _RELAY, _ONLINE = FIELD["region"], FIELD["relay"], FIELD["online"]
_STATUS, _KIND, _ROUND, _TASKS = FIELD["status"], FIELD["kind"], FIELD["round"], FIELD["tasks"]
_FAILURES, _UP, _DOWN = FIELD["failures"], FIELD["bytes_up"], FIELD["bytes_down"]
_RTT, _DOWN_BPS, _UP_BPS = FIELD["rtt_s"], FIELD["down_bps"], FIELD["up_bps"]
_AVAILABILITY = FIELD["availability"]
_SECAGG_STAGES = frozenset({"advertise", "share", "unmask"})

#: Region name of nodes that named none.
NO_REGION = "none"
#: The task kinds of secure aggregation's stages, in order.
SECAGG_STAGES = ("advertise", "share", "fit", "unmask")
#: Failed secure-aggregation rounds kept (the newest).
MAX_ABORTS = 50


def _round_row(record: RoundRecord, status: str, seconds: float | None) -> dict[str, Any]:
    """A finished round as the page charts it (the fields of the history's rounds)."""
    bytes_up = sum(outcome.bytes_up for _, outcome in record.outcomes)
    bytes_down = sum(task.bytes_down for task, _ in record.outcomes)
    ok = sum(1 for task, o in record.outcomes if o.status == "ok" and task.kind == "fit")
    fit = sum(1 for task, _ in record.outcomes if task.kind == "fit")
    return {
        "number": record.number,
        "status": "committed" if status == "committed" else "failed",
        "duration_s": seconds if seconds is not None else sum(record.phase_durations.values()),
        "bytes_up": bytes_up,
        "bytes_down": bytes_down,
        "num_succeeded": ok,
        "num_failed": fit - ok,
        "train_loss": record.train_loss,
        "eval_loss": record.eval_loss,
        "server_eval_loss": record.server_eval_loss,
        "metrics": {
            "fit": numeric(record.fit_metrics),
            "eval": numeric(record.eval_metrics),
            "server_eval": numeric(record.server_eval_metrics),
        },
        "error": None if status == "committed" else status.removeprefix("failed: "),
    }


def _encode(message: dict[str, Any]) -> str:
    """``message`` as JSON text, by orjson: a thousand client rows encode about five
    times faster than with :func:`json.dumps`, and a NaN becomes ``null`` (which the
    browser's ``JSON.parse`` accepts) rather than ``NaN`` (which it refuses)."""
    return orjson.dumps(message, option=orjson.OPT_NON_STR_KEYS).decode()


class LiveState(RoundObserver):
    """What the dashboard shows of one run, kept current by the run's round events.

    Parameters
    ----------
    history
        The run as the database had it when the dashboard started (the rounds before).
    registry
        The run's nodes: who is online, their names, regions and whether they are relays.
    clock
        The coordinator's clock (round durations are its seconds).
    wall
        Real time, stamped on every delta (the page measures its lag from it).
    """

    def __init__(
        self,
        history: History,
        registry: Registry,
        clock: Clock = WALL_CLOCK,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._lock = threading.Lock()
        self._registry = registry
        self._clock = clock
        self._wall = wall
        self._seq = 0
        self._run: dict[str, Any] = dict(history.run)
        self._runs: list[dict[str, Any]] = list(history.runs)
        self._rounds: list[dict[str, Any]] = list(history.rounds)
        self._regions: dict[str, dict[str, int]] = {
            region: dict(totals) for region, totals in history.regions.items()
        }
        self._clients: dict[int, list[Any]] = {
            node_id: list(client) for node_id, client in history.clients.items()
        }
        self._current: dict[str, Any] | None = None
        self._aborts: list[dict[str, Any]] = list(history.aborts)
        self._started_at: dict[int, float] = {}
        self._dirty_clients: set[int] = set()
        self._dirty_regions: set[str] = set()
        self._new_rounds: list[dict[str, Any]] = []
        self._dirty_current = self._dirty_run = self._dirty_aborts = False
        #: The registry changed since the last recount; on which loop it lives.
        self._nodes_dirty = False
        self._recount_asked = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unsubscribe = registry.changes.subscribe(self._nodes_changed)
        self.recount_nodes()

    # ------------------------------------------------------------ what the page reads

    def snapshot_json(self) -> str:
        """Everything, as JSON, for a browser that just connected (then it gets deltas).

        Encoded under the lock from the state itself: no copy of a thousand clients.
        """
        with self._lock:
            return _encode(
                {
                    "seq": self._seq,
                    "sent_at": self._wall(),
                    "run": self._run,
                    "runs": self._runs,
                    "rounds": self._rounds,
                    "current": self._current,
                    "regions": self._regions,
                    "client_fields": CLIENT_FIELDS,
                    "clients": self._clients,  # int keys: JSON makes them strings
                    "aborts": self._aborts,
                }
            )

    def snapshot(self) -> dict[str, Any]:
        """:meth:`snapshot_json`, decoded (what the page receives)."""
        decoded: dict[str, Any] = json.loads(self.snapshot_json())
        return decoded

    def _changed(self) -> bool:
        return bool(
            self._dirty_clients
            or self._dirty_regions
            or self._new_rounds
            or self._dirty_current
            or self._dirty_run
            or self._dirty_aborts
        )

    def _forget_changes(self) -> None:
        self._dirty_clients, self._dirty_regions, self._new_rounds = set(), set(), []
        self._dirty_current = self._dirty_run = self._dirty_aborts = False

    def take_delta_json(self) -> str | None:
        """What changed since the last call, as JSON (``None``: nothing); then forgotten.

        Encoded under the lock, from the state itself, as :meth:`snapshot_json` is.
        """
        with self._lock:
            if not self._changed():
                return None
            self._seq += 1
            delta: dict[str, Any] = {"seq": self._seq, "sent_at": self._wall()}
            if self._dirty_run:
                delta["run"] = self._run
            if self._new_rounds:
                delta["rounds"] = self._new_rounds
            if self._dirty_current:
                delta["current"] = self._current
            if self._dirty_regions:
                delta["regions"] = {r: self._regions[r] for r in self._dirty_regions}
            if self._dirty_clients:
                clients = self._clients
                delta["clients"] = {node_id: clients[node_id] for node_id in self._dirty_clients}
            if self._dirty_aborts:
                delta["aborts"] = self._aborts
            encoded = _encode(delta)
            self._forget_changes()
            return encoded

    def take_delta(self) -> dict[str, Any] | None:
        """:meth:`take_delta_json`, decoded."""
        encoded = self.take_delta_json()
        return None if encoded is None else dict(json.loads(encoded))

    def skip_changes(self) -> None:
        """Forget what changed without encoding it (no browser is watching); a browser
        that connects later starts from a snapshot anyway."""
        with self._lock:
            if self._changed():
                self._seq += 1
                self._forget_changes()

    # ------------------------------------------------------------ nodes

    def _nodes_changed(self) -> None:
        """The registry changed: only noted. A recount reads every node, and the registry
        changes with every task on the virtual clock (where half a simulated second may be
        a few real milliseconds), so recounts happen at each round's start and end and when
        the dashboard's thread asks (:meth:`request_recount`, in real time)."""
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # changed outside a loop (set-up): count now
            self.recount_nodes()
            return
        self._nodes_dirty = True

    def request_recount(self) -> None:
        """From the dashboard's thread: have the coordinator's loop recount the online
        nodes, if the registry changed (once per request until it has)."""
        loop = self._loop
        if not self._nodes_dirty or self._recount_asked or loop is None:
            return
        self._recount_asked = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: the run is over
            loop.call_soon_threadsafe(self.recount_nodes)

    def recount_nodes(self) -> None:
        """Mark who is online from the registry (on the coordinator's loop)."""
        self._nodes_dirty = self._recount_asked = False
        online = {session.node_id: session for session in self._registry.online()}
        with self._lock:
            for node_id, session in online.items():
                client = self._clients.get(node_id)
                relay = bool(session.node_config.get("relay", False))
                if client is None:
                    self._clients[node_id] = new_client(session.name, session.region, relay, True)
                    self._dirty_clients.add(node_id)
                elif not client[_ONLINE] or client[_RELAY] != relay:
                    client[_ONLINE], client[_RELAY] = True, relay
                    self._dirty_clients.add(node_id)
            for node_id, client in self._clients.items():
                if client[_ONLINE] and node_id not in online:
                    client[_ONLINE] = False
                    self._dirty_clients.add(node_id)

    # ------------------------------------------------------------ rounds

    def round_started(self, number: int, cohort_target: int) -> None:
        if self._nodes_dirty:
            self.recount_nodes()
        self._started_at[number] = self._clock.monotonic()
        with self._lock:
            self._current = {
                "number": number,
                "phase": "select",
                "cohort_target": cohort_target,
                "settled": 0,
                "by_status": {},
                "stages": {},
                "phase_s": {},
            }
            self._dirty_current = True

    def phase(self, number: int, phase: Phase, seconds_in_previous: float | None) -> None:
        with self._lock:
            current = self._current
            if current is None or current["number"] != number:
                return
            previous = current["phase"]
            if seconds_in_previous is not None:
                current["phase_s"][previous] = seconds_in_previous
            current["phase"] = phase.value
            self._dirty_current = True

    def task_settled(self, number: int, task: TaskRecord, outcome: Outcome) -> None:
        # A thousand a round: one dictionary look-up per table, nothing recomputed.
        node_id, status, up, down = task.node_id, outcome.status, outcome.bytes_up, task.bytes_down
        client = self._clients.get(node_id)
        if client is None:  # joined since the last recount
            self.recount_nodes()
        with self._lock:
            client = self._clients.get(node_id)
            if client is None:
                client = self._clients[node_id] = new_client(f"node {node_id}", None, False, True)
            client[_STATUS] = status
            client[_KIND] = task.kind
            client[_ROUND] = number
            client[_TASKS] += 1
            if status != "ok":
                client[_FAILURES] += 1
            client[_UP] += up
            client[_DOWN] += down
            self._dirty_clients.add(node_id)
            region = client[_REGION] or NO_REGION
            totals = self._regions.get(region)
            if totals is None:
                totals = self._regions[region] = {"bytes_up": 0, "bytes_down": 0}
            totals["bytes_up"] += up
            totals["bytes_down"] += down
            self._dirty_regions.add(region)
            current = self._current
            if current is not None and current["number"] == number:
                current["settled"] += 1
                by_status = current["by_status"]
                by_status[status] = by_status.get(status, 0) + 1
                if task.secagg is not None or task.kind in _SECAGG_STAGES:
                    stage = current["stages"].setdefault(task.kind, {})
                    stage[status] = stage.get(status, 0) + 1
                self._dirty_current = True

    def round_failed(self, record: RoundRecord, reason: str) -> None:
        stage = secagg_abort_stage(reason)
        if stage is None:
            return
        with self._lock:
            self._aborts.append({"round": record.number, "stage": stage, "reason": reason})
            del self._aborts[:-MAX_ABORTS]
            self._dirty_aborts = True

    def round_ended(self, record: RoundRecord, status: str) -> None:
        if self._nodes_dirty:
            self.recount_nodes()
        started = self._started_at.pop(record.number, None)
        seconds = None if started is None else self._clock.monotonic() - started
        row = _round_row(record, status, seconds)
        with self._lock:
            self._rounds.append(row)
            self._new_rounds.append(row)
            if status == "committed":
                self._run["last_committed_round"] = record.number
                self._dirty_run = True
            if self._current is not None and self._current["number"] == record.number:
                self._current["phase"] = "commit" if status == "committed" else "failed"
                self._current["ended"] = True
                self._dirty_current = True

    def measurements(self, number: int, estimates: Sequence[LinkEstimate]) -> None:
        # Rounded to what the page shows (0.1 ms, 1 bit/s): short numbers encode faster.
        # A thousand estimates a round: the rounding is inlined, and a client whose shown
        # figures did not change is not sent again.
        clients, dirty = self._clients, self._dirty_clients
        with self._lock:
            for estimate in estimates:
                client = clients.get(estimate.node_id)
                if client is None:
                    continue
                rtt, down, up, availability = (
                    estimate.rtt_s,
                    estimate.down_bps,
                    estimate.up_bps,
                    estimate.availability,
                )
                shown = (
                    None if rtt is None else round(rtt, 4),
                    None if down is None else round(down),
                    None if up is None else round(up),
                    None if availability is None else round(availability, 3),
                )
                if shown != (
                    client[_RTT],
                    client[_DOWN_BPS],
                    client[_UP_BPS],
                    client[_AVAILABILITY],
                ):
                    client[_RTT], client[_DOWN_BPS], client[_UP_BPS], client[_AVAILABILITY] = shown
                    dirty.add(estimate.node_id)

    async def round_committed(
        self, record: RoundRecord, weights: WeightsView, state: WeightsView
    ) -> None:
        """Nothing to keep: :meth:`round_ended` follows with the round's figures."""

    # ------------------------------------------------------------ life

    def finish(self, status: str) -> None:
        """The run ended with ``status`` (the page says so); stop following the registry."""
        self._unsubscribe()
        self._loop = None
        with self._lock:
            self._run["status"] = status
            for run in self._runs:
                if run.get("id") == self._run.get("id"):
                    run["status"] = status
            self._dirty_run = True
