"""Peak memory of the process trees a benchmark started, sampled with psutil.

Frameworks spread one logical role over many OS processes (Flower: a SuperLink, its
SuperExec and a ServerApp process; per site a SuperNode, a SuperExec and one short-lived
ClientApp process per message). Comparing single processes would flatter whichever
framework splits more, so memory is summed per *group* (the server side; one client site)
over the whole tree under each root PID, sampled every ``interval_s`` seconds. Very short
spikes between samples can be missed; RSS counts shared pages in every process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

import psutil

__all__ = [
    "GroupPeaks",
    "ProcSample",
    "ProcessMonitor",
    "classify_cmdline",
    "kill_trees",
    "peak_rss_of_kinds",
    "sample_once",
    "summarize",
]

#: (substring of the command line, kind); first match wins, so specific names come first.
#: Ray's processes (Flower's simulation backend) appear by their process titles
#: (``ray::ClientAppActor``, ``ray::IDLE``) or their executables' and scripts' base names.
_KINDS: tuple[tuple[str, str], ...] = (
    ("flwr-serverapp", "serverapp"),
    ("flwr-clientapp", "clientapp"),
    ("flwr-simulation", "simulation"),
    ("flower-superexec", "superexec"),
    ("flower-superlink", "superlink"),
    ("flower-supernode", "supernode"),
    ("benchmarks.byteproxy", "byteproxy"),
    ("geofl server", "geofl-server"),
    ("geofl simulate", "geofl-simulate"),
    ("geofl client", "geofl-client"),
    ("-m geofl.client", "geofl-client"),
    ("ray::ClientAppActor", "ray-actor"),
    ("ray::", "ray-infra"),
    ("default_worker.py", "ray-infra"),
    ("gcs_server", "ray-infra"),
    ("raylet", "ray-infra"),
    ("dashboard.py", "ray-infra"),
    ("monitor.py", "ray-infra"),
)


def classify_cmdline(cmdline: Iterable[str]) -> str:
    """Name the kind of a process from its command line (``"other"`` if unknown).

    Console scripts appear as ``python /path/bin/flower-superlink ...``, so matching is on
    the joined command line, with path separators made into spaces for ``geofl server``.
    """
    text = " ".join(cmdline)
    flat = " ".join(part.rsplit("/", 1)[-1] for part in text.split(" "))
    for needle, kind in _KINDS:
        if needle in flat:
            return kind
    return "other"


@dataclass(frozen=True)
class ProcSample:
    """One process's resident memory at one sampling instant."""

    t: float
    group: str
    pid: int
    kind: str
    rss: int


@dataclass
class GroupPeaks:
    """Peak memory of one group.

    Attributes
    ----------
    peak_sum_rss
        The largest total RSS of the group's processes at any one sample (bytes).
    peak_rss_by_kind
        For each process kind, the largest RSS any single process of it reached (bytes).
    pids_seen
        How many distinct processes the group had over the run.
    """

    peak_sum_rss: int = 0
    peak_rss_by_kind: dict[str, int] = field(default_factory=dict)
    pids_seen: int = 0


def summarize(samples: Iterable[ProcSample]) -> dict[str, GroupPeaks]:
    """Reduce samples to per-group peaks (sum over processes at one instant, max over time)."""
    sums: dict[tuple[str, float], int] = {}
    peaks: dict[str, GroupPeaks] = {}
    pids: dict[str, set[int]] = {}
    for s in samples:
        key = (s.group, s.t)
        sums[key] = sums.get(key, 0) + s.rss
        group = peaks.setdefault(s.group, GroupPeaks())
        group.peak_rss_by_kind[s.kind] = max(group.peak_rss_by_kind.get(s.kind, 0), s.rss)
        pids.setdefault(s.group, set()).add(s.pid)
    for (group_name, _), total in sums.items():
        peaks[group_name].peak_sum_rss = max(peaks[group_name].peak_sum_rss, total)
    for group_name, seen in pids.items():
        peaks[group_name].pids_seen = len(seen)
    return peaks


def peak_rss_of_kinds(
    samples: Iterable[ProcSample], kinds: Collection[str], per_process: bool = False
) -> int:
    """Peak RSS (bytes) of the processes of ``kinds``, over all groups.

    ``per_process=False``: the largest sum over those processes at one sampling instant;
    ``True``: the largest single process. 0 if no such process was seen.
    """
    chosen = [s for s in samples if s.kind in kinds]
    if per_process:
        return max((s.rss for s in chosen), default=0)
    sums: dict[float, int] = {}
    for s in chosen:
        sums[s.t] = sums.get(s.t, 0) + s.rss
    return max(sums.values(), default=0)


def _tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def sample_once(roots: Mapping[str, Iterable[int]], t: float) -> list[ProcSample]:
    """Sample RSS of every live process under each group's root PIDs."""
    out: list[ProcSample] = []
    for group, pids in roots.items():
        for pid in pids:
            try:
                root = psutil.Process(pid)
            except psutil.Error:
                continue
            for proc in _tree(root):
                try:
                    rss = int(proc.memory_info().rss)
                    kind = classify_cmdline(proc.cmdline())
                except psutil.Error:
                    continue
                out.append(ProcSample(t, group, proc.pid, kind, rss))
    return out


def kill_trees(roots: Mapping[str, Iterable[int]]) -> None:
    """SIGKILL every process under the given roots (children first): the memory brake."""
    for pids in roots.values():
        for pid in pids:
            try:
                root = psutil.Process(pid)
            except psutil.Error:
                continue
            for proc in reversed(_tree(root)):
                try:
                    proc.kill()
                except psutil.Error:
                    continue


class ProcessMonitor:
    """Sample the trees under registered root PIDs in a background thread.

    Roots may be added while it runs (clients start after the server). With
    ``limit_bytes``, the first sample whose total RSS over all groups passes the limit kills
    every tree at once (a runaway deployment must not take the shared host down) and sets
    :attr:`exceeded` to a message saying so.
    """

    def __init__(self, interval_s: float = 0.25, limit_bytes: int | None = None) -> None:
        self.interval_s = interval_s
        self.limit_bytes = limit_bytes
        self.exceeded: str | None = None
        self.peak_total_rss = 0
        self.samples: list[ProcSample] = []
        self._roots: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="procmon", daemon=True)

    def add(self, group: str, pid: int) -> None:
        """Count the tree under ``pid`` towards ``group`` from now on."""
        with self._lock:
            self._roots.setdefault(group, []).append(pid)

    def start(self) -> None:
        """Start sampling."""
        self._thread.start()

    def stop(self) -> dict[str, GroupPeaks]:
        """Stop sampling and return per-group peaks."""
        self._stop.set()
        self._thread.join()
        return summarize(self.samples)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                roots = {g: list(p) for g, p in self._roots.items()}
            batch = sample_once(roots, time.time())
            self.samples.extend(batch)
            total = sum(s.rss for s in batch)
            self.peak_total_rss = max(self.peak_total_rss, total)
            if self.limit_bytes is not None and total > self.limit_bytes and not self.exceeded:
                self.exceeded = (
                    f"total RSS {total / 1e9:.2f} GB passed the limit of "
                    f"{self.limit_bytes / 1e9:.2f} GB; every process was killed"
                )
                kill_trees(roots)
            self._stop.wait(self.interval_s)
