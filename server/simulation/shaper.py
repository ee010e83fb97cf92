"""A user-space WAN link shaper: a TCP proxy that delays and paces like a client's link.

Kernel ``netem`` is not available where geofl simulates, so ``geofl simulate`` on the wall
clock puts one :class:`LinkShaper` between each client and the server. Per direction
(``up``: client to server, ``down``: server to client) it follows the link model of
:mod:`geofl.server.simulation.links`, chunk by chunk:

- **Serialization.** One FIFO pacer per link direction, shared by all of the link's
  connections (it is the client's access link): a chunk of ``L`` bytes read at time ``a``
  departs at ``max(a, previous departure) + 8 L / rate``.
- **Propagation.** The chunk is delivered at ``departure + max(0, rtt/2 + j)``, ``j``
  uniform in ``[-jitter, +jitter]`` per chunk, but never before the connection's previous
  chunk: bytes are not reordered.
- **Loss.** A proxy cannot drop bytes of a TCP stream, so each
  :data:`~geofl.server.simulation.links.SEGMENT_BYTES` segment of a chunk is lost with
  probability ``loss`` and each lost one stalls the pacer for one ``rtt`` (a fast
  retransmit). :func:`~geofl.server.simulation.links.transfer_time_s` adds the expectation,
  ``loss * ceil(B / SEGMENT_BYTES) * rtt``.
- **Backpressure.** A direction stops reading while its undelivered bytes would exceed
  ``rate * (rtt/2 + jitter) / 8`` plus :data:`SPARE_CHUNKS` chunks, so a fast sender blocks
  as at a real bottleneck, yet the pacer never idles while the sender has data.

Deadlines are absolute times on the event loop's monotonic clock, so sleep errors do not
accumulate: ``B`` bytes written at once arrive, last byte, ``rtt/2 + 8 B / R`` after the
first chunk is read. A chunk is delivered whole when its last byte would arrive; chunks
hold about :data:`CHUNK_QUANTUM_S` of serialization, which bounds the granularity. The
TCP handshake itself is not delayed.

``python -m geofl.server.simulation.shaper --upstream HOST:PORT --links LINKS.json`` serves
many links in one process; :func:`start_shaper_process` starts and stops that process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import select
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TextIO

import numpy as np

from geofl.protocols.errors import GeoflError
from geofl.server.simulation.links import SEGMENT_BYTES, ClientLink

__all__ = [
    "CHUNK_QUANTUM_S",
    "LISTEN_HOST",
    "SPARE_CHUNKS",
    "Direction",
    "DirectionStats",
    "LinkShaper",
    "LinkSpec",
    "LinkStats",
    "Pacer",
    "ShaperConfigError",
    "ShaperProcess",
    "ShaperSet",
    "ShaperStartError",
    "Slot",
    "link_name",
    "load_links",
    "main",
    "parse_address",
    "parse_links",
    "plan_transfer",
    "schedule_chunk",
    "serve_links",
    "shaper_command",
    "start_shaper_process",
]

#: The only address the shaper listens on.
LISTEN_HOST = "127.0.0.1"
#: Serialization time one chunk stands for: the granularity of delivery.
CHUNK_QUANTUM_S = 0.01
#: Chunks are whole segments, at least this many (cheap on slow links) ...
MIN_CHUNK_SEGMENTS = 4
#: ... and at most this many (65,160 bytes, under 64 KiB).
MAX_CHUNK_SEGMENTS = 45
#: Chunks a direction may hold beyond its bandwidth-delay product.
SPARE_CHUNKS = 4
PORTS_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
_MODULE = "geofl.server.simulation.shaper"
_PROG = f"python -m {_MODULE}"
_UP_STREAM, _DOWN_STREAM = 0, 1

logger = logging.getLogger(__name__)


class ShaperConfigError(GeoflError, ValueError):
    """A link description, a links file or an upstream address is invalid."""


class ShaperStartError(GeoflError, RuntimeError):
    """The shaper process died or did not report its ports in time."""


def link_name(client: int) -> str:
    """The link name :meth:`LinkSpec.from_client_link` gives client ``client``."""
    return f"client-{client}"


def _number_problem(name: str, value: float, minimum: float, inclusive: bool) -> str | None:
    ok = value >= minimum if inclusive else value > minimum
    if math.isfinite(value) and ok:
        return None
    return f"{name} must be a finite number {'>=' if inclusive else '>'} {minimum}, got {value}"


@dataclass(frozen=True)
class Direction:
    """One direction of a link: its rate (bit/s) and the link's delays (seconds)."""

    rate_bps: float
    rtt_s: float
    jitter_s: float = 0.0
    loss: float = 0.0

    @property
    def chunk_bytes(self) -> int:
        """Bytes read at once: whole segments, about :data:`CHUNK_QUANTUM_S` of sending."""
        segments = round(self.rate_bps * CHUNK_QUANTUM_S / 8 / SEGMENT_BYTES)
        return SEGMENT_BYTES * min(max(segments, MIN_CHUNK_SEGMENTS), MAX_CHUNK_SEGMENTS)

    @property
    def queue_limit_bytes(self) -> int:
        """Most undelivered bytes one connection holds: what is in flight plus spares."""
        # Rounded first, so that float noise does not add a byte.
        in_flight = math.ceil(round(self.rate_bps / 8 * (self.rtt_s / 2 + self.jitter_s), 6))
        return in_flight + SPARE_CHUNKS * self.chunk_bytes


@dataclass(frozen=True)
class LinkSpec:
    """One client's access link as the shaper needs it (seconds, bit/s, loss in [0, 1)).

    Raises
    ------
    ShaperConfigError
        If the name is empty or a figure is out of range, naming the link and the field.
    """

    name: str
    rtt_s: float
    up_bps: float
    down_bps: float
    jitter_s: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ShaperConfigError(f"a link needs a non-empty name, got {self.name!r}")
        problems = [
            _number_problem("rtt_s", self.rtt_s, 0.0, inclusive=True),
            _number_problem("up_bps", self.up_bps, 0.0, inclusive=False),
            _number_problem("down_bps", self.down_bps, 0.0, inclusive=False),
            _number_problem("jitter_s", self.jitter_s, 0.0, inclusive=True),
            None if 0 <= self.loss < 1 else f"loss must be in [0, 1), got {self.loss}",
        ]
        listed = "; ".join(p for p in problems if p)
        if listed:
            raise ShaperConfigError(f"link {self.name!r}: {listed}")

    @classmethod
    def from_client_link(cls, link: ClientLink, name: str | None = None) -> LinkSpec:
        """The shaper's view of ``link``; named :func:`link_name` of its client by default."""
        return cls(
            name=link_name(link.client) if name is None else name,
            rtt_s=link.rtt_s,
            up_bps=link.up_bps,
            down_bps=link.down_bps,
            jitter_s=link.jitter_s,
            loss=link.loss,
        )

    @classmethod
    def from_json(cls, data: object, where: str) -> LinkSpec:
        """A link from its JSON object; ``where`` prefixes every error message."""
        if not isinstance(data, dict):
            raise ShaperConfigError(f"{where}: expected an object, got {type(data).__name__}")
        keys = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(keys))
        if unknown:
            raise ShaperConfigError(f"{where}: unknown key(s) {unknown}; the keys are {keys}")
        missing = [k for k in ("name", "rtt_s", "up_bps", "down_bps") if k not in data]
        if missing:
            raise ShaperConfigError(f"{where}: missing key(s) {missing}")
        for key in keys[1:]:
            value = data.get(key, 0.0)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ShaperConfigError(f"{where}: {key} must be a number, got {value!r}")
        try:
            return cls(**data)
        except ShaperConfigError as exc:
            raise ShaperConfigError(f"{where}: {exc}") from None

    def to_json(self) -> dict[str, Any]:
        """The JSON object :meth:`from_json` reads."""
        return asdict(self)

    @property
    def up(self) -> Direction:
        """Client to server."""
        return Direction(self.up_bps, self.rtt_s, self.jitter_s, self.loss)

    @property
    def down(self) -> Direction:
        """Server to client."""
        return Direction(self.down_bps, self.rtt_s, self.jitter_s, self.loss)


@dataclass(frozen=True)
class Slot:
    """When one chunk leaves the pacer and when it reaches the far end (loop seconds)."""

    departure_s: float
    delivery_s: float
    lost_segments: int


def schedule_chunk(
    direction: Direction,
    arrival_s: float,
    nbytes: int,
    free_at_s: float,
    last_delivery_s: float,
    delay_s: float,
    lost_segments: int,
) -> Slot:
    """The slot of a chunk, purely from the pacer's state and the drawn delay and losses.

    ``departure = max(arrival, free_at) + 8 nbytes / rate + lost_segments * rtt`` and
    ``delivery = max(last_delivery, departure + delay)``: FIFO serialization, one rtt of
    stall per lost segment, and a delay that never reorders the connection's bytes.
    """
    serialization_s = nbytes * 8 / direction.rate_bps
    departure_s = max(arrival_s, free_at_s) + serialization_s + lost_segments * direction.rtt_s
    return Slot(departure_s, max(last_delivery_s, departure_s + delay_s), lost_segments)


class Pacer:
    """The serializer of one link direction, shared by every connection of the link.

    State: ``free_at_s``, when the link finishes sending what it has scheduled. Delays and
    losses are drawn from ``rng`` (per chunk: a delay, then losses when ``loss > 0``).
    """

    def __init__(self, direction: Direction, rng: np.random.Generator) -> None:
        self.direction = direction
        self.free_at_s = -math.inf
        self._rng = rng

    def draw_delay_s(self) -> float:
        """One one-way delay: ``max(0, rtt/2 + j)``, ``j`` uniform in ``[-jitter, jitter]``."""
        jitter = self.direction.jitter_s
        sample = float(self._rng.uniform(-jitter, jitter)) if jitter else 0.0
        return max(0.0, self.direction.rtt_s / 2 + sample)

    def draw_lost_segments(self, nbytes: int) -> int:
        """Lost segments of an ``nbytes`` chunk: binomial over ``ceil(nbytes / SEGMENT)``."""
        if not self.direction.loss or not nbytes:
            return 0
        return int(self._rng.binomial(math.ceil(nbytes / SEGMENT_BYTES), self.direction.loss))

    def next_slot(self, arrival_s: float, nbytes: int, last_delivery_s: float) -> Slot:
        """Schedule a chunk read at ``arrival_s`` after the connection's last delivery."""
        delay_s = self.draw_delay_s()
        lost = self.draw_lost_segments(nbytes)
        slot = schedule_chunk(
            self.direction, arrival_s, nbytes, self.free_at_s, last_delivery_s, delay_s, lost
        )
        self.free_at_s = slot.departure_s
        return slot


def plan_transfer(
    direction: Direction, nbytes: int, rng: np.random.Generator, start_s: float = 0.0
) -> list[Slot]:
    """The slots of ``nbytes`` written at once at ``start_s`` on an idle link.

    What the shaper does with one message, read in full chunks; the last slot's delivery
    less ``start_s`` is the transfer time, whose expectation is ``transfer_time_s``.
    """
    pacer = Pacer(direction, rng)
    chunk = direction.chunk_bytes
    slots: list[Slot] = []
    last_delivery_s = -math.inf
    for offset in range(0, nbytes, chunk):
        slot = pacer.next_slot(start_s, min(chunk, nbytes - offset), last_delivery_s)
        slots.append(slot)
        last_delivery_s = slot.delivery_s
    return slots


@dataclass
class DirectionStats:
    """What one direction of a link carried (bytes read, losses, queue high-water mark)."""

    queue_limit_bytes: int
    bytes: int = 0
    lost_segments: int = 0
    peak_queued_bytes: int = 0


@dataclass
class LinkStats:
    """Counters of one link since it started."""

    up: DirectionStats
    down: DirectionStats
    connections: int = 0
    open_connections: int = 0


class _Pipe:
    """One direction of one connection: read, schedule on the pacer, deliver on time."""

    def __init__(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        pacer: Pacer,
        stats: DirectionStats,
    ) -> None:
        self._source, self._sink, self._pacer, self._stats = source, sink, pacer, stats
        self._chunk = pacer.direction.chunk_bytes
        self._limit = stats.queue_limit_bytes
        self._slots: asyncio.Queue[tuple[Slot, bytes]] = asyncio.Queue()
        self._room = asyncio.Event()
        self._queued = 0

    async def run(self) -> None:
        """Until the source's end of stream has been delivered to the sink."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._read())
            group.create_task(self._deliver())

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        last_delivery_s = -math.inf
        while True:
            while self._queued + self._chunk > self._limit:  # backpressure: stop reading
                self._room.clear()
                await self._room.wait()
            data = await self._source.read(self._chunk)
            slot = self._pacer.next_slot(loop.time(), len(data), last_delivery_s)
            last_delivery_s = slot.delivery_s
            self._queued += len(data)
            self._stats.bytes += len(data)
            self._stats.lost_segments += slot.lost_segments
            self._stats.peak_queued_bytes = max(self._stats.peak_queued_bytes, self._queued)
            self._slots.put_nowait((slot, data))
            if not data:
                return

    async def _deliver(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            slot, data = await self._slots.get()
            wait_s = slot.delivery_s - loop.time()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            if not data:  # the end of stream travels the link too, then half-closes
                if self._sink.can_write_eof():
                    self._sink.write_eof()
                return
            self._sink.write(data)
            await self._sink.drain()
            self._queued -= len(data)
            self._room.set()


async def _close(writers: Sequence[asyncio.StreamWriter], abort: bool) -> None:
    """Close (or, after a failure, abort) every writer, then wait for them.

    All are closed before the first wait, so that a cancellation during a wait cannot
    leave one open.
    """
    for writer in writers:
        if abort:
            writer.transport.abort()
        else:
            writer.close()
    for writer in writers:
        with contextlib.suppress(OSError):
            await writer.wait_closed()


class LinkShaper:
    """One client link: a port on :data:`LISTEN_HOST` whose connections reach ``upstream``.

    Parameters
    ----------
    spec
        The link.
    upstream
        ``(host, port)`` of the server every accepted connection is forwarded to.
    seed
        Seeds the link's delay and loss draws (with the link's name, per direction).
    """

    def __init__(self, spec: LinkSpec, upstream: tuple[str, int], seed: int = 0) -> None:
        self.spec = spec
        self._upstream = upstream
        key = zlib.crc32(spec.name.encode())
        self._up = Pacer(spec.up, np.random.default_rng([seed, key, _UP_STREAM]))
        self._down = Pacer(spec.down, np.random.default_rng([seed, key, _DOWN_STREAM]))
        self.stats = LinkStats(
            up=DirectionStats(spec.up.queue_limit_bytes),
            down=DirectionStats(spec.down.queue_limit_bytes),
        )
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()

    @property
    def port(self) -> int:
        """The listening port (after :meth:`start`)."""
        if self._server is None:
            raise RuntimeError(f"link {self.spec.name!r} is not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self, port: int = 0) -> int:
        """Listen on ``port`` (0: any free one); returns the port."""
        if self._server is not None:
            raise RuntimeError(f"link {self.spec.name!r} is already started")
        self._server = await asyncio.start_server(self._accept, LISTEN_HOST, port)
        return self.port

    async def close(self) -> None:
        """Stop listening and cut every open connection; idempotent."""
        if self._server is not None:
            self._server.close()
        connections = list(self._connections)
        for task in connections:
            task.cancel()
        await asyncio.gather(*connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> LinkShaper:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    def _accept(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        # Our own task, not the stream's: close() cancels it, and Python 3.11's streams
        # log a cancelled connection task as an unhandled error.
        task = asyncio.get_running_loop().create_task(self._serve(client_reader, client))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _serve(
        self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter
    ) -> None:
        self.stats.connections += 1
        self.stats.open_connections += 1
        try:
            await self._relay(client_reader, client)
        finally:
            self.stats.open_connections -= 1

    async def _relay(
        self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter
    ) -> None:
        writers = [client]
        failed = True
        try:
            server_reader, server = await asyncio.open_connection(*self._upstream)
            writers.append(server)
            async with asyncio.TaskGroup() as group:
                group.create_task(_Pipe(client_reader, server, self._up, self.stats.up).run())
                group.create_task(_Pipe(server_reader, client, self._down, self.stats.down).run())
            failed = False
        except* OSError as errors:  # a reset on either side cuts both, as a router would
            if len(writers) == 1:
                host, port = self._upstream
                logger.warning(
                    "link %s: cannot reach %s:%d: %s", self.spec.name, host, port, errors
                )
            else:
                logger.debug("link %s: connection cut: %s", self.spec.name, errors.exceptions)
        finally:  # also when cancelled, even while connecting
            await _close(writers, abort=failed)


def _check_unique(specs: Sequence[LinkSpec]) -> None:
    names = [spec.name for spec in specs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ShaperConfigError(f"link names must be unique, repeated: {repeated}")


class ShaperSet:
    """Many links in one event loop, one port each; see :class:`LinkShaper`."""

    def __init__(self, specs: Sequence[LinkSpec], upstream: tuple[str, int], seed: int = 0) -> None:
        _check_unique(specs)
        self.shapers = {spec.name: LinkShaper(spec, upstream, seed) for spec in specs}

    async def start(self) -> dict[str, int]:
        """Listen on a free port per link; returns the ports by link name."""
        try:
            for shaper in self.shapers.values():
                await shaper.start()
        except BaseException:
            await self.close()
            raise
        return self.ports

    @property
    def ports(self) -> dict[str, int]:
        """The listening port of each link, by name."""
        return {name: shaper.port for name, shaper in self.shapers.items()}

    async def close(self) -> None:
        """Close every link."""
        await asyncio.gather(*(shaper.close() for shaper in self.shapers.values()))


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as ``(host, port)``.

    Raises
    ------
    ShaperConfigError
        If there is no host or the port is not an integer in 1..65535.
    """
    host, _, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ShaperConfigError(
            f"upstream must be HOST:PORT with a port in 1..65535, got {address!r}"
        )
    return host, int(port)


def parse_links(text: str, source: str) -> tuple[LinkSpec, ...]:
    """The links of a JSON list of link objects; errors name ``source`` and the link."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ShaperConfigError(f"{source}: not JSON: {exc}") from None
    if not isinstance(data, list) or not data:
        raise ShaperConfigError(f"{source}: expected a non-empty JSON list of links")
    specs = tuple(LinkSpec.from_json(item, f"{source}: link {i}") for i, item in enumerate(data))
    try:
        _check_unique(specs)
    except ShaperConfigError as exc:
        raise ShaperConfigError(f"{source}: {exc}") from None
    return specs


def load_links(path: Path) -> tuple[LinkSpec, ...]:
    """Read a links file (see :func:`parse_links`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ShaperConfigError(f"{path}: cannot read: {exc}") from None
    return parse_links(text, str(path))


async def serve_links(
    specs: Sequence[LinkSpec], upstream: tuple[str, int], seed: int, out: TextIO
) -> None:
    """Serve ``specs`` until SIGTERM or SIGINT; the ports go to ``out`` as one JSON line."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    shapers = ShaperSet(specs, upstream, seed)
    try:
        ports = await shapers.start()
        out.write(json.dumps({"ports": ports}) + "\n")
        out.flush()
        await stop.wait()
    finally:
        await shapers.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None) -> int:
    """The shaper process; returns 0 after SIGTERM/SIGINT, 2 on bad input, 4 if it can't bind."""
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Shape each link's connections to the upstream server like a WAN link; "
        'print {"ports": {NAME: PORT}} as one JSON line, serve until SIGTERM or SIGINT.',
    )
    parser.add_argument("--upstream", required=True, help="HOST:PORT of the server")
    parser.add_argument(
        "--links",
        required=True,
        type=Path,
        help="JSON list of {name, rtt_s, up_bps, down_bps, jitter_s, loss}",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of delay and loss draws")
    args = parser.parse_args(argv)
    try:
        upstream = parse_address(args.upstream)
        specs = load_links(args.links)
    except ShaperConfigError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format=f"{_PROG}: %(levelname)s %(message)s")
    try:
        asyncio.run(serve_links(specs, upstream, args.seed, sys.stdout))
    except OSError as exc:
        print(f"{_PROG}: error: cannot listen on {LISTEN_HOST}: {exc}", file=sys.stderr)
        return 4
    return 0


def shaper_command(links_path: Path, upstream: str, seed: int) -> list[str]:
    """The command line :func:`start_shaper_process` runs."""
    return [
        sys.executable,
        "-m",
        _MODULE,
        "--upstream",
        upstream,
        "--links",
        str(links_path),
        "--seed",
        str(seed),
    ]


@dataclass
class ShaperProcess:
    """A running shaper process and its ports; :meth:`stop` it (or use it as a context)."""

    process: subprocess.Popen[bytes]
    ports: Mapping[str, int]
    log_path: Path = field(repr=False)

    def port_of(self, name: str) -> int:
        """The local port of link ``name``."""
        if name not in self.ports:
            raise KeyError(f"no link named {name!r}; the links are {sorted(self.ports)}")
        return self.ports[name]

    def address_of(self, name: str) -> str:
        """``127.0.0.1:PORT`` of link ``name``: where its client should connect."""
        return f"{LISTEN_HOST}:{self.port_of(name)}"

    def stop(self) -> int:
        """Terminate the process by its PID and wait; returns its exit code (0: clean).

        It is killed if it has not exited :data:`STOP_TIMEOUT_S` after SIGTERM.
        """
        if self.process.poll() is None:
            self.process.terminate()
        try:
            code = self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code

    def __enter__(self) -> ShaperProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _still_running(process: subprocess.Popen[bytes], grace_s: float = 1.0) -> bool:
    """Whether ``process`` is alive; one that just closed its stdout gets ``grace_s`` to exit."""
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        return True
    return False


def _read_line(stream: IO[bytes] | None, timeout_s: float) -> bytes | None:
    """The first line of a pipe, or None if it ends or ``timeout_s`` passes first."""
    if stream is None:
        raise ValueError("the process has no stdout pipe")
    deadline = time.monotonic() + timeout_s
    fd = stream.fileno()
    received = b""
    while b"\n" not in received:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            piece = os.read(fd, 4096)
            if not piece:
                return None
            received += piece
    return received.split(b"\n", 1)[0]


def _ports_of(line: bytes | None, names: Sequence[str]) -> dict[str, int] | None:
    try:
        ports = json.loads(line or b"")["ports"]
        if sorted(ports) != sorted(names) or not all(type(v) is int for v in ports.values()):
            return None
    except (ValueError, TypeError, KeyError):
        return None
    return {str(name): int(port) for name, port in ports.items()}


def start_shaper_process(
    links: Sequence[ClientLink] | Sequence[LinkSpec],
    upstream: str,
    workdir: Path,
    seed: int = 0,
    timeout_s: float = PORTS_TIMEOUT_S,
) -> ShaperProcess:
    """Start ``python -m geofl.server.simulation.shaper`` for ``links`` to ``upstream``.

    ``ClientLink`` entries are named :func:`link_name` of their client. The links file and
    the process's stderr (``shaper-links.json``, ``shaper.log``) are written to
    ``workdir``.

    Raises
    ------
    ShaperConfigError
        On a bad link, repeated names or a bad ``upstream``, before starting anything.
    ShaperStartError
        If the process exits or does not report its ports within ``timeout_s`` (the
        message carries its stderr); the process is stopped.
    """
    specs = [s if isinstance(s, LinkSpec) else LinkSpec.from_client_link(s) for s in links]
    if not specs:
        raise ShaperConfigError("no links to shape")
    _check_unique(specs)
    parse_address(upstream)
    workdir.mkdir(parents=True, exist_ok=True)
    links_path = workdir / "shaper-links.json"
    links_path.write_text(json.dumps([spec.to_json() for spec in specs], indent=1) + "\n")
    log_path = workdir / "shaper.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            shaper_command(links_path, upstream, seed),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
        )
    started = ShaperProcess(process, {}, log_path)
    line = _read_line(process.stdout, timeout_s)
    ports = _ports_of(line, [s.name for s in specs])
    if ports is None:
        running = _still_running(process)
        code = started.stop()
        if line is not None:
            what = f"printed {line[:200]!r} instead of the ports of its links"
        elif running:
            what = f"did not report its ports within {timeout_s:g} s"
        else:
            what = f"exited with code {code} before reporting its ports"
        stderr = log_path.read_text(encoding="utf-8", errors="replace").strip()
        raise ShaperStartError(f"the shaper process {what}; its stderr:\n{stderr or '(empty)'}")
    started.ports = ports
    return started


if __name__ == "__main__":
    raise SystemExit(main())
