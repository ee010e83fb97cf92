"""Several simulated clients in one process: ``python -m geofl.client.pool``.

A wall-clock simulation (``geofl simulate``) starts a few of these worker processes instead
of one ``geofl client`` process per client: a process per client pays the interpreter, the
client app's imports (torch: hundreds of MB) and its data once per client, and ten of them
on two cores spend their time contending. Here each client is still a whole
:class:`~geofl.client.runtime.ClientRuntime` on its own thread, with its own gRPC channel,
session, heartbeats, built client app (so its partition and a Flower ``context.state``
persist across rounds) and upload compressor (error feedback), exactly as in its own
process. What the clients of one worker share is the process: its imports, module-level
caches of the app, and one compute slot, so they train one at a time while the others
download or upload.

A client app given as a :class:`~geofl.client.app.Client` *instance* is one object, so the
clients of a worker share it; give a class or a factory for per-client objects.

Usage (what the simulator runs; not meant to be typed)::

    python -m geofl.client.pool --app MODULE:ATTR --num-partitions 10 \\
        --client 0,127.0.0.1:5000 --client 2,127.0.0.1:5000,eu --node-config key=value
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from geofl.client.app import ClientAppError, ClientFactory, load_client_app
from geofl.client.cli import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PROTOCOL,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    EXIT_USER_CODE,
    exit_process,
    parse_node_config,
)
from geofl.client.runtime import ClientOptions, ClientRuntime, GaveUpError
from geofl.protocols.errors import ErrorCode, WireError
from geofl.protocols.types import Scalar

__all__ = ["PooledClient", "main", "parse_client", "run_pool", "simulated_name"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PooledClient:
    """One simulated client of a worker: its partition, where it connects, its region."""

    index: int
    server: str
    region: str | None = None


def simulated_name(index: int) -> str:
    """The node name of simulated client ``index`` (the same in every process layout)."""
    return f"sim-{index}"


def parse_client(text: str) -> PooledClient:
    """``"3,127.0.0.1:5000"`` or ``"3,127.0.0.1:5000,eu"`` -> a :class:`PooledClient`.

    Raises
    ------
    ValueError
        If the index is not a non-negative integer or the address is missing.
    """
    parts = text.split(",")
    if len(parts) not in (2, 3) or not parts[1]:
        raise ValueError(f"--client {text!r}: expected INDEX,HOST:PORT[,REGION]")
    try:
        index = int(parts[0])
    except ValueError:
        raise ValueError(f"--client {text!r}: index {parts[0]!r} is not an integer") from None
    if index < 0:
        raise ValueError(f"--client {text!r}: index must be >= 0")
    region = parts[2] if len(parts) == 3 and parts[2] else None
    return PooledClient(index, parts[1], region)


def _exit_code(error: BaseException | None) -> int:
    """The exit code ``geofl client`` gives for how its runtime ended."""
    if error is None:
        return EXIT_OK
    if isinstance(error, GaveUpError):
        return EXIT_UNREACHABLE
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(error, WireError) and error.code is ErrorCode.PROTOCOL_VERSION:
        return EXIT_PROTOCOL
    return EXIT_FAILED


def run_pool(
    factory: ClientFactory,
    clients: Sequence[PooledClient],
    num_partitions: int,
    node_config: Mapping[str, Scalar],
    reconnect_for_s: float = 300.0,
    state_dir: Path | None = None,
) -> int:
    """Run every client until its run is over; the worst exit code among them (0: all ok).

    Each client's node config is ``node_config`` plus its ``partition-id`` and
    ``num-partitions``, as the simulator gives a client process.
    """
    slot = threading.Lock()
    errors: dict[int, BaseException | None] = {}

    def serve(client: PooledClient) -> None:
        options = ClientOptions(
            server=client.server,
            node_name=simulated_name(client.index),
            region=client.region,
            node_config={
                **node_config,
                "partition-id": client.index,
                "num-partitions": num_partitions,
            },
            reconnect_for_s=reconnect_for_s,
            state_dir=state_dir,
            compute_slot=slot,
        )
        try:
            ClientRuntime(options, factory).run()
            errors[client.index] = None
        except Exception as exc:  # reported here, and in the exit code
            print(f"geofl client {options.node_name}: error: {exc}", file=sys.stderr)
            errors[client.index] = exc

    threads = [
        threading.Thread(target=serve, args=(c,), name=simulated_name(c.index), daemon=True)
        for c in clients
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    codes = [_exit_code(errors.get(c.index)) for c in clients]
    return max(codes, default=EXIT_OK)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m geofl.client.pool", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--app", required=True, metavar="MODULE:ATTR", help="client app")
    parser.add_argument(
        "--client",
        action="append",
        required=True,
        metavar="INDEX,HOST:PORT[,REGION]",
        help="a simulated client of this worker (repeat for each)",
    )
    parser.add_argument("--num-partitions", type=int, required=True, metavar="N")
    parser.add_argument("--node-config", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--reconnect-for", type=float, default=300.0, metavar="SECONDS")
    parser.add_argument("--state-dir", type=Path, default=Path(".geofl-state"), metavar="DIR")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m geofl.client.pool``; returns the exit code."""
    args = _parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s client %(threadName)s %(message)s",
    )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # apps are imported like `python -m` would
    try:
        clients = [parse_client(text) for text in args.client]
        node_config = parse_node_config(args.node_config)
        factory = load_client_app(args.app)
    except ValueError as exc:
        print(f"geofl client pool: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ClientAppError as exc:
        print(f"geofl client pool: error: {exc}", file=sys.stderr)
        return EXIT_USER_CODE
    try:
        return run_pool(
            factory, clients, args.num_partitions, node_config, args.reconnect_for, args.state_dir
        )
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    exit_process(main())
