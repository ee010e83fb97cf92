"""A TCP proxy that counts the bytes a framework really puts on the wire.

Frameworks report traffic differently (Flower counts message payloads; geofl records
encoded update sizes), so the benchmark puts this proxy between the clients and the server
and counts every byte of every connection in both directions: payload, protocol framing,
headers, polls and heartbeats. It is protocol-agnostic (HTTP/1.1 and gRPC/HTTP2 alike),
so the same number means the same thing for every system.

Counters are sampled with wall-clock timestamps into a JSON-lines file, so the harness can
attribute bytes to rounds afterwards from the rounds' own start and end times.

Run as ``python -m benchmarks.byteproxy --listen 127.0.0.1:9000 --target 127.0.0.1:8000
--samples bytes.jsonl``; it stops on SIGTERM or SIGINT after writing a final sample.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ByteCounters", "ByteProxy", "main", "parse_hostport"]

_READ_SIZE = 256 * 1024


@dataclass
class ByteCounters:
    """Cumulative byte counts since the proxy started.

    Attributes
    ----------
    up
        Bytes from clients to the server (client -> listen side -> target).
    down
        Bytes from the server to clients.
    connections
        Connections accepted so far.
    """

    up: int = 0
    down: int = 0
    connections: int = 0


def parse_hostport(text: str) -> tuple[str, int]:
    """Split ``"host:port"``; a clear error names the malformed value."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT with a port in 1..65535, got {text!r}")
    return host, int(port)


class ByteProxy:
    """Forward every connection on ``listen`` to ``target``, counting bytes both ways.

    Parameters
    ----------
    listen_host, listen_port
        Where clients connect; port 0 picks a free port (see :attr:`port` after start).
    target_host, target_port
        The real server. It need not be up yet: each connection dials it on accept.
    """

    def __init__(
        self, listen_host: str, listen_port: int, target_host: str, target_port: int
    ) -> None:
        self.counters = ByteCounters()
        self._listen = (listen_host, listen_port)
        self._target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        """The port actually listened on (useful with port 0)."""
        if self._server is None:
            raise RuntimeError("ByteProxy.port read before start()")
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        """Start accepting connections."""
        self._server = await asyncio.start_server(self._accept, *self._listen)

    async def stop(self) -> None:
        """Stop accepting and close every forwarded connection."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counters.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer, upstream=True)),
            asyncio.create_task(self._pump(up_reader, writer, upstream=False)),
        ]
        self._tasks.update(pumps)
        try:
            await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self._tasks.difference_update(pumps)
            for w in (writer, up_writer):
                w.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        try:
            while data := await reader.read(_READ_SIZE):
                if upstream:
                    self.counters.up += len(data)
                else:
                    self.counters.down += len(data)
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            writer.close()


def _sample_line(counters: ByteCounters) -> str:
    record = {
        "t": time.time(),
        "up": counters.up,
        "down": counters.down,
        "connections": counters.connections,
    }
    return json.dumps(record) + "\n"


async def _serve(proxy: ByteProxy, samples: Path, interval_s: float) -> None:
    await proxy.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    last = (-1, -1)
    with samples.open("a", encoding="utf-8") as out:
        out.write(_sample_line(proxy.counters))
        out.flush()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
            now = (proxy.counters.up, proxy.counters.down)
            if now != last or stop.is_set():
                out.write(_sample_line(proxy.counters))
                out.flush()
                last = now
    await proxy.stop()


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point: proxy until SIGTERM, sampling counters to a file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to accept clients on")
    parser.add_argument("--target", required=True, help="HOST:PORT of the real server")
    parser.add_argument("--samples", required=True, type=Path, help="JSON-lines output file")
    parser.add_argument("--interval", type=float, default=0.1, help="sampling period (s)")
    args = parser.parse_args(argv)
    proxy = ByteProxy(*parse_hostport(args.listen), *parse_hostport(args.target))
    asyncio.run(_serve(proxy, args.samples, args.interval))


if __name__ == "__main__":
    main()
