"""``geofl runs list|show|stop|logs|pull|dashboard``, against a live server or a database.

With ``--server HOST:PORT --key ADMIN.key`` the commands ask a coordinator's control API
(:mod:`geofl.server.control`); with ``--db URL`` (or neither) ``list``, ``show``, ``logs``
and ``pull`` read the database directly, as ``geofl runs list|show`` always did. ``stop``
and ``dashboard`` need a live server.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from rich.console import Console

from geofl.server.cli.exit_codes import ExitCode
from geofl.server.cli.inspect import detail_tables, event_line, run_inspect, runs_table
from geofl.server.cli.offline import DEFAULT_DB, database_url, open_recorded_database
from geofl.storage import (
    CheckpointCorruptError,
    CheckpointStore,
    DatabaseURLError,
    RecordNotFoundError,
    RunStatus,
    StorageUnavailableError,
    queries,
)
from geofl.storage.events import EventRecord
from geofl.storage.measurements import NodeMeasurementRecord
from geofl.storage.records import RunDetail, RunSummary

__all__ = ["REMOTE_ACTIONS", "add_arguments", "run_runs"]

#: Actions this module adds to ``geofl runs`` (``list`` and ``show`` exist already).
REMOTE_ACTIONS = ("stop", "logs", "pull", "dashboard")
#: How often ``logs --follow --db`` looks for new events.
_FOLLOW_POLL_S = 0.5


def _add_server(parser: argparse.ArgumentParser, required: bool = False) -> None:
    parser.add_argument(
        "--server",
        metavar="HOST:PORT",
        required=required,
        help="a coordinator's control API (server.control.address)"
        + ("" if required else "; instead of --db"),
    )
    parser.add_argument(
        "--key",
        type=Path,
        metavar="ADMIN.key",
        help="the admin's private key (geofl keys new NAME; its NAME.node.yaml entry listed "
        "in server.control.admins); required with --server",
    )
    parser.add_argument(
        "--ca", type=Path, metavar="CA.pem", help="verify the server's TLS certificate with this CA"
    )
    parser.add_argument(
        "--tls", action="store_true", help="connect over TLS, trusting the system's CAs"
    )


def _add_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        default=None,
        metavar="URL",
        help=f"database URL (default: $GEOFL_DB or {DEFAULT_DB})",
    )


def add_arguments(
    add_parser: Callable[..., argparse.ArgumentParser],
    offline: Sequence[argparse.ArgumentParser],
) -> None:
    """Add ``--server`` to the ``offline`` actions (list, show), and the new actions with
    ``add_parser`` (``geofl runs``' subparsers' ``add_parser``)."""
    for parser in offline:
        _add_server(parser)
    stop = add_parser(
        "stop",
        help="stop a live run after its current round (status cancelled)",
        description="Cancel a run cleanly: its current round ends, its clients are told the "
        "run is over, and it is recorded as cancelled.",
    )
    stop.add_argument("run_id", type=int, metavar="RUN_ID")
    stop.add_argument("--reason", default="", help="why, for the run's events")
    _add_server(stop, required=True)
    logs = add_parser(
        "logs",
        help="a run's events; --follow streams new ones until the run ends",
        description="Print a run's events (lifecycle, rounds, security, Flower).",
    )
    logs.add_argument("run_id", type=int, metavar="RUN_ID")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new events until it ends"
    )
    logs.add_argument("--json", action="store_true", help="one JSON object per line")
    pull = add_parser(
        "pull",
        help="write a round's model as safetensors and as a PyTorch state_dict",
        description="Write OUT.safetensors and OUT.pt (torch.save of the state_dict; load "
        "it with torch.load(path, weights_only=True)).",
    )
    pull.add_argument("run_id", type=int, metavar="RUN_ID")
    pull.add_argument(
        "--round", type=int, default=None, help="the round (default: the newest committed)"
    )
    pull.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="STEM",
        help="output path without suffix (default: run<ID>-round<N> here)",
    )
    pull.add_argument(
        "--checkpoints",
        type=Path,
        default=None,
        metavar="DIR",
        help="with --db: the run's storage.checkpoints directory",
    )
    dashboard = add_parser(
        "dashboard",
        help="print a one-time login link to the coordinator's dashboard",
        description="Ask the control API for a one-time dashboard login link.",
    )
    _add_server(dashboard, required=True)
    for parser in (logs, pull):
        _add_db(parser)
        _add_server(parser)


# ---------------------------------------------------------------- dispatch


def wants_this(args: argparse.Namespace) -> bool:
    """Whether ``args`` is for this module (else ``geofl runs list|show --db``)."""
    return args.runs_command in REMOTE_ACTIONS or getattr(args, "server", None) is not None


def run_runs(args: argparse.Namespace) -> int:
    """Run one ``geofl runs`` action; the exit code."""
    if not wants_this(args):
        return run_inspect(args)
    console = Console(width=None if sys.stdout.isatty() else 200)
    from geofl.protocols.identity import KeyFileError
    from geofl.server.control.client import ControlError

    try:
        if args.server is not None:
            return _remote(args, console)
        return _offline(args, console)
    except ControlError as exc:
        return _error(str(exc), _control_code(exc))
    except KeyFileError as exc:
        return _error(str(exc), ExitCode.CREDENTIALS)
    except (StorageUnavailableError, DatabaseURLError) as exc:
        return _error(str(exc), ExitCode.STORAGE_UNAVAILABLE)
    except (RecordNotFoundError, CheckpointCorruptError) as exc:
        return _error(str(exc), ExitCode.USAGE)
    except ModuleNotFoundError as exc:  # torch, for pull's state_dict file
        return _error(
            f"{exc.name} is not installed: pip install 'geofl[torch]' to write the .pt file",
            ExitCode.USAGE,
        )


def _error(message: str, code: ExitCode) -> int:
    print(f"geofl: error: {message}", file=sys.stderr)
    return int(code)


def _control_code(exc: object) -> ExitCode:
    import grpc

    status = getattr(exc, "status", None)
    if status is grpc.StatusCode.UNAVAILABLE or status is grpc.StatusCode.DEADLINE_EXCEEDED:
        return ExitCode.SERVER_UNREACHABLE
    if status in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return ExitCode.IDENTITY_REFUSED
    if status is grpc.StatusCode.UNIMPLEMENTED:
        return ExitCode.PROTOCOL
    return ExitCode.USAGE


# ---------------------------------------------------------------- live server


def _remote(args: argparse.Namespace, console: Console) -> int:
    from geofl.server.control.client import ControlClient

    if args.key is None:
        return _error("--server needs --key ADMIN.key (an admin's private key)", ExitCode.USAGE)
    with ControlClient(args.server, args.key, ca=args.ca, tls=args.tls) as client:
        action = args.runs_command
        if action == "list":
            _print_runs(client.list_runs(), args.json, console)
        elif action == "show":
            report = client.show_run(args.run_id)
            _print_detail(report.detail, report.links, report.events, args.json, console)
        elif action == "stop":
            first, status = client.stop_run(args.run_id, args.reason)
            print(
                f"run {args.run_id}: stop "
                + ("requested" if first else "was already requested")
                + f"; it ends after its current round (status now {status})"
            )
        elif action == "logs":
            _print_events(client.events(args.run_id, follow=args.follow), args.json)
        elif action == "pull":
            model = client.pull(args.run_id, args.round)
            _write_model(args, model.round, model.data)
        else:
            link, ttl_s = client.dashboard_link()
            print(link)
            print(f"(one-time link, valid {ttl_s:.0f} s)", file=sys.stderr)
    return int(ExitCode.OK)


# ---------------------------------------------------------------- database


def _offline(args: argparse.Namespace, console: Console) -> int:
    action = args.runs_command
    if action in ("stop", "dashboard"):  # pragma: no cover - argparse requires --server
        return _error(f"runs {action} needs --server", ExitCode.USAGE)
    url = database_url(args.db)
    if action == "logs":
        _print_events(_database_events(url, args.run_id, args.follow), args.json)
        return int(ExitCode.OK)
    if args.checkpoints is None:
        return _error(
            "runs pull --db needs --checkpoints DIR (the run's storage.checkpoints)",
            ExitCode.USAGE,
        )
    from geofl.server.control.models import checkpoint_for, export_model

    with open_recorded_database(url) as db, db.session() as session:
        number, record = checkpoint_for(session, args.run_id, args.round)
    model = export_model(CheckpointStore(args.checkpoints), args.run_id, number, record)
    _write_model(args, model.round, model.data)
    return int(ExitCode.OK)


def _database_events(url: str, run_id: int, follow: bool) -> Iterator[EventRecord]:
    """The run's events from the database; with ``follow``, until it stops running."""
    after = 0
    with open_recorded_database(url) as db:
        while True:
            with db.session() as session:
                status = queries.get_run(session, run_id).status
                page = queries.events_of(session, run_id, after_id=after)
            for event in page:
                yield event
                after = event.id
            if not follow or status != RunStatus.RUNNING.value:
                return
            time.sleep(_FOLLOW_POLL_S)


# ---------------------------------------------------------------- output


def _print_runs(runs: list[RunSummary], as_json: bool, console: Console) -> None:
    if as_json:
        print(json.dumps([r.to_dict() for r in runs], indent=2))
    else:
        console.print(runs_table(runs))


def _print_detail(
    detail: RunDetail,
    links: Sequence[NodeMeasurementRecord],
    events: Sequence[EventRecord],
    as_json: bool,
    console: Console,
) -> None:
    if as_json:
        shown = {
            **detail.to_dict(),
            "links": [m.to_dict() for m in links],
            "events": [e.to_dict() for e in events],
        }
        print(json.dumps(shown, indent=2))
        return
    for table in detail_tables(detail, links, events):
        console.print(table)


def _print_events(events: Iterable[EventRecord], as_json: bool) -> None:
    for event in events:
        print(json.dumps(event.to_dict()) if as_json else event_line(event), flush=True)


def _write_model(args: argparse.Namespace, number: int, data: bytes) -> None:
    from geofl.server.control.models import write_model_files

    stem = args.out or Path(f"run{args.run_id}-round{number}")
    tensors, state_dict = write_model_files(data, stem)
    print(f"run {args.run_id} round {number}: wrote {tensors} and {state_dict}")
