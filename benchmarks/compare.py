"""The comparison: one named workload on Flower 1.42 and on geofl, both runtimes, repeated.

Usage::

    python -m benchmarks.compare --workload mlp-digits --repeats 3 \\
        --modes deployment,simulation [--rounds 5] [--systems flower,geofl] \\
        [--geofl-sim pooled=false --geofl-sim client_threads=0]
    python -m benchmarks.compare --list

Modes:

* ``deployment``: real processes on loopback. Flower: ``flower-superlink`` + one
  ``flower-supernode`` per client; geofl: ``geofl server`` + one ``geofl client`` per
  client. Clients reach the server through :mod:`benchmarks.byteproxy`.
* ``simulation``: each framework's own simulation. Flower: a ``--simulation`` SuperLink with
  the Ray backend (one CPU per virtual client); geofl: ``geofl simulate`` (the coordinator
  plus its client worker processes, one per core, each running several clients, over
  loopback gRPC, no proxy; ``--geofl-sim pooled=false`` gives one process per client).

Every (repeat, mode, system) case is one :func:`benchmarks.harness.run_case`, run under
the shared heavy-work lock (:func:`benchmarks.core.heavy_lock`; ``--no-lock`` when the
whole command already runs under ``flock`` on it); systems alternate within a repeat so
both see the same host load. Per case: seconds per steady
round (median of rounds 2..R; round 1 carries start-up), bytes per steady round,
peak RSS of the server and of one client, peak RSS of everything, and the final model's
test accuracy for training tasks. The table shows medians over the successful repeats and
geofl/Flower ratios; the JSON (rewritten after every case) holds every case.

What "bytes" and "one client" mean differs by mode, because the runtimes differ:

* deployment: bytes = every byte through the proxy (payload, framing, polls, heartbeats);
  server = the server's process tree (Flower: SuperLink + SuperExec + ServerApp); one
  client = the largest site's tree (Flower: SuperNode + SuperExec + ClientApp processes).
* simulation: bytes = the system's own payload count, as there is no network hop to
  measure (geofl: encoded model and update bytes from its database; Flower: serialized
  arrays of the messages the ServerApp sent and aggregated); server = the ``geofl
  simulate`` process / SuperLink + SuperExec + ``flwr-simulation``; one client = the
  largest geofl client process / the largest Ray ``ClientAppActor`` (each serves many
  virtual clients). Ray's own daemons count only in "all".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from benchmarks.core import REPO_ROOT, System, heavy_lock
from benchmarks.flower_system import FlowerSimulationSystem, FlowerSystem
from benchmarks.geofl_system import (
    GeoflSimulationSystem,
    GeoflSystem,
    add_geofl_set_option,
    check_geofl_set,
)
from benchmarks.harness import run_case
from benchmarks.workloads import WORKLOADS, NamedWorkload, get_workload
from geofl.server.config.errors import ConfigError

__all__ = [
    "METRICS",
    "MODES",
    "SYSTEM_NAMES",
    "build_report",
    "case_metrics",
    "main",
    "make_system",
    "parse_settings",
    "render_markdown",
    "run_comparison",
    "scrub_paths",
    "summarize",
]

#: Mode -> system name -> factory.
MODES: dict[str, dict[str, Callable[[], System]]] = {
    "deployment": {"flower": FlowerSystem, "geofl": GeoflSystem},
    "simulation": {"flower": FlowerSimulationSystem, "geofl": GeoflSimulationSystem},
}
#: Systems in the order they run and are shown; ratios are ``geofl / flower``.
SYSTEM_NAMES = ("flower", "geofl")
#: Metric key -> (column header, number format).
METRICS: dict[str, tuple[str, str]] = {
    "round_s": ("s/round (steady)", ".3g"),
    "up_mb": ("MB/round up", ".3f"),
    "down_mb": ("MB/round down", ".3f"),
    "server_rss_mb": ("peak RSS server MB", ".0f"),
    "client_rss_mb": ("peak RSS one client MB", ".0f"),
    "total_rss_mb": ("peak RSS all MB", ".0f"),
    "accuracy": ("accuracy", ".4f"),
}
_LABELS = {"flower": "Flower 1.42", "geofl": "geofl"}
#: The proxy's sampling period: fine enough to attribute bytes to geofl's sub-second rounds.
PROXY_INTERVAL_S = 0.01
_MB = 1e6


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _steady(values: Sequence[Any]) -> list[Any]:
    """Rounds 2..R: round 1 includes process start-up and connection set-up."""
    return list(values[1:])


def _system_bytes_mb(record: Mapping[str, Any], index: int) -> list[float | None]:
    rows = _steady(record.get("system_round_bytes") or [])
    return [None if row[index] is None else row[index] / _MB for row in rows]


def case_metrics(record: Mapping[str, Any], mode: str) -> dict[str, float | None]:
    """The comparison's metrics of one successful case record (see the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {sorted(MODES)}")
    roles = record.get("peak_rss_roles_mb") or {}
    if mode == "deployment":
        up = _median(_steady(record.get("proxy_up_mb_per_round") or []))
        down = _median(_steady(record.get("proxy_down_mb_per_round") or []))
        server, client = record.get("peak_rss_server_mb"), record.get("peak_rss_client_site_mb")
    else:
        up, down = _median(_system_bytes_mb(record, 0)), _median(_system_bytes_mb(record, 1))
        server, client = roles.get("server"), roles.get("client")
    return {
        "round_s": _median(_steady(record.get("round_s") or [])),
        "up_mb": up,
        "down_mb": down,
        "server_rss_mb": server,
        "client_rss_mb": client,
        "total_rss_mb": record.get("peak_rss_total_mb"),
        "accuracy": record.get("accuracy"),
    }


def summarize(cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (mode, system): medians over successful repeats, then geofl/Flower ratios.

    A ratio is None where either side has no value: never an invented number.
    """
    rows: list[dict[str, Any]] = []
    for mode in MODES:
        medians: dict[str, dict[str, Any]] = {}
        for system in SYSTEM_NAMES:
            group = [c for c in cases if c["mode"] == mode and c["system"] == system]
            if not group:
                continue
            good = [case_metrics(c, mode) for c in group if c.get("ok")]
            row: dict[str, Any] = {"mode": mode, "system": system, "kind": "median"}
            row["repeats_ok"], row["repeats"] = len(good), len(group)
            row |= {key: _median([m[key] for m in good]) for key in METRICS}
            medians[system] = row
            rows.append(row)
        if set(SYSTEM_NAMES) <= set(medians):
            flower, geofl = medians["flower"], medians["geofl"]
            ratio: dict[str, Any] = {"mode": mode, "system": "geofl/flower", "kind": "ratio"}
            for key in METRICS:
                g, f = geofl[key], flower[key]
                ratio[key] = g / f if g is not None and f else None
            rows.append(ratio)
    return rows


def _cell(value: object, spec: str) -> str:
    if value is None:
        return "\u2013"  # en dash, as in the README tables
    return format(value, spec) if isinstance(value, int | float) else str(value)


def render_markdown(report: Mapping[str, Any]) -> str:
    """The summary as a Markdown table with a heading and a note on what bytes mean."""
    spec = report["workload"]
    settings = report["settings"]
    heading = (
        f"**{spec['name']}**: {spec['clients']} clients, {spec['params']:,} params, "
        f"{settings['rounds']} rounds (steady = rounds 2\u2013{settings['rounds']}), "
        f"medians of {settings['repeats']} repeat(s)"
    )
    header = ["mode", "system", "ok", *(label for label, _ in METRICS.values())]
    lines = [heading, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in report["summary"]:
        is_ratio = row["kind"] == "ratio"
        name = "**geofl / Flower**" if is_ratio else _LABELS.get(row["system"], row["system"])
        ok = "" if is_ratio else f"{row['repeats_ok']}/{row['repeats']}"
        cells = [_cell(row[k], ".3f" if is_ratio else fmt) for k, (_, fmt) in METRICS.items()]
        lines.append("| " + " | ".join([row["mode"], name, ok, *cells]) + " |")
    lines += [
        "",
        "Bytes: deployment = all bytes through the proxy between clients and server; "
        "simulation = the system's own payload count (geofl: encoded model/update bytes; "
        "Flower: serialized arrays sent and aggregated by the ServerApp), no network.",
    ]
    return "\n".join(lines) + "\n"


def scrub_paths(value: Any) -> Any:
    """``value`` with this machine's temporary directory and repository root in every string
    replaced by ``$TMPDIR`` and ``.``: results files are committed and must not carry
    machine paths (the console output keeps them, for finding logs)."""
    if isinstance(value, str):
        return value.replace(str(REPO_ROOT), ".").replace(tempfile.gettempdir(), "$TMPDIR")
    if isinstance(value, dict):
        return {key: scrub_paths(item) for key, item in value.items()}
    if isinstance(value, list):
        return [scrub_paths(item) for item in value]
    return value


def build_report(
    named: NamedWorkload, cases: list[dict[str, Any]], settings: Mapping[str, Any]
) -> dict[str, Any]:
    """The JSON document: workload, settings, host, every case, the summary rows."""
    return {
        "benchmark": "compare",
        "created_unix": time.time(),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "workload": {
            "name": named.name,
            "task": named.task,
            "params": named.params,
            "clients": named.clients,
            "description": named.description,
        },
        "settings": dict(settings),
        "cases": scrub_paths(cases),
        "summary": summarize(cases),
    }


def make_system(
    mode: str,
    system: str,
    geofl_simulation: Mapping[str, object],
    geofl_overrides: Sequence[str] = (),
) -> System:
    """The system of one case; geofl's simulation gets the ``--geofl-sim`` settings, and
    both geofl systems the ``--geofl-set`` overrides of their run file."""
    if mode == "simulation" and system == "geofl":
        return GeoflSimulationSystem(geofl_simulation, geofl_overrides)
    if system == "geofl":
        return GeoflSystem(geofl_overrides)
    return MODES[mode][system]()


def parse_settings(items: Sequence[str]) -> dict[str, object]:
    """``["pooled=false", "client_threads=0"]`` -> ``{"pooled": False, "client_threads": 0}``.

    Values are read as YAML scalars, as geofl's ``--set`` reads them.
    """
    settings: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--geofl-sim {item!r} is not KEY=VALUE")
        settings[key.strip()] = yaml.safe_load(value)
    return settings


def run_comparison(
    named: NamedWorkload,
    modes: Sequence[str],
    systems: Sequence[str] = SYSTEM_NAMES,
    repeats: int = 1,
    rounds: int | None = None,
    timeout_s: float | None = None,
    keep_workdirs: bool = False,
    max_rss_bytes: int | None = None,
    on_case: Callable[[list[dict[str, Any]]], None] | None = None,
    lock: bool = False,
    geofl_simulation: Mapping[str, object] | None = None,
    geofl_overrides: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Run every (repeat, mode, system) case; ``on_case`` sees the list after each one.

    ``lock``: hold the shared heavy-work lock during each case (not across the whole
    comparison, so other people's work can run between cases). ``geofl_simulation``:
    settings added to the ``simulation`` section of geofl's simulation runs;
    ``geofl_overrides``: ``KEY.PATH=VALUE`` overrides of every geofl run file.
    """
    unknown = [m for m in modes if m not in MODES] + [s for s in systems if s not in SYSTEM_NAMES]
    if unknown or repeats < 1:
        raise ValueError(f"unknown modes/systems {unknown} or repeats {repeats} < 1")
    workload = named.workload(rounds, timeout_s)
    cases: list[dict[str, Any]] = []
    for repeat in range(repeats):
        for mode in modes:
            for system in systems:
                with heavy_lock() if lock else contextlib.nullcontext():
                    record = run_case(
                        make_system(mode, system, geofl_simulation or {}, geofl_overrides),
                        workload,
                        keep_workdirs,
                        max_rss_bytes,
                        PROXY_INTERVAL_S,
                    )
                record |= {"workload": named.name, "mode": mode, "repeat": repeat}
                cases.append(record)
                if on_case is not None:
                    on_case(cases)
    return cases


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="geofl vs Flower 1.42 on a named workload")
    parser.add_argument("--workload", help=f"one of: {', '.join(sorted(WORKLOADS))}")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", type=_csv, default=list(MODES), help="deployment,simulation")
    parser.add_argument("--systems", type=_csv, default=list(SYSTEM_NAMES), help="flower,geofl")
    parser.add_argument("--rounds", type=int, default=None, help="default: the workload's")
    parser.add_argument("--timeout", type=float, default=None, help="per run, seconds")
    parser.add_argument("--out", type=Path, default=None, help="default: results/compare_NAME.json")
    parser.add_argument("--keep-workdirs", action="store_true", help="keep logs of good runs")
    parser.add_argument("--max-rss-gb", type=float, default=16.0, help="memory brake per run")
    parser.add_argument(
        "--geofl-sim",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the simulation section of geofl's simulation runs, e.g. "
        "pooled=false or client_threads=0 (repeatable)",
    )
    add_geofl_set_option(parser)
    parser.add_argument(
        "--no-lock",
        action="store_true",
        help="do not take the shared heavy-work lock around each run (use when started "
        "under `flock` on that lock already)",
    )
    args = parser.parse_args(argv)
    if not args.list and not args.workload:
        parser.error("--workload is required (or --list)")
    bad = [m for m in args.modes if m not in MODES] + [
        s for s in args.systems if s not in SYSTEM_NAMES
    ]
    if bad:
        parser.error(
            f"unknown mode(s)/system(s) {bad}; modes {list(MODES)}, systems {SYSTEM_NAMES}"
        )
    if args.repeats < 1 or (args.rounds is not None and args.rounds < 2):
        parser.error("--repeats must be >= 1 and --rounds >= 2 (round 1 is start-up)")
    try:
        args.geofl_sim = parse_settings(args.geofl_sim)
    except (ValueError, ConfigError) as exc:
        parser.error(str(exc))
    check_geofl_set(parser, args)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Run the comparison, write the JSON after every case, print the Markdown table."""
    args = _parse_args(argv)
    if args.list:
        for named in WORKLOADS.values():
            print(f"{named.name}: {named.description}")
        return
    try:
        named = get_workload(args.workload)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    out = args.out or Path(__file__).resolve().parent / "results" / f"compare_{named.name}.json"
    settings = {
        "modes": args.modes,
        "systems": args.systems,
        "repeats": args.repeats,
        "rounds": args.rounds or named.rounds,
        "max_rss_gb": args.max_rss_gb,
        "geofl_simulation": args.geofl_sim,
        "geofl_overrides": args.geofl_set,
    }

    def save(cases: list[dict[str, Any]]) -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(build_report(named, cases, settings), indent=2) + "\n")
        last = cases[-1]
        print(
            f"{last['mode']} {last['system']} repeat {last['repeat'] + 1}: ok={last['ok']} "
            f"rounds={[round(t, 3) for t in last.get('round_s', [])]} {last.get('error', '')}",
            flush=True,
        )

    cases = run_comparison(
        named,
        args.modes,
        args.systems,
        args.repeats,
        args.rounds,
        args.timeout,
        args.keep_workdirs,
        int(args.max_rss_gb * 1e9),
        save,
        lock=not args.no_lock,
        geofl_simulation=args.geofl_sim,
        geofl_overrides=args.geofl_set,
    )
    print(render_markdown(build_report(named, cases, settings)))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
