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
from geofl.client.connection import CredentialsError, TlsVerificationError
from geofl.client.runtime import ClientOptions, ClientRuntime, GaveUpError
from geofl.protocols.errors import ErrorCode, IdentityRefusedError, WireError
from geofl.protocols.identity import KeyFileError
from geofl.protocols.types import Scalar

# Exit codes shared with the ``geofl`` program (see geofl.server.cli.exit_codes).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_USER_CODE, EXIT_UNREACHABLE, EXIT_PROTOCOL = 0, 1, 2, 5, 6, 7
EXIT_IDENTITY, EXIT_TLS, EXIT_CREDENTIALS = 8, 9, 10
EXIT_INTERRUPTED = 130

#: Errors that retrying cannot fix: (class, exit code, hint printed after the error).
NON_RETRYABLE: tuple[tuple[type[Exception], int, str], ...] = (
    (
        IdentityRefusedError,
        EXIT_IDENTITY,
        "the server does not accept this node's identity: give its operator your public key "
        "(NAME.node.yaml from `geofl keys new`) for server.auth.nodes, or check --node-key, "
        "--name and --region (see docs/security.md)",
    ),
    (
        TlsVerificationError,
        EXIT_TLS,
        "check that --root-certificates is the CA that signed the server's certificate (and "
        "its name matches the --server host), and with mutual TLS that the server's "
        "tls.client_ca signed --tls-cert (see docs/security.md)",
    ),
    (
        CredentialsError,
        EXIT_CREDENTIALS,
        "check the paths of --root-certificates, --tls-cert, --tls-key and --node-key",
    ),
    (
        KeyFileError,
        EXIT_CREDENTIALS,
        "--node-key must be the NAME.key file written by `geofl keys new NAME`",
    ),
)
_PROTOCOL_HINT = "install the same geofl protocol version on this client and the server"


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
        "--tls-cert",
        type=Path,
        metavar="PEM",
        help="mutual TLS: this node's certificate (geofl certs node NAME)",
    )
    parser.add_argument("--tls-key", type=Path, metavar="PEM", help="mutual TLS: its private key")
    parser.add_argument(
        "--node-key",
        type=Path,
        metavar="NAME.key",
        help="Ed25519 key proving this node's identity (geofl keys new NAME); the node's "
        "name defaults to the file's stem",
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
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        node_key=args.node_key,
        reconnect_for_s=args.reconnect_for,
        state_dir=args.state_dir,
    )
    if args.name:
        options.node_name = args.name
    elif args.node_key is not None:
        options.node_name = args.node_key.stem  # geofl keys new NAME writes NAME.key
    elif args.tls_cert is not None:
        options.node_name = ""  # the server names the node after its certificate
    try:
        runtime = ClientRuntime(options, factory)
        runtime.run()
    except tuple(cls for cls, _, _ in NON_RETRYABLE) as exc:
        return _refused(exc)
    except GaveUpError as exc:
        print(f"geofl client: error: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except WireError as exc:
        print(f"geofl client: error: {exc}", file=sys.stderr)
        if exc.code is ErrorCode.PROTOCOL_VERSION:
            print(f"geofl client: hint: {_PROTOCOL_HINT}", file=sys.stderr)
            return EXIT_PROTOCOL
        return EXIT_FAILED
    return EXIT_OK


def _refused(exc: Exception) -> int:
    """Print a non-retryable error and its hint; its exit code."""
    for cls, code, hint in NON_RETRYABLE:
        if isinstance(exc, cls):
            print(f"geofl client: error: {exc}", file=sys.stderr)
            print(f"geofl client: hint: {hint}", file=sys.stderr)
            return code
    raise exc


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


__all__ = ["NON_RETRYABLE", "add_arguments", "main", "parse_node_config", "parse_value", "run"]
