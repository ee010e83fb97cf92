"""``geofl client``: run a client app against a coordinator.

Lives in ``geofl.client`` so a client-only machine (no SQLAlchemy, no server
code) can run ``python -m geofl.client``; ``geofl client`` hands over here.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from geofl.client.app import ClientAppError, load_client_app
from geofl.client.runtime import ClientOptions, ClientRuntime, GaveUpError
from geofl.protocols.errors import ErrorCode, WireError
from geofl.protocols.types import Scalar

# Exit codes shared with the ``geofl`` program (see geofl.server.cli.exit_codes).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_USER_CODE, EXIT_UNREACHABLE, EXIT_PROTOCOL = 0, 1, 2, 5, 6, 7
EXIT_INTERRUPTED = 130


def parse_value(text: str) -> Scalar:
    """``3`` -> int, ``0.5`` -> float, ``true``/``false`` -> bool, else the string."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_node_config(items: Sequence[str]) -> dict[str, Scalar]:
    """``["partition-id=0 num-partitions=4"]`` -> dict (Flower's ``--node-config`` syntax).

    Pairs may come as separate arguments or space-separated in one.
    """
    config: dict[str, Scalar] = {}
    for item in items:
        for part in item.split():
            key, sep, value = part.partition("=")
            if not sep or not key:
                raise ValueError(f"--node-config entry {part!r} is not key=value")
            config[key.strip()] = parse_value(value.strip())
    return config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The client's options (shared by ``geofl client`` and ``python -m geofl.client``)."""
    parser.add_argument(
        "--server",
        required=True,
        metavar="HOST:PORT",
        help="address of the coordinator (or of a regional relay)",
    )
    parser.add_argument(
        "--app",
        required=True,
        metavar="MODULE:ATTR",
        help="client app: a Client, a Client subclass, or a factory(context)",
    )
    parser.add_argument("--region", help="region this client is in (used for scheduling)")
    parser.add_argument(
        "--node-config",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="node configuration passed to the app, e.g. partition-id=0",
    )
    parser.add_argument("--name", help="stable node name (default: host-pid)")
    parser.add_argument(
        "--root-certificates",
        type=Path,
        metavar="PEM",
        help="CA certificate(s) to verify the server's TLS certificate",
    )
    parser.add_argument(
        "--reconnect-for",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="give up after the server was unreachable this long (default 300)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".geofl-state"),
        metavar="DIR",
        help="where compression state (error-feedback residuals) is kept "
        "across restarts (default: .geofl-state)",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")


def run(args: argparse.Namespace) -> int:
    """Run the client; returns an exit code."""
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s client %(message)s",
    )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # apps are imported like `python -m` would
    try:
        node_config = parse_node_config(args.node_config)
        factory = load_client_app(args.app)
    except ValueError as exc:
        print(f"geofl client: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ClientAppError as exc:
        print(f"geofl client: error: {exc}", file=sys.stderr)
        return EXIT_USER_CODE
    options = ClientOptions(
        server=args.server,
        region=args.region,
        node_config=node_config,
        root_certificates=args.root_certificates,
        reconnect_for_s=args.reconnect_for,
        state_dir=args.state_dir,
    )
    if args.name:
        options.node_name = args.name
    runtime = ClientRuntime(options, factory)
    try:
        runtime.run()
    except GaveUpError as exc:
        print(f"geofl client: error: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except WireError as exc:
        print(f"geofl client: error: {exc}", file=sys.stderr)
        return EXIT_PROTOCOL if exc.code is ErrorCode.PROTOCOL_VERSION else EXIT_FAILED
    return EXIT_OK


def exit_process(code: int) -> NoReturn:
    """Exit without tearing down the interpreter's native extensions.

    After the run, grpc's and torch's native threads can abort the process while the
    interpreter finalizes ("terminate called without an active exception", seen in
    about 7 % of client exits on this machine), turning a clean run into exit code
    -6.  Everything of ours is closed and flushed by now, so skip finalization.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m geofl.client``."""
    parser = argparse.ArgumentParser(prog="geofl client", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


__all__ = ["add_arguments", "main", "parse_node_config", "parse_value", "run"]
