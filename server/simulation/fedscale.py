"""Convert FedScale's pickled traces into geofl's JSON trace format, for trusted files.

FedScale publishes ``client_device_capacity`` and ``client_behave_trace`` as pickled dicts
(see :mod:`geofl.server.simulation.traces` for their content). Unpickling runs any code a
file names, so geofl reads only JSON or CSV; this one-off converter is the single place
that unpickles, and only when the user passes ``--trust-pickle``::

    python -m geofl.server.simulation.traces convert \\
        client_device_capacity client_behave_trace trace.json --trust-pickle
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from geofl.server.simulation.trace_format import (
    BEHAVIOUR_FIELDS,
    CAPACITY_FIELDS,
    FORMAT,
    VERSION,
    TraceError,
    TraceSet,
    parse_trace,
)

__all__ = ["convert", "main"]


def _plain(value: object) -> Any:
    """A JSON-safe copy: NumPy scalars become Python numbers, keys strings."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    item = getattr(value, "item", None)
    return item() if callable(item) else value


def _table_kind(table: Mapping[Any, Any], path: Path) -> str:
    """Which FedScale table a pickled dict is, from the fields of its first entry."""
    first = next(iter(table.values()), None)
    if isinstance(first, Mapping) and "computation" in first:
        return "device_capacity"
    if isinstance(first, Mapping) and "active" in first:
        return "behave_trace"
    raise TraceError(
        f"{path}: neither a FedScale capacity trace (entries with 'computation') nor a "
        f"behaviour trace (entries with 'active'); first entry: {first!r:.200}"
    )


def _keep_known(table: Mapping[Any, Any], kind: str) -> tuple[dict[str, Any], set[str]]:
    """The table with only the fields geofl reads, and the names of those dropped."""
    known = CAPACITY_FIELDS if kind == "device_capacity" else BEHAVIOUR_FIELDS
    dropped: set[str] = set()
    kept: dict[str, Any] = {}
    for client, entry in table.items():
        if not isinstance(entry, Mapping):
            kept[str(client)] = _plain(entry)  # rejected, with its client, by parse_trace
            continue
        dropped.update(str(key) for key in entry if key not in known)
        kept[str(client)] = {str(k): _plain(v) for k, v in entry.items() if k in known}
    return kept, dropped


def _unpickle_trusted(path: Path) -> Mapping[Any, Any]:
    import pickle  # only here, behind --trust-pickle: unpickling runs code from the file

    try:
        with path.open("rb") as handle:
            data = pickle.load(handle)
    except OSError:
        raise
    except Exception as exc:  # a damaged pickle fails in many ways; report any of them
        raise TraceError(f"{path}: cannot unpickle: {type(exc).__name__}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise TraceError(
            f"{path}: expected a pickled dict of client id to entry, got {type(data).__name__}"
        )
    return data


def convert(inputs: Sequence[Path], output: Path) -> TraceSet:
    """Merge trusted FedScale pickles into one geofl JSON trace at ``output``.

    Each input is a capacity or a behaviour table (told apart by its entries' fields); the
    result is validated with :func:`parse_trace` before it is written.

    Raises
    ------
    TraceError
        If an input is neither table, two inputs are the same table, or an entry is invalid.
    """
    if output.suffix.lower() != ".json":
        raise TraceError(f"{output}: the output must be a .json file")
    document: dict[str, Any] = {"format": FORMAT, "version": VERSION}
    for path in inputs:
        table = _unpickle_trusted(path)
        kind = _table_kind(table, path)
        if kind in document:
            raise TraceError(f"{path}: a second {kind} table; give at most one of each")
        document[kind], dropped = _keep_known(table, kind)
        if dropped:
            print(f"{path}: dropped fields geofl does not read: {sorted(dropped)}", file=sys.stderr)
    trace = parse_trace(document, str(output))
    output.write_text(json.dumps(document, separators=(",", ":")), encoding="utf-8")
    return trace


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m geofl.server.simulation.traces",
        description="Tools for client traces in FedScale's content.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    conv = commands.add_parser(
        "convert",
        help="convert FedScale's pickled traces to geofl's JSON",
        description="Convert FedScale's pickled client_device_capacity and/or "
        "client_behave_trace into one JSON trace. Unpickling runs any code the file names: "
        "convert only files you trust, and say so with --trust-pickle.",
    )
    conv.add_argument("inputs", nargs="+", type=Path, help="pickled FedScale trace(s)")
    conv.add_argument("output", type=Path, help="JSON file to write")
    conv.add_argument(
        "--trust-pickle",
        action="store_true",
        help="confirm that the inputs come from a source you trust",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``convert IN.pkl [IN.pkl] OUT.json --trust-pickle``; returns the exit code."""
    args = _parser().parse_args(argv)
    if not args.trust_pickle:
        print(
            "refusing to unpickle: a pickle can run arbitrary code when loaded. If the files "
            "come from a source you trust (e.g. FedScale's published traces), add "
            "--trust-pickle.",
            file=sys.stderr,
        )
        return 2
    print(
        "warning: unpickling " + ", ".join(map(str, args.inputs)) + "; this runs any code "
        "they contain, so do it only for files you trust",
        file=sys.stderr,
    )
    try:
        trace = convert(args.inputs, args.output)
    except (TraceError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"wrote {args.output}: {len(trace.capacities)} capacity and "
        f"{len(trace.behaviours)} availability entries"
    )
    return 0
