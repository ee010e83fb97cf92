"""The work of virtual clients: many client apps multiplexed in one worker.

A :class:`ClientWorker` runs the user's client app for whichever simulated clients it is
given, one job at a time, exactly as a networked client would (:mod:`geofl.client.work`):
the same fit and evaluation calls, the same output checks, the same upload compression
with per-client error feedback. It keeps, per client, the :class:`ClientContext` (whose
``state`` persists across rounds, as in a client process) and the compression state; the
built client objects are kept in a small LRU cache, because ten thousand of them would
not fit in memory.

Workers are transport-free: :mod:`geofl.server.simulation.backends` runs them in this
process, in worker processes or as Ray actors. Nothing here knows about time.
"""

from __future__ import annotations

import os
import time
import traceback
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from geofl.client.app import Client, ClientContext, ClientFactory, load_client_app
from geofl.client.compressor import UploadCompressor
from geofl.client.partial_sync import LocalProgress, fit_in_segments
from geofl.client.streaming import StreamingState, fit_streaming
from geofl.client.work import evaluate_model, fit_update, reported_loss
from geofl.protocols import partial_sync, streaming
from geofl.protocols.codecs import Chain
from geofl.protocols.compression import UploadPlan
from geofl.protocols.tensors import Difference, EncodedTensor
from geofl.protocols.types import Metrics, Scalar, Weights
from geofl.server.scheduling.measurements import trained_samples

__all__ = [
    "ClientIdentity",
    "ClientWorker",
    "Job",
    "JobResult",
    "ModelKey",
    "UploadedTensor",
    "WorkerSetup",
    "superseded",
    "trained_samples",
]

#: A model version as one downlink track sees it: (fleet, version, codec chain). Fleets
#: sharing a backend (the regions behind simulated relays) number versions separately.
ModelKey = tuple[str, int, Chain]
#: Client objects a worker keeps built (each holds its data set and a model).
DEFAULT_CLIENT_CACHE = 64


@dataclass(frozen=True)
class WorkerSetup:
    """What every worker needs to build clients."""

    app: str
    run_config: dict[str, Scalar]
    node_config: dict[str, Scalar]
    num_clients: int
    client_cache: int = DEFAULT_CLIENT_CACHE
    #: torch threads per worker (workers share the cores; 0 leaves torch's default).
    torch_threads: int = 1


@dataclass(frozen=True)
class ClientIdentity:
    """One simulated client: its index (= partition id), database id, name and region."""

    index: int
    node_id: int
    name: str
    region: str | None


@dataclass(frozen=True)
class Job:
    """One task of one client."""

    client: ClientIdentity
    kind: Literal["fit", "evaluate"]
    model: ModelKey
    config: dict[str, Scalar]
    upload: UploadPlan | None
    run_id: int
    round: int
    task_id: int
    #: Seeds the upload's codecs; ``None``: the task id, as a networked client does.
    upload_seed: int | None = None


@dataclass(frozen=True)
class UploadedTensor:
    """One tensor of an upload: raw little-endian bytes, or a codec payload."""

    payload: bytes
    dtype: str
    shape: tuple[int, ...]
    chain: Chain = ()


@dataclass
class JobResult:
    """What the client sent back (or why it could not)."""

    status: Literal["ok", "failed"]
    error: str | None = None
    num_examples: int = 0
    loss: float | None = None
    metrics: Metrics = field(default_factory=dict)
    tensors: dict[str, UploadedTensor] = field(default_factory=dict)
    #: Bytes of the tensors as uploaded (after compression).
    payload_bytes: int = 0
    #: Samples processed, which the compute model turns into simulated seconds.
    samples: int = 0
    #: Real CPU seconds the job took on this machine (for the record, not the clock).
    cpu_s: float = 0.0
    #: Partial sync: (samples trained, bytes sent) per layer group, in sending order;
    #: streaming: the fragment's, then the overlap steps' (which send nothing).
    groups: list[tuple[int, int]] = field(default_factory=list)


class ClientWorker:
    """Runs jobs of many simulated clients against cached model versions."""

    def __init__(self, setup: WorkerSetup) -> None:
        self._setup = setup
        if setup.torch_threads:
            _limit_torch_threads(setup.torch_threads)
        self._factory: ClientFactory = load_client_app(setup.app)
        self._contexts: dict[int, ClientContext] = {}
        self._clients: OrderedDict[int, Client] = OrderedDict()
        self._compressors: dict[int, UploadCompressor] = {}
        self._progress: dict[int, LocalProgress] = {}
        self._streaming: dict[int, StreamingState] = {}
        self._models: dict[ModelKey, Weights] = {}

    # ------------------------------------------------------------ models

    def has_model(self, key: ModelKey) -> bool:
        """Whether ``key`` is cached here (else :meth:`add_model` it first)."""
        return key in self._models

    def add_model(self, key: ModelKey, weights: Weights) -> None:
        """Cache a model version; its fleet's versions two behind the newest are dropped."""
        self._models[key] = weights
        for old in superseded(self._models, key):
            del self._models[old]

    # ------------------------------------------------------------ jobs

    def run(self, job: Job) -> JobResult:
        """Run one job; a failure of the user's code is a ``failed`` result, not a raise."""
        started = time.process_time()
        try:
            client = self._client(job.client)
            weights = self._models[job.model]
            if job.kind == "fit":
                result = self._fit(client, weights, job)
            else:
                result = self._evaluate(client, weights, job)
        except Exception as exc:  # the user's code failed: report it, like a client would
            detail = traceback.format_exc(limit=5)
            result = JobResult("failed", f"{type(exc).__name__}: {exc}\n{detail}"[:2000])
        result.cpu_s = time.process_time() - started
        return result

    def _fit(self, client: Client, weights: Weights, job: Job) -> JobResult:
        if partial_sync.CONFIG_KEY in job.config or streaming.is_streaming(job.config):
            return self._fit_in_segments(client, weights, job)
        update = fit_update(client, weights, job.config)
        tensors, payload_bytes = self._encode(job, update.delta)
        return JobResult(
            "ok",
            num_examples=update.num_examples,
            loss=reported_loss(update.metrics),
            metrics=update.metrics,
            tensors=tensors,
            payload_bytes=payload_bytes,
            samples=trained_samples(update.num_examples, update.metrics, job.config),
        )

    def _fit_in_segments(self, client: Client, weights: Weights, job: Job) -> JobResult:
        """A partial-sync or streaming fit: what is sent early is encoded as the sender
        would, and each part's training and bytes are reported for the clock."""
        tensors: dict[str, UploadedTensor] = {}
        sent: list[int] = []

        def send(index: int, update: dict[str, npt.NDArray[np.generic]]) -> None:
            encoded, payload_bytes = self._encode(job, update)
            tensors.update(encoded)
            sent.append(payload_bytes)

        if streaming.is_streaming(job.config):
            state = self._streaming.setdefault(job.client.index, StreamingState())
            fit = fit_streaming(
                client, weights, job.config, send, state, run_id=job.run_id, server_round=job.round
            )
        else:
            keep = partial_sync.keeps_local(job.config)
            progress = self._progress.setdefault(job.client.index, LocalProgress())
            fit = fit_in_segments(
                client, weights, job.config, send, progress.for_run(job.run_id) if keep else None
            )
        samples = [trained_samples(n, metrics, config) for n, metrics, config in fit.segments]
        sent += [0] * (len(samples) - len(sent))  # streaming: the overlap steps send nothing
        return JobResult(
            "ok",
            num_examples=fit.num_examples,
            loss=reported_loss(fit.metrics),
            metrics=fit.metrics,
            tensors=tensors,
            payload_bytes=sum(sent),
            samples=sum(samples),
            groups=list(zip(samples, sent, strict=True)),
        )

    def _encode(
        self, job: Job, delta: Mapping[str, Difference | npt.NDArray[np.generic]]
    ) -> tuple[dict[str, UploadedTensor], int]:
        """The update as uploaded: under the job's codec plan (with error feedback) or raw."""
        if job.upload is not None and job.upload.chain:
            compressor = self._compressors.setdefault(job.client.index, UploadCompressor())
            encoded, payload_bytes = compressor.encode(
                delta,
                job.upload,
                run_id=job.run_id,
                round_number=job.round,
                seed=job.task_id if job.upload_seed is None else job.upload_seed,
            )
            return {name: _uploaded(item) for name, item in encoded.items()}, payload_bytes
        tensors = {name: _uploaded(item) for name, item in delta.items()}
        return tensors, sum(len(t.payload) for t in tensors.values())

    def _evaluate(self, client: Client, weights: Weights, job: Job) -> JobResult:
        evaluation = evaluate_model(client, weights, job.config)
        return JobResult(
            "ok",
            num_examples=evaluation.num_examples,
            loss=evaluation.loss,
            metrics=evaluation.metrics,
            samples=evaluation.num_examples,
        )

    def _client(self, who: ClientIdentity) -> Client:
        client = self._clients.get(who.index)
        if client is not None:
            self._clients.move_to_end(who.index)
            return client
        client = self._factory(self._context(who))
        self._clients[who.index] = client
        while len(self._clients) > max(1, self._setup.client_cache):
            self._clients.popitem(last=False)
        return client

    def _context(self, who: ClientIdentity) -> ClientContext:
        context = self._contexts.get(who.index)
        if context is None:
            node_config = {
                **self._setup.node_config,
                "partition-id": who.index,
                "num-partitions": self._setup.num_clients,
            }
            context = ClientContext(
                node_id=who.node_id,
                node_name=who.name,
                region=who.region,
                node_config=node_config,
                run_config=dict(self._setup.run_config),
            )
            self._contexts[who.index] = context
        return context


def superseded(keys: Iterable[ModelKey], added: ModelKey) -> list[ModelKey]:
    """Cached versions to forget once ``added`` is cached: its fleet's, two behind the newest.

    Training jobs only ever need the newest version of a fleet or the one before it (a
    task handed out just before the new version was published).
    """
    fleet = added[0]
    same = [key for key in keys if key[0] == fleet]
    newest = max([added[1], *(key[1] for key in same)])
    return [key for key in same if key[1] < newest - 1]


def _raw(array: npt.NDArray[np.generic]) -> UploadedTensor:
    little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return UploadedTensor(little.tobytes(), array.dtype.name, tuple(array.shape))


def _uploaded(item: object) -> UploadedTensor:
    if isinstance(item, EncodedTensor):
        return UploadedTensor(item.payload, item.dtype, item.shape, item.chain)
    if hasattr(item, "materialize"):
        return _raw(item.materialize())
    return _raw(np.asarray(item))


def _limit_torch_threads(threads: int) -> None:
    """Cap torch's threads if torch is installed (workers share the cores)."""
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    try:
        import torch
    except ImportError:  # a numpy-only client app
        return
    torch.set_num_threads(threads)
