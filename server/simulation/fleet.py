"""Virtual clients: simulated nodes that take tasks from the real registry.

Each simulated client is a registry session like a networked node's, so the real round
engine selects it, hands it tasks with deadlines and settles them. A task is served by a
coroutine that lives on the simulated clock:

1. download: the model version (compressed as the client's downlink says) takes
   ``rtt + rtt/2 + jitter + 8 bytes / down rate`` simulated seconds (the task's notice and
   the client's request, then the model's trip; ``rtt/2`` when the client holds it);
2. compute: the job (the user's client app, in a backend worker) runs for real, and the
   clock charges ``samples / samples_per_s`` for it;
3. upload: the update, encoded under the server's upload plan, takes
   ``rtt/2 + jitter + 8 bytes / up rate``; it is then checked by the rules the gRPC
   servicer applies (:mod:`geofl.server.nodes.updates`) and its compressed tensors are
   decoded, so an update that does not decode is refused on arrival. In a partially synchronized
   round the layer groups are sent as their segments of training end, overlapping the
   rest of the training, and a Streaming DiLoCo round's fragment is sent ``tau`` steps
   before its training ends (:func:`upload_timeline`; the fleet's stats count how much
   of the sending was hidden behind training).

A client whose availability window closes mid-task is dropped at that moment; a result
that arrives after the deadline is late. Training starts in a worker as soon as the task
is handed out (in order of when its result will be needed), so the workers are busy while
the clock advances; a client that could not even finish its download before the deadline
is not trained at all (its result could only be discarded).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from geofl.protocols import streaming
from geofl.protocols.codecs import Chain, CodecError, decode_tensor
from geofl.protocols.compression import UploadPlan
from geofl.protocols.errors import GeoflError, WireError
from geofl.protocols.tensors import ModelSpec
from geofl.protocols.types import Scalar
from geofl.server.config.compression import CompressionConfig
from geofl.server.models.store import ModelStore
from geofl.server.nodes.clock import Clock
from geofl.server.nodes.fragments import pad_to_model
from geofl.server.nodes.outcomes import DeltaUpdate, MaskedVector, Outcome
from geofl.server.nodes.registry import NodeSession, Registry, TaskRecord
from geofl.server.nodes.updates import check_fit
from geofl.server.simulation.backends import Backend
from geofl.server.simulation.links import ClientLink
from geofl.server.simulation.secure_clients import SECURE_STAGES, VirtualSecureClients
from geofl.server.simulation.traces import ClientTrace
from geofl.server.simulation.virtual_loop import real_work
from geofl.server.simulation.workers import ClientIdentity, Job, JobResult, UploadedTensor

__all__ = [
    "FleetStats",
    "InFlight",
    "VirtualFleet",
    "VirtualUpdate",
    "plain_link",
    "upload_seed",
]

log = logging.getLogger(__name__)

#: Evaluation charges a forward pass per sample, about a third of a training step.
EVALUATE_COST = 1 / 3


def plain_link(client: int, samples_per_s: float) -> ClientLink:
    """A client with no WAN model: instant transfers, ``samples_per_s`` compute."""
    return ClientLink(client, "default", 0.0, math.inf, math.inf, 0.0, 0.0, samples_per_s)


@dataclass
class FleetStats:
    """What the fleet did, for the end-of-run summary."""

    bytes_up: dict[str, int]
    bytes_down: dict[str, int]
    jobs: int = 0
    skipped: int = 0
    cpu_s: float = 0.0
    #: Overlapped fits (partial sync, streaming): simulated seconds of training, of the
    #: uplink busy, and of the uplink busy while training went on (hidden).
    overlapped_compute_s: float = 0.0
    overlapped_sending_s: float = 0.0
    hidden_sending_s: float = 0.0

    def add(self, region: str, up: int, down: int) -> None:
        self.bytes_up[region] = self.bytes_up.get(region, 0) + up
        self.bytes_down[region] = self.bytes_down.get(region, 0) + down

    def overlap(self, timeline: UploadTimeline) -> None:
        """Count one overlapped fit's training and sending intervals."""
        self.overlapped_compute_s += timeline.compute_s
        self.overlapped_sending_s += timeline.sending_s
        self.hidden_sending_s += timeline.hidden_s


class VirtualUpdate(Mapping[str, npt.NDArray[np.generic]]):
    """A received update, decoded lazily like :class:`geofl.server.models.spool.SpooledUpdate`."""

    def __init__(self, tensors: Mapping[str, UploadedTensor]) -> None:
        self._tensors = dict(tensors)
        self._decoded: dict[str, npt.NDArray[np.generic]] = {}

    def __getitem__(self, name: str) -> npt.NDArray[np.generic]:
        if name not in self._decoded:
            item = self._tensors[name]
            if item.chain:
                self._decoded[name] = decode_tensor(
                    item.payload, item.chain, item.dtype, item.shape
                )
            else:
                dtype = np.dtype(item.dtype).newbyteorder("<")
                self._decoded[name] = np.frombuffer(item.payload, dtype=dtype).reshape(item.shape)
        return self._decoded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def close(self) -> None:
        self._tensors.clear()
        self._decoded.clear()

    def decode_compressed(self) -> None:
        """Decode every compressed tensor now (raw ones are views, read when folded).

        Raises
        ------
        CodecError
            Naming the first tensor whose payload does not decode.
        """
        for name, item in self._tensors.items():
            if not item.chain:
                continue
            try:
                self[name]
            except CodecError as exc:
                raise CodecError(f"tensor {name!r} does not decode: {exc}") from exc


class InFlight:
    """The coroutines serving tasks right now, so a finished run can cancel them."""

    def __init__(self) -> None:
        self._running: set[asyncio.Task[None]] = set()

    def start(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background until it ends or :meth:`cancel` is called."""
        task = asyncio.ensure_future(work)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def cancel(self) -> None:
        """Cancel everything still running and wait for it to unwind."""
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)


class VirtualFleet:
    """Simulated clients joined to ``registry``; serve tasks until the run ends."""

    def __init__(
        self,
        *,
        registry: Registry,
        models: ModelStore,
        backend: Backend,
        clock: Clock,
        links: Sequence[ClientLink],
        traces: Sequence[ClientTrace] | None,
        compression: CompressionConfig,
        spec: ModelSpec,
        run_id: int,
        seed: int,
        name: str = "",
    ) -> None:
        self._name = name  # keeps this fleet's model versions apart in a shared backend
        self._registry = registry
        self._models = models
        self._backend = backend
        self._clock = clock
        self._links = links
        self._traces = traces
        self._compression = compression
        self._spec = spec
        self._run_id = run_id
        self._rng = np.random.default_rng([seed, 0x5EED])
        self._seed = seed
        self._jobs_of: dict[int, int] = {}  # jobs handed to each client so far
        self._start = clock.monotonic()
        self._identities: dict[int, ClientIdentity] = {}
        # Clients are named by their index in the whole simulation (their partition);
        # a fleet may hold any subset of them (a relay's region).
        self._position = {link.client: position for position, link in enumerate(links)}
        self._held = np.full(len(links), -1, dtype=np.int64)
        self._in_flight = InFlight()
        self._secure = VirtualSecureClients(run_id, spec)
        regions = dict.fromkeys(link.region for link in links)
        self.stats = FleetStats(dict.fromkeys(regions, 0), dict.fromkeys(regions, 0))

    # ------------------------------------------------------------ joining

    def join(self, join_nodes: Callable[[Sequence[tuple[str, str | None]]], list[int]]) -> None:
        """Register every client (database rows via ``join_nodes``, then sessions)."""
        names = [(f"sim-{link.client}", self._region(link)) for link in self._links]
        node_ids = join_nodes(names)
        for link, (name, region), node_id in zip(self._links, names, node_ids, strict=True):
            self._registry.add(node_id, name, region, {"partition-id": link.client})
            self._identities[node_id] = ClientIdentity(link.client, node_id, name, region)
        self._registry.attach(self)

    def _region(self, link: ClientLink) -> str | None:
        return None if link.region == "default" else link.region

    def now(self) -> float:
        """Simulated seconds since the fleet joined (availability traces' time base)."""
        return self._clock.monotonic() - self._start

    def is_present(self, session: NodeSession) -> bool:
        """Whether the client is online now (its availability trace; always without one)."""
        if self._traces is None:
            return True
        index = self._position[self._identities[session.node_id].index]
        return self._traces[index].available_at(self.now())

    def _online_until(self, index: int) -> float:
        """Simulated time (our base) when client ``index`` goes offline; inf if never."""
        if self._traces is None:
            return math.inf
        availability = self._traces[self._position[index]].availability
        return math.inf if availability is None else availability.available_until(self.now())

    # ------------------------------------------------------------ tasks

    def deliver(self, session: NodeSession, task: TaskRecord) -> None:
        """Serve ``task`` on the simulated clock (fit, evaluate and the SecAgg+ stages;
        other kinds fail)."""
        who = self._identities[session.node_id]
        if task.kind in SECURE_STAGES:
            self._in_flight.start(self._serve_stage(who, task))
            return
        if task.kind not in ("fit", "evaluate"):
            task.settle(Outcome("failed", f"virtual clients cannot run {task.kind} tasks"))
            return
        self._in_flight.start(self._serve(who, task))

    async def _serve_stage(self, who: ClientIdentity, task: TaskRecord) -> None:
        """A key-exchange or unmasking task: one round trip carrying the stage's messages."""
        link = self._links[self._position[who.index]]
        task.started_at = self._clock.time()
        outcome = self._secure.answer(who.node_id, task)
        down = task.secagg.ByteSize() if task.secagg is not None else 0
        trip = link.download_s(down, link.sample_jitter_s(self._rng)) + link.upload_s(
            outcome.bytes_up, link.sample_jitter_s(self._rng)
        )
        late = await self._until(self._online_until(who.index), self.now() + trip, _offline(who))
        if late is None and self._clock.time() > task.deadline:
            late = Outcome("late", "result arrived after the stage deadline")
        task.settle(late or outcome)

    async def close(self) -> None:
        """Cancel tasks still in flight (the run is over)."""
        await self._in_flight.cancel()

    async def _serve(self, who: ClientIdentity, task: TaskRecord) -> None:
        try:
            outcome = await self._attempt(who, task)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must not hang the round: record it
            log.exception("virtual client %s failed", who.name)
            outcome = Outcome("failed", f"simulator error: {exc}")
        if outcome is not None:
            task.settle(outcome)

    async def _attempt(self, who: ClientIdentity, task: TaskRecord) -> Outcome | None:
        position = self._position[who.index]
        link = self._links[position]
        offline_at = self._online_until(who.index)
        task.started_at = self._clock.time()
        chain = self._compression.down_chain(who.region)
        held = int(self._held[position])
        down_bytes, raw_down = await self._download_size(task.model_version, chain, held)
        download_s = link.fetch_s(down_bytes, link.sample_jitter_s(self._rng))
        if self._clock.time() + download_s > task.deadline:
            self.stats.skipped += 1
            return await self._until(offline_at, task.deadline, None)  # late: engine settles
        weights = self._models.view(task.model_version, chain)
        if weights is None:
            return Outcome("failed", f"model version {task.model_version} is not available")
        job = self._job(who, task, chain)
        result_future = self._backend.submit(job, dict(weights), self.now() + download_s)
        try:
            dropped = await self._until(offline_at, self.now() + download_s, _offline(who))
            if dropped is not None:
                return dropped
            task.bytes_down, task.bytes_down_raw = down_bytes, raw_down
            self._held[self._position[who.index]] = task.model_version
            task.mark_downloaded()
            result = await real_work(result_future)
        finally:
            result_future.cancel()
        self.stats.jobs += 1
        self.stats.cpu_s += result.cpu_s
        return await self._finish(who, link, task, result, offline_at)

    async def _finish(
        self,
        who: ClientIdentity,
        link: ClientLink,
        task: TaskRecord,
        result: JobResult,
        offline_at: float,
    ) -> Outcome | None:
        cost = EVALUATE_COST if task.kind == "evaluate" else 1.0
        jitter_s = link.sample_jitter_s(self._rng)
        if result.groups:
            timeline = upload_timeline(link, result.groups, jitter_s)
            compute_s, upload_s = timeline.compute_s, timeline.exposed_upload_s
            self.stats.overlap(timeline)
        else:
            compute_s = link.compute_s(result.samples) * cost
            upload_s = link.upload_s(result.payload_bytes, jitter_s)
        arrival = self.now() + compute_s + upload_s
        dropped = await self._until(offline_at, arrival, _offline(who))
        region = link.region
        self.stats.add(region, result.payload_bytes, task.bytes_down)
        if dropped is not None:
            return dropped
        if self._clock.time() > task.deadline:
            return Outcome("late", "result arrived after the round deadline")
        return self._outcome(task, result, compute_s)

    async def _until(
        self, offline_at: float, when: float, dropped: Outcome | None
    ) -> Outcome | None:
        """Sleep until ``when`` (our time base); ``dropped`` if offline before that."""
        if offline_at < when:
            await asyncio.sleep(max(0.0, offline_at - self.now()))
            return dropped
        await asyncio.sleep(max(0.0, when - self.now()))
        return None

    async def _download_size(self, version: int, chain: Chain, held: int) -> tuple[int, int]:
        if held == version:
            return 0, 0
        broadcast = await self._models.broadcast(version, chain, held if held >= 0 else None)
        if broadcast is None:
            return 0, 0
        return broadcast.wire_bytes, broadcast.raw_bytes

    def _job(self, who: ClientIdentity, task: TaskRecord, chain: Chain) -> Job:
        plan: UploadPlan | None = task.upload if task.kind == "fit" else None
        config: dict[str, Scalar] = dict(task.config)
        ordinal = self._jobs_of[who.index] = self._jobs_of.get(who.index, 0) + 1
        return Job(
            who,
            "fit" if task.kind == "fit" else "evaluate",
            (self._name, task.model_version, chain),
            config,
            plan,
            self._run_id,
            task.round,
            task.task_id,
            upload_seed=upload_seed(self._seed, who.index, ordinal),
        )

    def _upload_order(self, task: TaskRecord) -> ModelSpec:
        """The tensors the client sends, in order (layer groups in turn, a fragment)."""
        return streaming.expected_upload(self._spec, task.config)

    def _masked_outcome(
        self, task: TaskRecord, update: VirtualUpdate, result: JobResult, compute_s: float
    ) -> Outcome:
        """Mask the update as the client would before sending it (SecAgg+, maybe with
        distributed DP's noise)."""
        try:
            delta = {t.name: update[t.name] for t in self._spec}
            masked = self._secure.mask(task.node_id, task, delta, result.num_examples)
        except GeoflError as exc:
            return Outcome("failed", f"secure aggregation: {exc}")
        finally:
            update.close()
        return _masked_outcome_of(masked, result, compute_s)

    def _outcome(self, task: TaskRecord, result: JobResult, compute_s: float) -> Outcome:
        if result.status != "ok":
            return Outcome("failed", result.error or "client error", metrics=result.metrics)
        if task.kind == "evaluate":
            return Outcome(
                "ok",
                num_examples=result.num_examples,
                loss=result.loss,
                metrics=result.metrics,
                compute_s=compute_s,
            )
        update = VirtualUpdate(result.tensors)
        order = self._upload_order(task)
        try:
            check_fit(result.num_examples, result.payload_bytes, result.tensors, order)
            update.decode_compressed()
        except WireError as exc:  # what the servicer would refuse, for the same reason
            update.close()
            return Outcome("rejected", str(exc))
        if task.secagg is not None:
            return self._masked_outcome(task, update, result, compute_s)
        raw = sum(t.nbytes for t in order)
        return Outcome(
            "ok",
            num_examples=result.num_examples,
            loss=result.loss,
            metrics=result.metrics,
            payload=DeltaUpdate(pad_to_model(update, self._spec), update.close),
            compute_s=compute_s,
            bytes_up=result.payload_bytes,
            bytes_up_raw=raw,
        )


def _masked_outcome_of(masked: MaskedVector, result: JobResult, compute_s: float) -> Outcome:
    """A secure fit's outcome: the masked vector is what travels."""
    size = int(masked.vector.nbytes)
    return Outcome(
        "ok",
        num_examples=result.num_examples,
        loss=result.loss,
        metrics=result.metrics,
        payload=masked,
        compute_s=compute_s,
        bytes_up=size,
        bytes_up_raw=size,
    )


@dataclass(frozen=True)
class UploadTimeline:
    """One overlapped fit on the clock, in seconds from the start of its training.

    The training runs over ``(0, compute_s)``; ``sending`` are the intervals the uplink
    is busy with each group (its serialization and expected loss stalls), and the last
    byte arrives at ``arrival_s``.
    """

    compute_s: float
    sending: tuple[tuple[float, float], ...]
    arrival_s: float

    @property
    def exposed_upload_s(self) -> float:
        """Seconds from the end of training to the last byte's arrival."""
        return self.arrival_s - self.compute_s

    @property
    def hidden_s(self) -> float:
        """Seconds the uplink was busy while training went on (communication hidden)."""
        return sum(max(0.0, min(end, self.compute_s) - start) for start, end in self.sending)

    @property
    def sending_s(self) -> float:
        """Seconds the uplink was busy in all."""
        return sum(end - start for start, end in self.sending)


def upload_timeline(
    link: ClientLink, groups: Sequence[tuple[int, int]], jitter_s: float = 0.0
) -> UploadTimeline:
    """When an overlapped fit trains and sends (partial sync's groups, a streaming fragment).

    Group ``k`` (``(samples, bytes)``) is ready when the samples of groups ``0..k`` are
    trained; one sender puts the groups on the uplink in order, each occupying it for its
    serialization (and expected loss stalls); the last byte arrives ``rtt/2 + jitter``
    after it was sent. With one group this is compute plus :meth:`ClientLink.upload_s`.
    """
    trained = 0.0
    propagation = link.rtt_s / 2
    sender_free = 0.0
    sending: list[tuple[float, float]] = []
    for samples, nbytes in groups:
        trained += link.compute_s(samples)
        start = max(sender_free, trained)
        sender_free = start + link.upload_s(nbytes) - propagation
        sending.append((start, sender_free))
    return UploadTimeline(trained, tuple(sending), sender_free + max(0.0, propagation + jitter_s))


def overlapped_upload(
    link: ClientLink, groups: Sequence[tuple[int, int]], jitter_s: float = 0.0
) -> tuple[float, float]:
    """Compute seconds, and seconds from its end to the last group's arrival
    (:func:`upload_timeline`)."""
    timeline = upload_timeline(link, groups, jitter_s)
    return timeline.compute_s, timeline.exposed_upload_s


def upload_seed(run_seed: int, client: int, ordinal: int) -> int:
    """The seed of a virtual client's upload codecs (stochastic rounding, random-k): from
    the run's seed, the client and which of its jobs this is, so that a simulation is
    reproducible. (A networked client seeds with the task id, which is made from the
    coordinator's wall clock so that ids stay unique across restarts.)"""
    state = np.random.SeedSequence([run_seed, client, ordinal, 0xC0DEC]).generate_state(2)
    return int(state[0]) << 32 | int(state[1])


def _offline(who: ClientIdentity) -> Outcome:
    return Outcome("dropped", f"{who.name} went offline (availability trace)")


def links_for(
    links: Sequence[ClientLink] | None, num_clients: int, samples_per_s: float
) -> list[ClientLink]:
    """The WAN model's links, or instant links at ``samples_per_s`` when there is none."""
    if links is not None:
        return list(links)
    return [plain_link(i, samples_per_s) for i in range(num_clients)]


__all__ += ["UploadTimeline", "links_for", "overlapped_upload", "upload_timeline"]
