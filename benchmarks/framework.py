"""Framework-overhead benchmark: geofl vs Flower as real loopback deployments.

Workload: ``--clients`` clients that return the model plus a client-specific constant (no
training, every update distinct), a float32 model of each ``--params`` size, ``--rounds``
rounds. Reported per system and size: median seconds per round, proxy-counted MB per round
up and down, peak RSS of the server side and of the largest client site, the loopback
bound (moving the same bytes over plain TCP), and geofl/Flower ratios.

Usage::

    python -m benchmarks.framework --systems flower,geofl --params 1000000,10000000 \\
        --clients 10 --rounds 5 --repeats 1 --out benchmarks/results/framework.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.core import System, Workload
from benchmarks.flower_system import FlowerSystem
from benchmarks.geofl_system import GeoflSystem, add_geofl_set_option, check_geofl_set
from benchmarks.harness import run_case
from benchmarks.loopback_bound import measure_loopback

__all__ = ["SYSTEMS", "build_report", "main", "medians", "parse_int_list", "ratios"]

#: Systems selectable with ``--systems``.
SYSTEMS: dict[str, Callable[[], System]] = {"flower": FlowerSystem, "geofl": GeoflSystem}
_RATIO_KEYS = (
    "median_round_s",
    "median_up_mb",
    "median_down_mb",
    "peak_rss_server_mb",
    "peak_rss_client_site_mb",
)


def parse_int_list(text: str) -> list[int]:
    """``"1000000,10000000"`` -> ``[1000000, 10000000]``; underscores allowed."""
    try:
        values = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text!r}") from exc
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers: {text!r}")
    return values


def _median_of_repeats(records: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if r.get("ok") and r.get(key) is not None]
    return statistics.median(values) if values else None


def ratios(cases: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """geofl / Flower for each model size and metric, from the medians over repeats.

    A ratio is None where either side has no successful value, never a made-up number.
    """
    out = []
    for params in sorted({c["params"] for c in cases}):
        by_system = {
            name: [c for c in cases if c["params"] == params and c["system"] == name]
            for name in ("geofl", "flower")
        }
        row: dict[str, Any] = {"params": params}
        for key in _RATIO_KEYS:
            g = _median_of_repeats(by_system["geofl"], key)
            f = _median_of_repeats(by_system["flower"], key)
            row[key] = g / f if g is not None and f else None
        out.append(row)
    return out


def medians(
    cases: Sequence[dict[str, Any]], bounds: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per (system, size): the median over successful repeats of every ratio metric.

    ``round_s_over_loopback`` divides the median s/round by the loopback bound of the same
    size (None without a bound): how close a framework gets to moving bare bytes.
    """
    bound = {b["params"]: b["median_s"] for b in bounds if b.get("ok")}
    out = []
    for system, params in sorted({(c["system"], c["params"]) for c in cases}):
        group = [c for c in cases if c["system"] == system and c["params"] == params]
        row: dict[str, Any] = {"system": system, "params": params}
        row["repeats_ok"] = sum(1 for c in group if c.get("ok"))
        row["repeats"] = len(group)
        for key in _RATIO_KEYS:
            row[key] = _median_of_repeats(group, key)
        per_round, limit = row["median_round_s"], bound.get(params)
        row["round_s_over_loopback"] = per_round / limit if per_round and limit else None
        out.append(row)
    return out


def build_report(
    cases: list[dict[str, Any]], bounds: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    """The JSON document written to ``--out``."""
    return {
        "benchmark": "framework-overhead",
        "created_unix": time.time(),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "settings": {
            "systems": args.systems,
            "clients": args.clients,
            "rounds": args.rounds,
            "repeats": args.repeats,
            "max_rss_gb": args.max_rss_gb,
            "wire_proxy": not getattr(args, "direct", False),
            "geofl_overrides": getattr(args, "geofl_set", []),
        },
        "cases": cases,
        "medians_over_repeats": medians(cases, bounds),
        "loopback_bound": bounds,
        "ratios_geofl_over_flower": ratios(cases),
    }


def _fmt(value: object, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(report: dict[str, Any], console: Console) -> None:
    """One row per case, the loopback bound, and the ratios."""
    table = Table(title="framework overhead (median over rounds; MB = 1e6 bytes)")
    for col in ("system", "params", "ok", "s/round", "up MB", "down MB", "server MB"):
        table.add_column(col)
    for col in ("site MB", "load 1m", "rounds s"):
        table.add_column(col)
    for c in report["cases"]:
        table.add_row(
            c["system"],
            f"{c['params']:,}",
            "yes" if c["ok"] else f"NO: {c.get('error', '')[:60]}",
            _fmt(c.get("median_round_s")),
            _fmt(c.get("median_up_mb")),
            _fmt(c.get("median_down_mb")),
            _fmt(c.get("peak_rss_server_mb"), ".0f"),
            _fmt(c.get("peak_rss_client_site_mb"), ".0f"),
            f"{c['load_before'][0]:.1f}->{c['load_after'][0]:.1f}",
            " ".join(f"{t:.1f}" for t in c.get("round_s", [])),
        )
    for b in report["loopback_bound"]:
        ok = "yes" if b["ok"] else f"NO: {b.get('error', '')[:60]}"
        table.add_row("loopback", f"{b['params']:,}", ok, _fmt(b["median_s"], ".3f"))
    console.print(table)
    for m in report["medians_over_repeats"]:
        console.print(
            f"{m['system']} {m['params']:,}: median over {m['repeats_ok']}/{m['repeats']} "
            f"repeats {_fmt(m['median_round_s'], '.3f')} s/round "
            f"= {_fmt(m['round_s_over_loopback'])} x loopback bound"
        )
    for r in report["ratios_geofl_over_flower"]:
        parts = ", ".join(f"{k}={_fmt(r[k], '.3f')}" for k in _RATIO_KEYS)
        console.print(f"geofl/Flower at {r['params']:,} params: {parts}")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="geofl vs Flower framework overhead")
    parser.add_argument("--systems", default="flower", help="comma list: flower,geofl")
    parser.add_argument("--params", type=parse_int_list, default=[1_000_000])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900.0, help="per case, seconds")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/framework.json"))
    parser.add_argument("--no-loopback", action="store_true", help="skip the loopback bound")
    parser.add_argument("--keep-workdirs", action="store_true", help="keep logs of good runs")
    parser.add_argument(
        "--direct",
        action="store_true",
        help="clients dial the server directly, without the byte-counting proxy (its copies "
        "share the cores; the loopback bound has none): no proxy MB, the systems' own counts",
    )
    add_geofl_set_option(parser)
    parser.add_argument(
        "--max-rss-gb",
        type=float,
        default=16.0,
        help="kill a deployment whose processes together pass this resident memory (GB)",
    )
    args = parser.parse_args(argv)
    check_geofl_set(parser, args)
    unknown = [s for s in args.systems.split(",") if s not in SYSTEMS]
    if unknown:
        parser.error(f"unknown system(s) {unknown}; choose from {sorted(SYSTEMS)}")
    return args


def _loopback_record(workload: Workload, rounds: int) -> dict[str, Any]:
    """The loopback bound for a workload; an error is recorded, not raised."""
    try:
        times = measure_loopback(workload.model_bytes, workload.clients, rounds)
    except (OSError, RuntimeError) as exc:
        return {"params": workload.params, "ok": False, "error": str(exc), "median_s": None}
    return {
        "params": workload.params,
        "ok": True,
        "round_s": times,
        "median_s": statistics.median(times),
    }


def _write(report: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    """Run every (size, system, repeat) case, then the loopback bounds; write JSON.

    The JSON is rewritten after every case, so a crash or a kill keeps what was measured.
    """
    args = _parse_args(argv)
    console = Console(width=160)
    cases: list[dict[str, Any]] = []
    bounds: list[dict[str, Any]] = []
    for params in args.params:
        workload = Workload(params, args.clients, args.rounds, args.timeout)
        for repeat in range(args.repeats):
            for name in args.systems.split(","):
                console.print(f"[bold]{name}[/bold] {params:,} params, repeat {repeat + 1}")
                limit = int(args.max_rss_gb * 1e9)
                system = GeoflSystem(args.geofl_set) if name == "geofl" else SYSTEMS[name]()
                record = run_case(
                    system, workload, args.keep_workdirs, limit, wire_proxy=not args.direct
                )
                record["repeat"] = repeat
                cases.append(record)
                _write(build_report(cases, bounds, args), args.out)
                console.print(f"  ok={record['ok']} median={record.get('median_round_s')}")
        if not args.no_loopback:
            bounds.append(_loopback_record(workload, max(args.rounds, 3)))
            _write(build_report(cases, bounds, args), args.out)
    print_table(build_report(cases, bounds, args), console)
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
