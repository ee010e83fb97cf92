"""The client runtime: join, heartbeat, pull tasks, train, upload, reconnect.

Connections are always opened by the client.  When the server goes away (a
restart, a network cut) the runtime retries with jittered exponential backoff
and joins again; a server that restarted from its database gives the node its
old id back, so the run carries on.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from geofl.client.app import Client, ClientContext
from geofl.client.background_upload import BackgroundUpload
from geofl.client.compressor import UploadCompressor
from geofl.client.connection import (
    Connection,
    CredentialsError,
    ServerUnavailableError,
    Session,
    default_node_name,
)
from geofl.client.partial_sync import GroupUpdate, LocalProgress, fit_in_segments
from geofl.client.secure_rounds import SecureRounds
from geofl.client.streaming import StreamingState, fit_streaming
from geofl.client.work import evaluate_model, fit_update, reported_loss
from geofl.protocols import partial_sync, streaming
from geofl.protocols.errors import GeoflError, SessionError, WireError
from geofl.protocols.serde import (
    DEFAULT_CHUNK_BYTES,
    fill_scalar_map,
    plan_from_proto,
    scalar_map,
)
from geofl.protocols.tensor_checks import payload_limit
from geofl.protocols.tensors import (
    MASKED_TENSOR,
    Difference,
    Tensorish,
    model_bytes,
    spec_of,
)
from geofl.protocols.tuning import tune_allocator
from geofl.protocols.types import Scalar, Weights
from geofl.protocols.v1 import geofl_pb2 as pb

log = logging.getLogger(__name__)

#: Tasks that produce a result (the rest are WAIT and SHUTDOWN).
_WORK = frozenset(
    {
        pb.TASK_KIND_FIT,
        pb.TASK_KIND_EVALUATE,
        pb.TASK_KIND_SECAGG_ADVERTISE,
        pb.TASK_KIND_SECAGG_SHARE,
        pb.TASK_KIND_SECAGG_UNMASK,
        pb.TASK_KIND_MESSAGE,
    }
)
_SECURE_STAGES = frozenset(
    {pb.TASK_KIND_SECAGG_ADVERTISE, pb.TASK_KIND_SECAGG_SHARE, pb.TASK_KIND_SECAGG_UNMASK}
)


@dataclass
class ClientOptions:
    """How to reach the server and behave while connected."""

    server: str
    node_name: str = field(default_factory=default_node_name)
    region: str | None = None
    node_config: dict[str, Scalar] = field(default_factory=dict)
    root_certificates: Path | None = None
    #: Mutual TLS: this node's certificate chain and its key (PEM).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: Ed25519 key that proves the node's identity (``geofl keys new``).
    node_key: Path | None = None
    #: How long one long poll for work waits; idle nodes send one RPC per poll.
    poll_timeout_s: float = 30.0
    #: Give up when the server has been unreachable for this long.
    reconnect_for_s: float = 300.0
    backoff_base_s: float = 0.25
    backoff_max_s: float = 5.0
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    #: Where compression state (error-feedback residuals) survives restarts; None = memory.
    state_dir: Path | None = None
    #: Held while the client app computes (fit, evaluate, a Flower message). Simulated
    #: clients that share a process share one (a lock), so they take turns at the CPU
    #: instead of contending for it; their network work still overlaps. None = no turns.
    compute_slot: AbstractContextManager[object] | None = None


class GaveUpError(GeoflError):
    """The server stayed unreachable for longer than ``reconnect_for_s``."""


class Backoff:
    """Full-jitter exponential backoff with a time budget."""

    def __init__(self, base: float, cap: float, budget: float, rng: random.Random) -> None:
        self._base, self._cap, self._budget, self._rng = base, cap, budget, rng
        self.reset()

    def reset(self) -> None:
        self._attempt = 0
        self._since: float | None = None

    def wait(self, reason: str) -> None:
        """Sleep before the next attempt, or raise :class:`GaveUpError`."""
        now = time.monotonic()
        self._since = self._since or now
        if now - self._since > self._budget:
            raise GaveUpError(f"server unreachable for {now - self._since:.0f} s: {reason}")
        delay = self._rng.uniform(0, min(self._cap, self._base * 2**self._attempt))
        self._attempt += 1
        time.sleep(delay)


class ClientRuntime:
    """Drives one client app against one server until the run is over."""

    def __init__(self, options: ClientOptions, factory: Callable[[ClientContext], Client]) -> None:
        self._opt = options
        self._factory = factory
        self._client: Client | None = None
        self._context: ClientContext | None = None
        self._cache: tuple[int, Weights] | None = None
        certificate = None
        if options.tls_cert is not None or options.tls_key is not None:
            if options.tls_cert is None or options.tls_key is None:
                raise CredentialsError("mutual TLS needs both a client certificate and its key")
            certificate = (options.tls_cert, options.tls_key)
        self._conn = Connection(
            options.server,
            options.root_certificates,
            client_certificate=certificate,
            node_key=options.node_key,
        )
        state_file = None
        if options.state_dir is not None:
            state_name = options.node_name or "node"
            state_file = options.state_dir / f"{state_name}.compression.safetensors"
        self._compressor = UploadCompressor(state_file)
        self._progress = LocalProgress()
        self._streaming = StreamingState()
        self._secure = SecureRounds()
        self._stop = threading.Event()
        self._rejoin = threading.Event()
        self._joining = threading.Lock()  # the heartbeat thread joins again, too
        #: Set while a long poll is open: the server counts it as a heartbeat.
        self._polling = threading.Event()
        self._slot: AbstractContextManager[object] = (
            options.compute_slot if options.compute_slot is not None else contextlib.nullcontext()
        )
        self.session: Session | None = None
        self.tasks_done = 0

    def run(self) -> None:
        """Serve tasks until SHUTDOWN; raise :class:`GaveUpError` if the server never comes back.

        Only an unreachable server and an expired session are retried: a refused identity
        (:class:`~geofl.protocols.errors.IdentityRefusedError`), a failed certificate
        verification (:class:`~geofl.client.connection.TlsVerificationError`) and a protocol
        mismatch end the run at once, since retrying cannot change them.
        """
        backoff = Backoff(
            self._opt.backoff_base_s,
            self._opt.backoff_max_s,
            self._opt.reconnect_for_s,
            random.Random(),
        )
        tune_allocator()
        beat = threading.Thread(target=self._heartbeats, daemon=True, name="geofl-heartbeat")
        beat.start()
        try:
            while True:
                try:
                    self._join()
                    backoff.reset()
                    if self._serve():
                        return
                except ServerUnavailableError as exc:
                    log.info("server unavailable (%s); retrying", exc)
                    backoff.wait(str(exc))
                except SessionError:
                    log.info("session expired; joining again")
        finally:
            self._stop.set()
            beat.join(timeout=10.0)  # never leave a thread inside a gRPC call at exit
            self._conn.close()

    def _join(self) -> None:
        with self._joining:
            self.session = self._conn.join(
                self._opt.node_name, self._opt.region, self._opt.node_config, timeout=10.0
            )
        self._rejoin.clear()
        log.info("joined run %s as node %d", self.session.run_name, self.session.node_id)
        if self._context is None:
            self._context = ClientContext(
                node_id=self.session.node_id,
                node_name=self.session.node_name or self._opt.node_name,
                region=self._opt.region,
                node_config=dict(self._opt.node_config),
                run_config=dict(self.session.run_config),
                state={},
            )
        self._context.node_id = self.session.node_id
        if self._client is None:
            with self._slot:  # building it loads data: CPU work too
                self._client = self._factory(self._context)

    def _serve(self) -> bool:
        """Handle tasks; True when the run is over."""
        while not self._rejoin.is_set():
            held = self._cache[0] if self._cache is not None else None
            self._polling.set()
            try:
                task = self._conn.get_task(self._opt.poll_timeout_s, held)
            finally:
                self._polling.clear()
            if task.kind == pb.TASK_KIND_SHUTDOWN:
                log.info("run over: %s", task.reason or "shutdown")
                return True
            if task.kind in _WORK:
                try:
                    if task.kind == pb.TASK_KIND_MESSAGE:
                        self._handle_message(task)
                    else:
                        self._handle(task)
                except SessionError:
                    raise
                except WireError as exc:  # refused result: recorded server-side; go on
                    log.warning("task %d not accepted: %s", task.task_id, exc)
        return False

    def _heartbeats(self) -> None:
        """Tell the server we are here while no long poll says so (fit, upload, ...)."""
        while not self._stop.wait(self.session.heartbeat_interval_s if self.session else 0.1):
            if self.session is None or self._polling.is_set():
                continue
            try:
                self._conn.heartbeat(timeout=5.0)
            except SessionError:
                self._join_again()
            except (ServerUnavailableError, WireError):
                pass

    def _join_again(self) -> None:
        """The server no longer knows our session (it restarted): join again from here.

        The main thread may be busy with a task for many seconds yet; a restarted server
        counts and tells only the nodes it knows (a run it ends meanwhile tells the joined
        ones, then exits), so this node joins now. The task in hand was given by the old
        session; the server settles its upload as it would any late one. Any failure is
        left to the main thread, which joins again on its next call.
        """
        try:
            with self._joining:
                self.session = self._conn.join(
                    self._opt.node_name, self._opt.region, self._opt.node_config, timeout=10.0
                )
        except GeoflError:
            self._rejoin.set()
            return
        if self._context is not None:
            self._context.node_id = self.session.node_id
        log.info("the server had lost our session; joined again as node %d", self.session.node_id)

    # ----------------------------------------------------------- tasks

    def _model(self, task: pb.Task) -> Weights:
        if self._cache is not None and self._cache[0] == task.model_version:
            return self._cache[1]
        weights, _ = self._conn.download(task, timeout=self._remaining(task), base=self._cache)
        self._cache = (task.model_version, weights)
        return weights

    def _remaining(self, task: pb.Task) -> float | None:
        if not task.deadline_unix_s:
            return None
        return max(1.0, task.deadline_unix_s - time.time() + 5.0)

    def _handle(self, task: pb.Task) -> None:
        overlapped = partial_sync.CONFIG_KEY in task.config or streaming.FRAGMENT_KEY in task.config
        if task.kind == pb.TASK_KIND_FIT and overlapped:
            self._handle_overlapped(task)
            return
        header = pb.UploadHeader(task_id=task.task_id, round=task.round, attempt=1)
        tensors: Mapping[str, Tensorish] | None = None
        started = time.perf_counter()
        try:
            if task.kind in _SECURE_STAGES:
                header.update_kind = pb.UPDATE_KIND_NONE
                header.secagg.CopyFrom(self._secure_stage(task))
            elif task.kind == pb.TASK_KIND_FIT:
                global_weights = self._model(task)
                delta = self._fit(global_weights, scalar_map(task.config), header)
                tensors = self._upload(task, delta, header)
            else:
                self._evaluate(self._model(task), scalar_map(task.config), header)
            header.status = pb.RESULT_STATUS_OK
        except Exception as exc:  # the user's code failed: report it, keep serving
            log.error("client app failed on task %d:\n%s", task.task_id, traceback.format_exc())
            header.status = pb.RESULT_STATUS_CLIENT_ERROR
            header.update_kind = pb.UPDATE_KIND_NONE
            header.error = f"{type(exc).__name__}: {exc}"[:2000]
            tensors = None
        header.compute_s = time.perf_counter() - started
        self._conn.submit(header, tensors, self._opt.chunk_bytes, self._remaining(task))
        self.tasks_done += 1

    def _handle_overlapped(self, task: pb.Task) -> None:
        """A partial-sync or streaming fit: what is final is uploaded while training goes on
        (a partial-sync round's layer groups, a streaming round's fragment)."""
        started = time.perf_counter()
        try:
            global_weights = self._model(task)
        except Exception as exc:  # as in _handle: report the failure, keep serving
            log.error("model download failed for task %d: %s", task.task_id, exc)
            self._report_failure(task, exc, time.perf_counter() - started)
            return
        timeout = self._remaining(task)
        header = pb.UploadHeader(
            task_id=task.task_id,
            round=task.round,
            attempt=1,
            update_kind=pb.UPDATE_KIND_DELTA,
            payload_bytes=_announced_bytes(task, global_weights),
        )
        upload = BackgroundUpload(
            lambda messages: self._conn.submit_messages(messages, timeout),
            header,
            self._opt.chunk_bytes,
        )
        trailer = pb.UploadHeader(task_id=task.task_id, round=task.round, attempt=1)
        try:
            self._fit_in_segments(task, global_weights, upload, trailer)
            trailer.status = pb.RESULT_STATUS_OK
        except Exception as exc:  # the user's code failed: the trailer says so
            log.error("client app failed on task %d:\n%s", task.task_id, traceback.format_exc())
            trailer.status = pb.RESULT_STATUS_CLIENT_ERROR
            trailer.error = f"{type(exc).__name__}: {exc}"[:2000]
        trailer.compute_s = time.perf_counter() - started
        upload.finish(trailer)
        self.tasks_done += 1

    def _fit_in_segments(
        self,
        task: pb.Task,
        global_weights: Weights,
        upload: BackgroundUpload,
        trailer: pb.UploadHeader,
    ) -> None:
        if self._client is None:
            raise RuntimeError("no client app")
        config = scalar_map(task.config)

        def send(index: int, update: GroupUpdate) -> None:
            upload.send(self._encode_group(task, update))

        with self._slot:
            if streaming.is_streaming(config):
                fit = fit_streaming(
                    self._client,
                    global_weights,
                    config,
                    send,
                    self._streaming,
                    run_id=task.run_id,
                    server_round=task.round,
                )
            else:
                keep = partial_sync.keeps_local(config)
                progress = self._progress.for_run(task.run_id) if keep else None
                fit = fit_in_segments(self._client, global_weights, config, send, progress)
        trailer.num_examples = fit.num_examples
        _fill_metrics(trailer, fit.metrics)

    def _encode_group(self, task: pb.Task, update: GroupUpdate) -> Mapping[str, Tensorish]:
        """One layer group under the server's upload plan (raw when there is none)."""
        if not task.HasField("upload") or not task.upload.steps:
            return update
        plan = plan_from_proto(task.upload)
        tensors, _ = self._compressor.encode(
            update, plan, run_id=task.run_id, round_number=task.round, seed=task.task_id
        )
        return tensors

    def _report_failure(self, task: pb.Task, exc: Exception, seconds: float) -> None:
        header = pb.UploadHeader(
            task_id=task.task_id,
            round=task.round,
            attempt=1,
            status=pb.RESULT_STATUS_CLIENT_ERROR,
            update_kind=pb.UPDATE_KIND_NONE,
            error=f"{type(exc).__name__}: {exc}"[:2000],
            compute_s=seconds,
        )
        self._conn.submit(header, None, self._opt.chunk_bytes, self._remaining(task))
        self.tasks_done += 1

    def _handle_message(self, task: pb.Task) -> None:
        """A Flower message from a server running a ServerApp: the app answers it."""
        from geofl.client import flower_messages  # imports flwr: only for Flower runs

        arrays = self._model(task) if task.num_tensors else {}
        header = pb.UploadHeader(task_id=task.task_id, round=task.round, attempt=1)
        tensors: Weights = {}
        started = time.perf_counter()
        try:
            if self._client is None or self.session is None:
                raise RuntimeError("no client app")
            with self._slot:
                content, tensors = flower_messages.answer(
                    self._client, task, arrays, self.session.node_id
                )
        except Exception as exc:  # the user's code failed: report it, keep serving
            log.error("client app failed on task %d:\n%s", task.task_id, traceback.format_exc())
            content, tensors = flower_messages.failure(task, exc), {}
        header.flower.CopyFrom(content)
        if content.HasField("error"):
            header.status = pb.RESULT_STATUS_CLIENT_ERROR
            header.error = content.error.reason[:2000]
        else:
            header.status = pb.RESULT_STATUS_OK
        header.update_kind = pb.UPDATE_KIND_FULL if tensors else pb.UPDATE_KIND_NONE
        header.payload_bytes = sum(int(t.nbytes) for t in tensors.values())
        header.compute_s = time.perf_counter() - started
        self._conn.submit(header, tensors or None, self._opt.chunk_bytes, self._remaining(task))
        self.tasks_done += 1

    def _fit(
        self, global_weights: Weights, config: dict[str, Scalar], header: pb.UploadHeader
    ) -> dict[str, Difference]:
        if self._client is None:
            raise RuntimeError("no client app")
        with self._slot:
            update = fit_update(self._client, global_weights, config)
        header.update_kind = pb.UPDATE_KIND_DELTA
        header.num_examples = update.num_examples
        _fill_metrics(header, update.metrics)
        return update.delta

    def _secure_stage(self, task: pb.Task) -> pb.SecAggResult:
        if task.kind == pb.TASK_KIND_SECAGG_ADVERTISE:
            if self.session is None:
                raise RuntimeError("not joined")
            return self._secure.advertise(task, self.session.node_id)
        if task.kind == pb.TASK_KIND_SECAGG_SHARE:
            return self._secure.share(task)
        return self._secure.unmask(task)

    def _upload(
        self, task: pb.Task, delta: dict[str, Difference], header: pb.UploadHeader
    ) -> Mapping[str, Tensorish]:
        """The masked ring vector in a secure round, else the (compressed) delta."""
        if not task.HasField("secagg"):
            return self._compress(task, delta, header)
        masked = self._secure.mask(task, delta, int(header.num_examples))
        header.update_kind = pb.UPDATE_KIND_MASKED
        header.payload_bytes = masked.nbytes
        return {MASKED_TENSOR: masked}

    def _compress(
        self, task: pb.Task, delta: dict[str, Difference], header: pb.UploadHeader
    ) -> Mapping[str, Tensorish]:
        """Encode the update under the server's plan (the raw delta when there is none)."""
        if not task.HasField("upload") or not task.upload.steps:
            header.payload_bytes = sum(v.nbytes for v in delta.values())
            return delta
        plan = plan_from_proto(task.upload)
        tensors, header.payload_bytes = self._compressor.encode(
            delta, plan, run_id=task.run_id, round_number=task.round, seed=task.task_id
        )
        return tensors

    def _evaluate(
        self, global_weights: Weights, config: dict[str, Scalar], header: pb.UploadHeader
    ) -> None:
        if self._client is None:
            raise RuntimeError("no client app")
        with self._slot:
            result = evaluate_model(self._client, global_weights, config)
        header.update_kind = pb.UPDATE_KIND_NONE
        header.num_examples = result.num_examples
        header.loss = result.loss
        _fill_metrics(header, result.metrics)


def _announced_bytes(task: pb.Task, global_weights: Weights) -> int:
    """The most an overlapped upload can take: the whole model raw, or for a streaming
    round the bound the server allows its fragment (codec headers can exceed raw)."""
    config = scalar_map(task.config)
    if not streaming.is_streaming(config):
        return sum(int(v.nbytes) for v in global_weights.values())
    order = streaming.expected_upload(spec_of(global_weights), config)
    return payload_limit(model_bytes(order))


def _fill_metrics(header: pb.UploadHeader, metrics: dict[str, Scalar]) -> None:
    fill_scalar_map(header.metrics, {str(k): v for k, v in metrics.items()})
    loss = reported_loss(metrics)
    if loss is not None:
        header.loss = loss


__all__ = ["Backoff", "ClientOptions", "ClientRuntime", "GaveUpError"]
