"""``geofl``: the one command line of the project.

Subcommands import what they need lazily, so ``geofl client`` works on a
machine that has only the client's dependencies.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from geofl.server.cli.exit_codes import epilog

DEFAULT_DB = "sqlite:///runs/geofl.db"


def _add_config_args(parser: argparse.ArgumentParser, simulate: bool = False) -> None:
    parser.add_argument(
        "-c",
        "--config",
        type=Path,
        metavar="RUN.yaml",
        help="the run's YAML configuration (required unless --flower-app is given)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a configuration value, e.g. --set run.rounds=3 (repeatable)",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    parser.add_argument(
        "--new-run",
        action="store_true",
        help="start a new run even if run.name names one that ended (else that is an error; "
        "a resumable run of that name and configuration is resumed)",
    )
    from geofl.server.flower.arguments import add_flower_arguments

    add_flower_arguments(parser, simulate)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (also used to test that every command has help)."""
    parser = argparse.ArgumentParser(
        prog="geofl",
        description="Federated learning for the wide-area network.",
        epilog=epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("geofl")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        installed = "unknown"
    parser.add_argument("--version", action="version", version=f"geofl {installed}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    server = sub.add_parser(
        "server",
        help="run the coordinator of a run described in YAML",
        description="Serve a run: clients connect with `geofl client`.",
    )
    _add_config_args(server)

    client = sub.add_parser(
        "client",
        help="run a client app against a coordinator",
        description="Connect to a coordinator and serve its tasks.",
    )
    from geofl.client.cli import add_arguments

    add_arguments(client)

    relay = sub.add_parser(
        "relay",
        help="run a regional relay: a client of the coordinator, a server to its region",
        description="Serve one region's clients (`geofl client --server` this relay) and take "
        "part in the coordinator's run as one node: each of its tasks becomes --local-rounds "
        "regional FedAvg rounds, and one update per region goes to the coordinator.",
    )
    from geofl.server.cli.relay import add_arguments as add_relay_arguments

    add_relay_arguments(relay)

    simulate = sub.add_parser(
        "simulate",
        help="run a YAML run with local client processes over loopback gRPC",
        description="Start the coordinator and `simulation.clients` client processes, each "
        "running `simulation.app` with node config partition-id=i num-partitions=N.",
    )
    _add_config_args(simulate, simulate=True)

    runs = sub.add_parser(
        "runs",
        help="inspect and operate runs: from the database, or a live server's control API",
        description="Show runs, rounds, participations and events from the database "
        "(--db) or a live coordinator (--server HOST:PORT --key ADMIN.key); stop a live run, "
        "follow its events, pull a round's model; write a run's HTML report or CSV export.",
    )
    runs_sub = runs.add_subparsers(dest="runs_command", required=True, metavar="ACTION")
    listing = runs_sub.add_parser(
        "list", help="one line per run", description="List the runs in the database."
    )
    show = runs_sub.add_parser(
        "show",
        help="a run's rounds and participations",
        description="Show one run: rounds, metrics, clients.",
    )
    show.add_argument("run_id", type=int, metavar="RUN_ID")
    for p in (listing, show):
        p.add_argument(
            "--db",
            default=None,
            metavar="URL",
            help=f"database URL (default: $GEOFL_DB or {DEFAULT_DB})",
        )
        p.add_argument("--json", action="store_true", help="machine-readable JSON output")
    from geofl.server.cli.runs import add_arguments as add_runs_arguments
    from geofl.server.cli.runs_reports import add_arguments as add_report_arguments

    add_runs_arguments(runs_sub.add_parser, (listing, show))
    add_report_arguments(runs_sub)

    keys = sub.add_parser(
        "keys",
        help="make a node's Ed25519 key pair (node identity by key)",
        description="Node identity by key: see docs/security.md.",
    )
    certs = sub.add_parser(
        "certs",
        help="make a CA, a server certificate and node certificates (mutual TLS)",
        description="Mutual TLS certificates: see docs/security.md.",
    )
    from geofl.server.cli.credentials import add_arguments as add_credential_arguments

    add_credential_arguments(keys, certs)

    db = sub.add_parser("db", help="database maintenance", description="Database maintenance.")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    upgrade = db_sub.add_parser(
        "upgrade",
        help="apply migrations up to the latest schema",
        description="Apply the schema migrations (Alembic) to head.",
    )
    upgrade.add_argument(
        "--db",
        default=None,
        metavar="URL",
        help=f"database URL (default: $GEOFL_DB or {DEFAULT_DB})",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``geofl`` console script."""
    args = build_parser().parse_args(argv)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # user code (model, apps) imports from here
    if args.command == "client":
        from geofl.client.cli import exit_process, run

        exit_process(run(args))
    if args.command == "relay":
        from geofl.client.cli import exit_process
        from geofl.server.cli.relay import run_relay

        exit_process(run_relay(args))
    if args.command in ("server", "simulate"):
        from geofl.client.cli import exit_process
        from geofl.server.cli.serve import run_serve

        exit_process(run_serve(args))
    if args.command in ("keys", "certs"):
        from geofl.server.cli.credentials import run_credentials

        return run_credentials(args)
    if args.command == "runs" and args.runs_command in ("report", "export"):
        from geofl.server.cli.runs_reports import run_reports

        return run_reports(args)
    if args.command == "runs":
        from geofl.server.cli.runs import run_runs

        return run_runs(args)
    from geofl.server.cli.inspect import run_inspect

    return run_inspect(args)


if __name__ == "__main__":
    raise SystemExit(main())
