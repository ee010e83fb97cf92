"""Run one system on one workload and measure it the same way for every system.

Per case: a fresh work directory, a byte-counting proxy between clients and server, a
memory sampler over every process the system starts, the machine's load average before and
after (the benchmark host is shared, and load changes round times), and cleanup of every
process by PID whatever happens.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.core import (
    REPO_ROOT,
    SERVER_GROUP,
    BenchmarkError,
    MemoryRole,
    RunContext,
    System,
    SystemRun,
    Workload,
    free_port,
    stop_tree,
    wait_for_port,
)
from benchmarks.metrics import ByteSample, median_or_none, proxy_bytes_per_round
from benchmarks.procmon import GroupPeaks, ProcessMonitor, ProcSample, peak_rss_of_kinds

__all__ = [
    "read_byte_samples",
    "role_peaks_mb",
    "run_case",
    "summarize_case",
    "write_rss_timeline",
]

_MB = 1e6


def read_byte_samples(path: Path) -> list[ByteSample]:
    """Parse the proxy's JSON-lines counter samples."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [ByteSample(float(r["t"]), int(r["up"]), int(r["down"])) for r in rows]


def write_rss_timeline(monitor: ProcessMonitor, path: Path) -> None:
    """Save the summed RSS of each group at each sample (JSON lines): when did the peak come?"""
    sums: dict[tuple[float, str], int] = {}
    for sample in monitor.samples:
        sums[(sample.t, sample.group)] = sums.get((sample.t, sample.group), 0) + sample.rss
    with path.open("w", encoding="utf-8") as out:
        for (t, group), rss in sorted(sums.items()):
            out.write(json.dumps({"t": t, "group": group, "rss": rss}) + "\n")


def _site_peaks(peaks: dict[str, GroupPeaks]) -> dict[str, Any]:
    sites = {name: p for name, p in peaks.items() if name.startswith("site-")}
    if not sites:
        return {"peak_rss_client_site_mb": None, "client_site_rss_by_kind_mb": {}}
    worst = max(sites.values(), key=lambda p: p.peak_sum_rss)
    kinds: dict[str, int] = {}
    for site in sites.values():
        for kind, rss in site.peak_rss_by_kind.items():
            kinds[kind] = max(kinds.get(kind, 0), rss)
    return {
        "peak_rss_client_site_mb": worst.peak_sum_rss / _MB,
        "client_site_rss_by_kind_mb": {k: v / _MB for k, v in sorted(kinds.items())},
    }


def _failed_peaks(peaks: dict[str, GroupPeaks]) -> dict[str, Any]:
    """Memory peaks up to the failure: how far a deployment got matters (e.g. out of memory)."""
    server = peaks.get(SERVER_GROUP)
    return {
        "peak_rss_server_mb": server.peak_sum_rss / _MB if server else None,
        **_site_peaks(peaks),
    }


def role_peaks_mb(
    samples: Sequence[ProcSample], roles: Mapping[str, MemoryRole]
) -> dict[str, float | None]:
    """Peak RSS (MB) of each role; None for a role none of whose processes was seen."""
    out: dict[str, float | None] = {}
    for name, role in roles.items():
        peak = peak_rss_of_kinds(samples, role.kinds, role.per_process)
        out[name] = peak / _MB if peak else None
    return out


def summarize_case(
    system: str,
    workload: Workload,
    run: SystemRun,
    samples: list[ByteSample],
    peaks: dict[str, GroupPeaks],
    roles_mb: Mapping[str, float | None] | None = None,
) -> dict[str, Any]:
    """The JSON record of one completed case (sizes in MB = 10^6 bytes, times in s).

    ``roles_mb``: :func:`role_peaks_mb` for systems that declare memory roles.
    """
    durations = [r.duration_s for r in run.rounds]
    # No samples: no proxy (a simulation), so no wire bytes rather than zero bytes.
    per_round = (proxy_bytes_per_round(samples, run.rounds) or []) if samples else []
    server = peaks.get(SERVER_GROUP, GroupPeaks())
    record: dict[str, Any] = {
        "system": system,
        "task": workload.task,
        "params": workload.params,
        "clients": workload.clients,
        "rounds": workload.rounds,
        "ok": True,
        "round_s": durations,
        "median_round_s": median_or_none(durations),
        "proxy_up_mb_per_round": [u / _MB for u, _ in per_round],
        "proxy_down_mb_per_round": [d / _MB for _, d in per_round],
        "median_up_mb": median_or_none([u / _MB for u, _ in per_round]),
        "median_down_mb": median_or_none([d / _MB for _, d in per_round]),
        "system_bytes": run.system_bytes,
        "system_round_bytes": [[r.bytes_up, r.bytes_down] for r in run.rounds],
        "peak_rss_server_mb": server.peak_sum_rss / _MB if server.pids_seen else None,
        "server_rss_by_kind_mb": {k: v / _MB for k, v in sorted(server.peak_rss_by_kind.items())},
        **_site_peaks(peaks),
        "peak_rss_roles_mb": dict(roles_mb or {}),
        "payload_mb_per_round": workload.clients * workload.model_bytes / _MB,
        "final_shift": run.final_shift,
        "expected_shift": workload.expected_shift(),
        "accuracy": run.accuracy,
        "notes": run.notes,
    }
    expected, shift = workload.expected_shift(), run.final_shift
    if expected is not None and shift is None:
        record["ok"] = False
        record["error"] = "the system did not report the final model's shift"
    elif expected is not None and shift is not None and abs(shift - expected) > 1e-3:
        record["ok"] = False
        record["error"] = (
            f"final model moved by {shift} on average, expected {expected}: "
            "updates were lost or duplicated"
        )
    return record


def _start_proxy(
    workdir: Path, listen: int, target: int, interval_s: float
) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "benchmarks.byteproxy", "--listen", f"127.0.0.1:{listen}"]
    argv += ["--target", f"127.0.0.1:{target}", "--samples", str(workdir / "bytes.jsonl")]
    argv += ["--interval", str(interval_s)]
    log = (workdir / "byteproxy.log").open("wb")
    with log:
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    wait_for_port(listen, timeout_s=30)
    return proc


def _stop_proxy(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        stop_tree(proc.pid)


def run_case(
    system: System,
    workload: Workload,
    keep_workdir: bool = False,
    max_rss_bytes: int | None = None,
    proxy_interval_s: float = 0.1,
    wire_proxy: bool | None = None,
) -> dict[str, Any]:
    """Deploy ``system`` for ``workload``, measure it, always clean up; return its record.

    A failure becomes a record with ``ok: false`` and the error, so one broken case does
    not lose the others' numbers. With ``max_rss_bytes``, the deployment is killed as soon
    as its processes together pass that much resident memory (a failed case). A system
    without ``wire_proxy`` gets no proxy: its clients reach the server directly and
    ``client_port`` equals ``server_port``. ``proxy_interval_s`` is the proxy's sampling
    period: bytes are attributed to rounds at that resolution. ``wire_proxy=False`` runs
    a system that normally has the proxy without it: the proxy's own copies then do not
    share the cores with the system, and wire bytes are left to the system's own counts.
    """
    proxied = system.wire_proxy if wire_proxy is None else wire_proxy and system.wire_proxy
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{system.name}-{workload.params}-"))
    monitor = ProcessMonitor(0.25, max_rss_bytes)
    server_port = free_port()
    client_port = free_port() if proxied else server_port
    ctx = RunContext(workdir, server_port, client_port, monitor)
    load_before = os.getloadavg()
    started = time.monotonic()
    proxy = _start_proxy(workdir, client_port, server_port, proxy_interval_s) if proxied else None
    ctx.monitor.start()
    record: dict[str, Any]
    try:
        run = system.run(workload, ctx)
        peaks = ctx.monitor.stop()
        roles = role_peaks_mb(monitor.samples, system.memory_roles)
        samples = read_byte_samples(workdir / "bytes.jsonl")
        record = summarize_case(system.name, workload, run, samples, peaks, roles)
    except (BenchmarkError, NotImplementedError, OSError, subprocess.SubprocessError) as exc:
        peaks = ctx.monitor.stop()
        record = {"system": system.name, "task": workload.task, "params": workload.params}
        record |= {"ok": False, "clients": workload.clients, "rounds": workload.rounds}
        record |= {"error": str(exc), **_failed_peaks(peaks)}
        record["peak_rss_roles_mb"] = role_peaks_mb(monitor.samples, system.memory_roles)
    finally:
        ctx.stop_all()
        if proxy is not None:
            _stop_proxy(proxy)
    record["wire_proxy"] = proxied
    record["peak_rss_total_mb"] = monitor.peak_total_rss / _MB
    record["wall_s"] = time.monotonic() - started
    record["load_before"] = list(load_before)
    record["load_after"] = list(os.getloadavg())
    record["workdir"] = str(workdir) if keep_workdir or not record["ok"] else None
    if record["workdir"] is None:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        write_rss_timeline(monitor, workdir / "rss.jsonl")
    return record
