"""Regional relays on the virtual clock: hierarchical aggregation, simulated.

With ``simulation.relays`` the coordinator's nodes are one relay per region, as on the
wall clock (``geofl relay``). Each relay here is the same machinery a relay process runs
(a synchronous engine with a :class:`MemoryRecorder` observer over a registry of the
region's clients, :class:`VersionPlan` numbering, :func:`local_budget`), fed by a
:class:`VirtualFleet` of the region's clients instead of gRPC. A fit task of the
coordinator is:

1. the relay downloads the global model over its WAN link (the region's ``rtt_ms``,
   ``simulation.relay.mbps`` each way; the task's notice and its request cost one round
   trip more, as for every client: :meth:`ClientLink.fetch_s`);
2. it runs ``local_rounds`` regional FedAvg rounds in the time the coordinator's deadline
   leaves after its own upload (:func:`regional_budget`): its clients download from and
   upload to the relay over their own access links with ``simulation.relay.rtt_ms``;
3. it uploads the difference of the regional model to the global one over its WAN link,
   weighted by the examples of the clients that contributed.

The tree is scheduled top-down: the coordinator selects relays; each relay picks its
clients with the run's selection policy (deadline-aware selection uses the relay's own
measurements of its clients) under that regional deadline; ``simulation.relay.cohort``
clients per global round are split among the regions in proportion to their clients.
Uploads inside a region are not compressed (as with relay processes, whose regional
rounds have no compression plan).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from geofl.protocols.tensors import ModelSpec, model_bytes
from geofl.protocols.types import Scalar, Weights, WeightsView
from geofl.server.config import CompressionConfig, RunConfig, ScheduleConfig
from geofl.server.config.robust import regional_strategy
from geofl.server.models.store import ModelStore
from geofl.server.nodes.clock import Clock
from geofl.server.nodes.outcomes import DeltaUpdate, Outcome
from geofl.server.nodes.registry import NodeSession, Registry, TaskRecord
from geofl.server.relay.rounds import (
    MemoryRecorder,
    RegionalError,
    VersionPlan,
    regional_round_config,
)
from geofl.server.rounds.factory import make_engine
from geofl.server.rounds.parts import EngineParts
from geofl.server.rounds.records import EngineSettings, NoClientsError
from geofl.server.rounds.sync import SyncEngine
from geofl.server.scheduling.scheduler import Scheduler, SchedulerSettings
from geofl.server.simulation.backends import Backend
from geofl.server.simulation.fleet import FleetStats, InFlight, VirtualFleet, VirtualUpdate
from geofl.server.simulation.links import ClientLink
from geofl.server.simulation.traces import ClientTrace
from geofl.server.simulation.workers import UploadedTensor
from geofl.server.strategies import Strategy

__all__ = ["UPLOAD_SLACK", "VirtualRelays", "regional_budget", "regional_cohorts"]

log = logging.getLogger(__name__)

#: Share of the regional time kept back, so an upload after a round that ran to its
#: deadline still arrives before the coordinator's.
UPLOAD_SLACK = 0.02


def regional_budget(
    remaining_s: float, upload_s: float, schedule: ScheduleConfig, rounds: int
) -> tuple[float, float]:
    """(deadline of each regional round, wait for clients) inside the coordinator's task.

    The relay knows its uplink (the WAN model's), so it keeps its upload's time plus
    :data:`UPLOAD_SLACK` of the rest (a regional round may use its whole deadline), and
    splits what is left over its regional rounds. A relay process does not know it and
    keeps 10 %, at least 1 s (:func:`geofl.server.relay.rounds.local_budget`).

    Raises
    ------
    RegionalError
        If the upload alone would miss the coordinator's deadline.
    """
    usable = (remaining_s - upload_s) * (1 - UPLOAD_SLACK)
    if usable <= 0:
        raise RegionalError(
            f"the coordinator's deadline is {remaining_s:.2f} s away and the relay's upload "
            f"takes {upload_s:.2f} s: no time for regional rounds"
        )
    return min(schedule.deadline_s, usable / rounds), min(schedule.wait_for_clients_s, usable)


def regional_cohorts(
    counts: dict[str, int], cohort: int | None, min_clients: int
) -> dict[str, int]:
    """Clients per regional round: ``cohort`` split by the regions' client counts.

    Each region gets at least ``min(min_clients, its clients)`` and at most its clients;
    within those bounds the shares follow the client counts (largest remainders first)
    and sum to ``cohort`` whenever the bounds allow. ``None`` takes every client.
    """
    if cohort is None:
        return dict(counts)
    total = sum(counts.values()) or 1
    exact = {name: cohort * count / total for name, count in counts.items()}
    low = {name: min(min_clients, count) for name, count in counts.items()}
    shares = {name: min(counts[name], max(low[name], math.floor(exact[name]))) for name in counts}
    while sum(shares.values()) < cohort:
        room = [name for name in counts if shares[name] < counts[name]]
        if not room:
            break
        shares[max(room, key=lambda n: exact[n] - shares[n])] += 1
    while sum(shares.values()) > cohort:
        spare = [name for name in counts if shares[name] > low[name]]
        if not spare:
            break
        shares[max(spare, key=lambda n: shares[n] - exact[n])] -= 1
    return shares


@dataclass
class _Region:
    """One relay: its WAN link, its clients' registry and fleet, its regional state."""

    name: str
    uplink: ClientLink
    registry: Registry
    models: ModelStore
    fleet: VirtualFleet
    scheduler: Scheduler
    versions: VersionPlan
    cohort: int
    #: FedAvg, or a robust rule in front of it (simulation.relay.robust), kept across tasks.
    strategy: Strategy
    held: int = -1


class VirtualRelays:
    """The coordinator's simulated relay nodes, one per region, and their clients."""

    def __init__(
        self,
        *,
        config: RunConfig,
        registry: Registry,
        models: ModelStore,
        backend: Backend,
        clock: Clock,
        links: Sequence[ClientLink],
        traces: Sequence[ClientTrace] | None,
        spec: ModelSpec,
        run_id: int,
    ) -> None:
        self._config = config
        self._registry = registry
        self._models = models
        self._clock = clock
        self._spec = spec
        self._regions: dict[int, _Region] = {}
        self._pending = [
            self._region(name, links, traces, backend, run_id) for name in config.simulation.regions
        ]
        self._in_flight = InFlight()

    @property
    def stats(self) -> FleetStats:
        """What the regions' clients moved (over their links to the relays)."""
        total = FleetStats({}, {})
        for region in self._pending:
            stats = region.fleet.stats
            for name in stats.bytes_up:
                total.add(name, stats.bytes_up[name], stats.bytes_down[name])
            total.jobs += stats.jobs
            total.skipped += stats.skipped
            total.cpu_s += stats.cpu_s
        return total

    def _region(
        self,
        name: str,
        links: Sequence[ClientLink],
        traces: Sequence[ClientTrace] | None,
        backend: Backend,
        run_id: int,
    ) -> _Region:
        simulation = self._config.simulation
        relay = simulation.relay
        model = simulation.regions[name]
        members = [link for link in links if link.region == name]
        to_relay = [replace(link, rtt_s=relay.rtt_ms / 1000) for link in members]
        registry = Registry(self._config.server.heartbeat_interval_s, clock=self._clock)
        models = ModelStore(self._config.server.chunk_bytes)
        fleet = VirtualFleet(
            registry=registry,
            models=models,
            backend=backend,
            clock=self._clock,
            links=to_relay,
            traces=[traces[link.client] for link in members] if traces is not None else None,
            compression=CompressionConfig(),
            spec=self._spec,
            run_id=run_id,
            seed=self._config.run.seed,
            name=f"relay-{name}",
        )
        fleet.join(lambda names: [link.client + 1 for link in members])
        counts = {region: 0 for region in simulation.regions}
        for link in links:
            counts[link.region] += 1
        cohort = regional_cohorts(counts, relay.cohort, relay.min_clients)[name]
        bps = relay.mbps * 1e6
        uplink = ClientLink(
            -1, name, model.rtt_ms / 1000, bps, bps, model.jitter_ms / 1000, model.loss, math.inf
        )
        return _Region(
            name,
            uplink,
            registry,
            models,
            fleet,
            Scheduler(self._scheduler_settings(self._config.schedule.deadline_s, cohort)),
            VersionPlan(relay.local_rounds),
            cohort,
            regional_strategy(relay.robust),
        )

    def _scheduler_settings(self, deadline_s: float, cohort: int) -> SchedulerSettings:
        return SchedulerSettings(
            selection=self._config.schedule.selection,
            deadline_s=deadline_s,
            over_select=self._config.schedule.over_select,
            model_bytes=model_bytes(self._spec),
            min_clients=min(self._config.simulation.relay.min_clients, cohort),
        )

    # ------------------------------------------------------------ joining

    def join(self, join_nodes: Callable[[Sequence[tuple[str, str | None]]], list[int]]) -> None:
        """Register every relay with the coordinator (database rows, then sessions)."""
        names = [(f"relay-{region.name}", region.name) for region in self._pending]
        for region, (name, _), node_id in zip(self._pending, names, join_nodes(names), strict=True):
            self._registry.add(node_id, name, region.name, {"relay": True})
            self._regions[node_id] = region
        self._registry.attach(self)

    def is_present(self, session: NodeSession) -> bool:
        """Always: simulated relays never drop out (they send no heartbeats to stay alive)."""
        return True

    def deliver(self, session: NodeSession, task: TaskRecord) -> None:
        """Serve a fit or evaluate task with the region's clients; other kinds fail."""
        region = self._regions[session.node_id]
        if task.kind not in ("fit", "evaluate"):
            task.settle(Outcome("failed", f"simulated relays cannot run {task.kind} tasks"))
            return
        self._in_flight.start(self._serve(region, task))

    async def close(self) -> None:
        """Cancel work in flight, the relays' and their clients'."""
        await self._in_flight.cancel()
        for region in self._pending:
            await region.fleet.close()

    # ------------------------------------------------------------ one task

    async def _serve(self, region: _Region, task: TaskRecord) -> None:
        try:
            if task.kind == "fit":
                outcome = await self._fit(region, task)
            else:
                outcome = await self._evaluate(region, task)
        except asyncio.CancelledError:
            raise
        except (RegionalError, NoClientsError) as exc:
            outcome = Outcome("failed", f"region {region.name}: {exc}")
        except Exception as exc:  # a bug here must not hang the coordinator's round
            log.exception("simulated relay %s failed", region.name)
            outcome = Outcome("failed", f"simulator error in relay {region.name}: {exc}")
        task.settle(outcome)

    async def _fit(self, region: _Region, task: TaskRecord) -> Outcome:
        task.started_at = self._clock.time()
        if region.cohort == 0:
            raise RegionalError(
                "has no simulated clients (simulation.clients is too small for its share)"
            )
        weights = await self._download(region, task)
        nbytes = model_bytes(self._spec)
        upload_s = region.uplink.upload_s(nbytes)
        deadline_s, wait_s = regional_budget(
            task.deadline - self._clock.time(),
            upload_s,
            self._config.schedule,
            self._config.simulation.relay.local_rounds,
        )
        recorder = MemoryRecorder()
        first, last = region.versions.rounds(task.model_version)
        region.scheduler.settings = self._scheduler_settings(deadline_s, region.cohort)
        engine = make_engine(
            self._engine_settings(region, last, deadline_s, wait_s, task.config),
            self._regional_parts(region, recorder, first, weights, region.scheduler),
        )
        try:
            await engine.run()
        except NoClientsError:
            if not recorder.committed:
                raise
        finally:
            for version in range(first - 1, last + 1):
                region.models.drop(version)
        result = recorder.result()
        update = _difference(result.weights, weights)
        await asyncio.sleep(upload_s)
        if self._clock.time() > task.deadline:
            return Outcome("late", "the relay's upload arrived after the round deadline")
        loss = result.metrics.get("train_loss")
        return Outcome(
            "ok",
            num_examples=result.num_examples,
            loss=float(loss) if isinstance(loss, int | float) else None,
            metrics=dict(result.metrics),
            payload=DeltaUpdate(update, update.close),
            bytes_up=nbytes,
            bytes_up_raw=nbytes,
        )

    async def _evaluate(self, region: _Region, task: TaskRecord) -> Outcome:
        """The region's clients evaluate the global model; weighted means over them."""
        task.started_at = self._clock.time()
        weights = await self._download(region, task)
        version = region.versions.base(task.model_version)
        deadline_s, wait_s = regional_budget(
            task.deadline - self._clock.time(), 0.0, self._config.schedule, 1
        )
        settings = self._engine_settings(
            region, version, deadline_s, wait_s, task.config, evaluate=True
        )
        engine = SyncEngine(
            settings, self._regional_parts(region, MemoryRecorder(), version + 1, weights)
        )
        try:
            record = await engine.evaluate_only(version)
        finally:
            region.models.drop(version)
        done = [o for t, o in record.outcomes if t.kind == "evaluate" and o.status == "ok"]
        if not done or record.eval_loss is None:
            reasons = "; ".join(sorted({o.reason or o.status for _, o in record.outcomes}))
            raise RegionalError(f"no local client evaluated: {reasons or 'none selected'}")
        return Outcome(
            "ok",
            num_examples=sum(o.num_examples for o in done),
            loss=record.eval_loss,
            metrics={**record.eval_metrics, "relay_clients": len(done)},
        )

    async def _download(self, region: _Region, task: TaskRecord) -> Weights:
        chain = self._config.compression.down_chain(region.name)
        held = region.held
        size = raw = 0
        if held != task.model_version:
            broadcast = await self._models.broadcast(
                task.model_version, chain, held if held >= 0 else None
            )
            if broadcast is not None:
                size, raw = broadcast.wire_bytes, broadcast.raw_bytes
        await asyncio.sleep(region.uplink.fetch_s(size))
        view = self._models.view(task.model_version, chain)
        if view is None:
            raise RegionalError(f"model version {task.model_version} is not available")
        task.bytes_down, task.bytes_down_raw = size, raw
        region.held = task.model_version
        task.mark_downloaded()
        return {name: np.array(value) for name, value in view.items()}

    def _engine_settings(
        self,
        region: _Region,
        last: int,
        deadline_s: float,
        wait_s: float,
        config: dict[str, Scalar],
        *,
        evaluate: bool = False,
    ) -> EngineSettings:
        return EngineSettings.regional(
            self._config.schedule,
            rounds=last,
            cohort=region.cohort,
            min_clients=min(self._config.simulation.relay.min_clients, region.cohort),
            budget=(deadline_s, wait_s),
            config=regional_round_config(config),
            evaluate=evaluate,
            seed=self._config.run.seed,
        )

    def _regional_parts(
        self,
        region: _Region,
        recorder: MemoryRecorder,
        start_round: int,
        weights: Weights,
        scheduler: Scheduler | None = None,
    ) -> EngineParts:
        """A regional engine's parts: the region's clients, its strategy, the relay's memory."""
        return EngineParts(
            registry=region.registry,
            strategy=region.strategy,
            models=region.models,
            observer=recorder,
            start_round=start_round,
            weights=weights,
            clock=self._clock,
            scheduler=scheduler,
        )


def _difference(new: WeightsView, base: Weights) -> VirtualUpdate:
    """The regional model minus the global one, as a raw upload."""
    tensors = {}
    for name, value in base.items():
        delta = np.subtract(np.asarray(new[name]), value, dtype=value.dtype)
        little = np.ascontiguousarray(delta, dtype=delta.dtype.newbyteorder("<"))
        tensors[name] = UploadedTensor(little.tobytes(), value.dtype.name, tuple(value.shape))
    return VirtualUpdate(tensors)
