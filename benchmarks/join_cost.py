"""Join cost with and without node authentication, over real gRPC on loopback.

A coordinator is started three ways (no authentication, keys, mutual TLS) with its SQLite
database in a temporary folder; one client then joins ``--joins`` times in a row on one
connection (what a node pays on every (re)join), and ``--fresh`` times with a new
connection each time (what a node pays on its first join, TLS handshake included).
Prints milliseconds per join and joins per second for each.

    python -m benchmarks.join_cost --joins 300 --fresh 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from geofl.client.connection import Connection
from geofl.server.cli.credentials import certs_ca, certs_leaf, keys_new, subject_name
from geofl.server.config import parse_config
from geofl.server.coordinator import Coordinator

MODEL = "benchmarks.join_cost:tiny_model"


def tiny_model() -> dict[str, Any]:
    """One small tensor: the model does not matter to a join."""
    import numpy as np

    return {"w": np.zeros(4, dtype=np.float32)}


def _config(folder: Path, server: dict[str, Any]) -> Any:
    return parse_config(
        {
            "run": {"name": "join-cost", "rounds": 1},
            "model": MODEL,
            "strategy": {"name": "fedavg", "clients_per_round": 1000, "min_clients": 1000},
            "schedule": {"wait_for_clients_s": 3600},
            "storage": {"url": f"sqlite:///{folder / 'db.sqlite'}", "checkpoints": str(folder)},
            "server": {"address": "127.0.0.1:0", **server},
        },
        source="join_cost",
    )


@contextmanager
def _serving(config: Any) -> Iterator[int]:
    """A coordinator on its own event loop; yields its port (its run waits for clients)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def boot() -> tuple[Coordinator, int]:
        coordinator = Coordinator(config)
        return coordinator, await coordinator.start()

    coordinator, port = asyncio.run_coroutine_threadsafe(boot(), loop).result(30)
    try:
        yield port
    finally:
        asyncio.run_coroutine_threadsafe(coordinator.stop(0), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _rate(count: int, join: Callable[[int], None]) -> dict[str, float]:
    join(-1)  # warm-up
    started = time.perf_counter()
    for index in range(count):
        join(index)
    seconds = time.perf_counter() - started
    return {"ms_per_join": 1000 * seconds / count, "joins_per_s": count / seconds}


def measure(mode: str, folder: Path, joins: int, fresh: int) -> dict[str, Any]:
    """Both rates for one server mode: ``none``, ``keys`` or ``mtls``."""
    server: dict[str, Any] = {}
    client: dict[str, Any] = {}
    name = "node-0"
    if mode == "keys":
        key, _ = keys_new(name, folder / "keys", None, force=True)
        server["auth"] = {"nodes": str(folder / "keys")}
        client["node_key"] = key
    if mode == "mtls":
        certs_ca(folder / "ca", "bench CA", 1, force=True)
        cert, cert_key = certs_leaf(
            folder / "ca", folder, "server", subject_name("localhost"), hosts=["localhost"],
            days=1, force=True,
        )  # fmt: skip
        node = certs_leaf(folder / "ca", folder / "n", name, subject_name(name), days=1, force=True)
        tls = {"cert": str(cert), "key": str(cert_key), "client_ca": str(folder / "ca/ca.pem")}
        server["tls"] = tls
        client = {"root_certificates": folder / "ca/ca.pem", "client_certificate": node}
    host = "localhost" if mode == "mtls" else "127.0.0.1"
    with _serving(_config(folder, server)) as port:
        address = f"{host}:{port}"
        shared = Connection(address, **client)
        same = _rate(joins, lambda i: _join(shared, name))
        shared.close()

        def once(index: int) -> None:
            connection = Connection(address, **client)
            try:
                _join(connection, name)
            finally:
                connection.close()

        new = _rate(fresh, once)
    return {"mode": mode, "same_connection": same, "new_connection": new}


def _join(connection: Connection, name: str) -> None:
    connection.join(name, None, {}, timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--joins", type=int, default=300)
    parser.add_argument("--fresh", type=int, default=50)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    results = []
    for mode in ("none", "keys", "mtls"):
        with tempfile.TemporaryDirectory(prefix="geofl-join-") as folder:
            results.append(measure(mode, Path(folder), args.joins, args.fresh))
    for row in results:
        same, new = row["same_connection"], row["new_connection"]
        print(
            f"{row['mode']:>5}: same connection {same['ms_per_join']:6.2f} ms/join "
            f"({same['joins_per_s']:7.1f}/s); new connection {new['ms_per_join']:6.2f} ms/join "
            f"({new['joins_per_s']:6.1f}/s)"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
