"""The loopback bound: how long one round's bytes take to move with no framework at all.

A round of the framework benchmark moves ``clients x model`` bytes down and the same up.
Here a server process pushes ``model_bytes`` to each of ``clients`` concurrent TCP
connections, a second process (the clients) reads them and sends ``model_bytes`` back on
each, and the round ends when the server has received every byte. Two processes, so the
two sides use two cores as the framework's server and clients would; no serialization, no
framing, no disk. A framework's round time minus this bound is its own overhead.

Run as ``python -m benchmarks.loopback_bound --params 1000000 --clients 10 --rounds 5``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
from pathlib import Path

__all__ = ["main", "measure_loopback"]

_CHUNK = 1 << 20
#: Repository root: the client process runs ``-m benchmarks.loopback_bound`` from here.
_ROOT = Path(__file__).resolve().parents[1]


async def _send(writer: asyncio.StreamWriter, payload: memoryview) -> None:
    for start in range(0, len(payload), _CHUNK):
        writer.write(payload[start : start + _CHUNK])
        await writer.drain()


async def _receive(reader: asyncio.StreamReader, nbytes: int) -> None:
    left = nbytes
    while left:
        data = await reader.read(min(left, _CHUNK))
        if not data:
            raise ConnectionError(f"peer closed with {left} of {nbytes} bytes unread")
        left -= len(data)


async def _client_side(port: int, clients: int, nbytes: int, rounds: int) -> None:
    payload = memoryview(bytes(nbytes))
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(clients)]

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(rounds):
            await _receive(reader, nbytes)
            await _send(writer, payload)
        writer.close()
        await writer.wait_closed()  # flush the last upload before the event loop ends

    await asyncio.gather(*(one(r, w) for r, w in conns))


async def _server_side(clients: int, nbytes: int, rounds: int) -> list[float]:
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    ready = asyncio.Event()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append((reader, writer))
        if len(conns) == clients:
            ready.set()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    argv = [sys.executable, "-m", "benchmarks.loopback_bound", "--client-of", str(port)]
    argv += ["--clients", str(clients), "--bytes", str(nbytes), "--rounds", str(rounds)]
    child = subprocess.Popen(argv, cwd=_ROOT)
    try:
        await asyncio.wait_for(ready.wait(), timeout=60)
        payload = memoryview(bytes(nbytes))
        loop = asyncio.get_running_loop()
        times = []
        for _ in range(rounds):
            t0 = loop.time()
            await asyncio.gather(*(_exchange(r, w, payload) for r, w in conns))
            times.append(loop.time() - t0)
        return times
    finally:
        server.close()
        if child.wait(timeout=60) != 0:
            raise RuntimeError(f"loopback client process exited with code {child.returncode}")


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: memoryview
) -> None:
    await _send(writer, payload)
    await _receive(reader, len(payload))


def measure_loopback(model_bytes: int, clients: int, rounds: int) -> list[float]:
    """Seconds per round to move ``model_bytes`` down and up on each of ``clients`` sockets."""
    if model_bytes <= 0 or clients <= 0 or rounds <= 0:
        raise ValueError(
            f"model_bytes, clients and rounds must be positive, got {model_bytes}, "
            f"{clients}, {rounds}"
        )
    return asyncio.run(_server_side(clients, model_bytes, rounds))


def main(argv: list[str] | None = None) -> None:
    """Command line: print per-round and median seconds as JSON."""
    parser = argparse.ArgumentParser(description="loopback transfer bound per FL round")
    parser.add_argument("--params", type=int, default=1_000_000, help="float32 parameters")
    parser.add_argument("--bytes", type=int, default=None, help="model bytes (overrides params)")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--client-of", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    nbytes = args.bytes if args.bytes is not None else 4 * args.params
    if args.client_of is not None:
        asyncio.run(_client_side(args.client_of, args.clients, nbytes, args.rounds))
        return
    times = measure_loopback(nbytes, args.clients, args.rounds)
    summary = {"model_bytes": nbytes, "clients": args.clients, "round_s": times}
    print(json.dumps({**summary, "median_s": statistics.median(times)}))


if __name__ == "__main__":
    main()
