"""What watching a run costs: a round's wall time with the metrics (and dashboard) on vs off.

Workload (issue 16): a virtual-clock simulation of ``--clients`` clients (default 1,000),
every one of them in every round, clients that echo the model plus a constant
(:mod:`benchmarks.apps.geofl_echo`, ``--params`` float32 values) in the coordinator's
process (``workers: 0``), two regions, FedAvg, no evaluation. On the virtual clock a
round costs no simulated time for server work, so what is measured is the **real** time
of each round on this machine: an observer subscribed after every other one records
``time.perf_counter()`` when each round starts and ends. That time is all framework work
(selection, 1,000 settlements, recording, aggregation, checkpoint), which is what an
observer slows down; a round that also trained would hide the overhead.

Cases (``--cases``): ``off`` (nothing configured), ``metrics`` (``server.metrics``; a thread
scrapes the endpoint every ``--scrape-interval`` seconds, far more often than Prometheus's
default 15 s) and ``dashboard`` (``server.dashboard`` plus the metrics, with one page's
event stream kept open by a ``curl`` process; the case is refused with a clear message on a
checkout without ``server.dashboard``). Each case runs in a child process of its own (this
module with ``--child``); the cases run ``--repeats`` times, in reversed order every other
repeat, each repeat under the shared heavy-work lock (:func:`benchmarks.core.heavy_lock`).
Per run the figure is the median of rounds 2..R (round 1 pays imports and the first
encodings); the overhead of a case is the median over repeats of (case / off of the same
repeat) - 1, so slow phases of the shared host cancel out pairwise.

The on/off comparison is only as steady as the shared host, so the child also measures
what the metrics code itself takes ("attributed" overhead): the seconds spent in the metrics
observer's methods plus the CPU seconds of the endpoint's text generation (case dashboard:
plus the dashboard observer's seconds and the CPU seconds of its publishing), per round, over
the same repeat's round without metrics. The host's noise does not blur that figure; it
leaves out the cost of the GIL changing hands, which the on/off comparison includes.

    python -m benchmarks.ops_overhead --repeats 5 --out benchmarks/results/ops_overhead.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from benchmarks.core import REPO_ROOT, heavy_lock

__all__ = ["CASES", "case_config", "main", "overheads", "run_case"]

PARAMS_ENV = "GEOFL_BENCH_PARAMS"
REGIONS = {
    "near": {"share": 0.5, "rtt_ms": 20, "up_mbps": 50, "down_mbps": 100},
    "far": {"share": 0.5, "rtt_ms": 200, "up_mbps": 5, "down_mbps": 20},
}
#: What each case adds to the run's configuration.
CASES: dict[str, dict[str, Any]] = {
    "off": {},
    "metrics": {"server": {"metrics": {"address": "127.0.0.1:0"}}},
    "dashboard": {
        "server": {"metrics": {"address": "127.0.0.1:0"}, "dashboard": {"address": "127.0.0.1:0"}}
    },
}


def case_config(case: str, clients: int, rounds: int, workdir: Path) -> dict[str, Any]:
    """The run of ``case``: the same for every case but for what :data:`CASES` adds."""
    config: dict[str, Any] = {
        "run": {"name": f"ops-{case}", "rounds": rounds, "seed": 1},
        "model": "benchmarks.apps.geofl_echo:make_model",
        "strategy": {"name": "fedavg", "clients_per_round": clients, "min_clients": clients},
        "schedule": {"deadline_s": 3600, "wait_for_clients_s": 60},
        "evaluation": {"every": 0},
        "storage": {
            "url": f"sqlite:///{workdir / 'run.db'}",
            "checkpoints": str(workdir / "ckpt"),
            "keep_checkpoints": 1,
        },
        "server": {"address": "127.0.0.1:0"},
        "simulation": {
            "clients": clients,
            "app": "benchmarks.apps.geofl_echo:client_app",
            "clock": "virtual",
            "workers": 0,
            "regions": REGIONS,
            "compute": {"samples_per_s": 1000},
        },
    }
    for section, values in CASES[case].items():
        config[section] = {**config.get(section, {}), **values}
    return config


# ------------------------------------------------------------------ the child process


def _scrape_until(port_of: Any, interval_s: float, stop: threading.Event, out: list[float]) -> None:
    """Scrape the metrics endpoint every ``interval_s`` until ``stop``; record each's seconds."""
    while not stop.wait(interval_s):
        port = port_of()
        if port is None:
            continue
        began = time.perf_counter()
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                reply.read()
            out.append(time.perf_counter() - began)


def _time_metrics_observer(dashboard: bool = False) -> list[float]:
    """Make every event method of the metrics observer (and of the dashboard's live state,
    with ``dashboard``) add its seconds to the returned cell.

    The direct measure of what the observers cost the event loop, free of the shared host's
    noise that the on/off comparison suffers from.
    """
    from geofl.server.metrics.observer import MetricsObserver

    spent = [0.0, 0.0]  # wall seconds (GIL waits included), CPU seconds of the loop's thread
    _time_methods(MetricsObserver, spent)
    if dashboard:
        from geofl.server.dashboard.live import LiveState

        _time_methods(LiveState, spent)
    return spent


def _time_methods(observer: type, spent: list[float]) -> None:
    import functools
    import inspect

    names = ("round_started", "phase", "task_settled", "round_committed", "round_failed")
    for name in (*names, "round_ended", "recount_nodes", "measurements", "plan"):
        method = getattr(observer, name)
        if inspect.iscoroutinefunction(method):

            @functools.wraps(method)
            async def timed_async(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
                began, cpu = time.perf_counter(), time.thread_time()
                try:
                    return await _method(*args, **kwargs)
                finally:
                    spent[0] += time.perf_counter() - began
                    spent[1] += time.thread_time() - cpu

            setattr(observer, name, timed_async)
        else:

            @functools.wraps(method)
            def timed(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
                began, cpu = time.perf_counter(), time.thread_time()
                try:
                    return _method(*args, **kwargs)
                finally:
                    spent[0] += time.perf_counter() - began
                    spent[1] += time.thread_time() - cpu

            setattr(observer, name, timed)


def _time_scrape_generation() -> list[float]:
    """Make the endpoint's text generation add its CPU seconds (of the handler thread, not
    its waits for the GIL) to the returned cell: what a scrape takes from the event loop."""
    import prometheus_client.exposition as exposition

    spent = [0.0]
    generate = exposition.generate_latest

    def timed(*args: Any, **kwargs: Any) -> bytes:
        began = time.thread_time()
        try:
            return generate(*args, **kwargs)
        finally:
            spent[0] += time.thread_time() - began

    exposition.generate_latest = timed  # what the endpoint's WSGI app calls per scrape
    return spent


def _time_publishing(spent: list[float]) -> None:
    """Add the CPU seconds of the dashboard's publishing (taking a delta, encoding it,
    queueing it for the stream) to ``spent``: what it takes from the run, as a scrape does."""
    from geofl.server.dashboard.app import Broadcaster

    publish = Broadcaster.publish

    def timed(self: Broadcaster) -> None:
        began = time.thread_time()
        try:
            publish(self)
        finally:
            spent[0] += time.thread_time() - began

    Broadcaster.publish = timed  # type: ignore[method-assign]


def _watch_dashboard(coordinators: list[Any], stop: threading.Event, received: list[int]) -> None:
    """Keep one page's event stream open on the dashboard (curl, a process of its own as a
    browser is), so that its deltas are encoded and sent as they would be when watched;
    ``received`` gets the stream's bytes and the seconds it took to open (after the start)."""
    import subprocess
    import tempfile

    began = time.perf_counter()
    while not stop.is_set():
        url = coordinators[0].instruments.dashboard_url if coordinators else None
        if url is not None:
            break
        time.sleep(0.005)
    else:
        return
    with tempfile.TemporaryFile() as sink:
        reader = subprocess.Popen(
            ["curl", "-sSN", f"{url}/api/events"], stdout=sink, stderr=subprocess.PIPE
        )
        while not os.fstat(sink.fileno()).st_size and reader.poll() is None and not stop.is_set():
            time.sleep(0.005)
        received.append(int(1000 * (time.perf_counter() - began)))
        stop.wait()
        reader.terminate()
        _, error = reader.communicate(timeout=10)
        received.append(os.fstat(sink.fileno()).st_size)
        if error.strip():
            print(f"dashboard stream: {error.decode(errors='replace').strip()}", file=sys.stderr)


def _child(config_path: Path, result_path: Path, scrape_interval_s: float) -> int:
    """Run one case; write each round's wall seconds (and the scrapes') to ``result_path``."""
    from geofl.server.config import load_config
    from geofl.server.rounds.observers import RoundObserver
    from geofl.server.rounds.records import RoundRecord
    from geofl.server.simulation.virtual import run_virtual_simulation

    class RoundTimer(RoundObserver):
        def __init__(self) -> None:
            self.started: dict[int, float] = {}
            self.seconds: dict[int, float] = {}

        def round_started(self, number: int, cohort_target: int) -> None:
            self.started[number] = time.perf_counter()

        def round_ended(self, record: RoundRecord, status: str) -> None:
            self.seconds[record.number] = time.perf_counter() - self.started[record.number]

    config = load_config(config_path)
    metrics_on = config.server.metrics is not None
    dashboard_on = getattr(config.server, "dashboard", None) is not None
    observer_s = _time_metrics_observer(dashboard_on) if metrics_on else [0.0, 0.0]
    generation_s = _time_scrape_generation() if metrics_on else [0.0]
    if dashboard_on:
        _time_publishing(generation_s)
    timer = RoundTimer()
    coordinators: list[Any] = []
    scrapes: list[float] = []
    stop = threading.Event()

    def port_of() -> int | None:
        return coordinators[0].instruments.metrics_port if coordinators else None

    scraper = threading.Thread(
        target=_scrape_until, args=(port_of, scrape_interval_s, stop, scrapes), daemon=True
    )
    if metrics_on:
        scraper.start()
    stream: list[int] = []
    watcher = threading.Thread(
        target=_watch_dashboard, args=(coordinators, stop, stream), daemon=True
    )
    if dashboard_on:
        watcher.start()
    began = time.perf_counter()
    try:
        outcome = run_virtual_simulation(
            config, observers=[timer], on_start=lambda c, links: coordinators.append(c)
        )
    finally:
        stop.set()
        if dashboard_on:
            watcher.join(timeout=10)
    wall = time.perf_counter() - began
    result = {
        "status": outcome.result.status,
        "round_s": [timer.seconds[n] for n in sorted(timer.seconds)],
        "run_wall_s": wall,
        "scrapes": len(scrapes),
        "median_scrape_s": statistics.median(scrapes) if scrapes else None,
        "scrape_s": sum(scrapes),
        "scrape_cpu_s": generation_s[0],
        "observer_s": observer_s[0],
        "observer_cpu_s": observer_s[1],
        # Case dashboard: ms until the page's stream had its first byte, bytes it received.
        "dashboard_stream": stream,
    }
    result_path.write_text(json.dumps(result))
    return 0 if outcome.result.status == "completed" else 1


# ------------------------------------------------------------------ the driver


def run_case(
    case: str, clients: int, rounds: int, params: int, scrape_interval_s: float, root: Path
) -> dict[str, Any]:
    """Run ``case`` in a child process; its rounds' wall seconds and the steady median."""
    workdir = Path(tempfile.mkdtemp(prefix=f"{case}-", dir=root))
    config_path = workdir / "run.yaml"
    config_path.write_text(yaml.safe_dump(case_config(case, clients, rounds, workdir)))
    result_path = workdir / "result.json"
    command = [
        sys.executable,
        "-m",
        "benchmarks.ops_overhead",
        "--child",
        str(config_path),
        str(result_path),
        "--scrape-interval",
        str(scrape_interval_s),
    ]
    env = {**os.environ, PARAMS_ENV: str(params), "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not result_path.exists():
        tail = done.stderr[-3000:]
        if "dashboard" in tail and "unknown key" in tail:
            raise SystemExit(
                "case dashboard: this checkout has no server.dashboard (merge the dashboard "
                "branch first), or leave the case out: --cases off,metrics"
            )
        raise RuntimeError(f"case {case} failed ({done.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(result_path.read_text())
    result["steady_round_s"] = statistics.median(result["round_s"][1:] or result["round_s"])
    rounds_run = len(result["round_s"])
    result["observer_s_per_round"] = result["observer_s"] / rounds_run
    result["scrape_s_per_round"] = result["scrape_s"] / rounds_run
    result["scrape_cpu_s_per_round"] = result["scrape_cpu_s"] / rounds_run
    result["case"] = case
    result["load_avg_1m"] = os.getloadavg()[0]
    return result


def overheads(repeats: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per case: the steady medians, and the median pairwise overhead against ``off``."""
    summary: dict[str, dict[str, Any]] = {}
    for case in repeats[0]:
        steady = [r[case]["steady_round_s"] for r in repeats]
        entry: dict[str, Any] = {
            "median_steady_round_s": statistics.median(steady),
            "steady_round_s": steady,
        }
        if case != "off":
            ratios = [r[case]["steady_round_s"] / r["off"]["steady_round_s"] - 1 for r in repeats]
            entry["overhead_per_repeat"] = ratios
            entry["median_overhead"] = statistics.median(ratios)
            # What the case's own code took, over the same repeat's round without it.
            direct = [
                (r[case]["observer_s_per_round"] + r[case]["scrape_cpu_s_per_round"])
                / r["off"]["steady_round_s"]
                for r in repeats
            ]
            entry["attributed_overhead_per_repeat"] = direct
            entry["median_attributed_overhead"] = statistics.median(direct)
        summary[case] = entry
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, type=Path, metavar=("CONFIG", "RESULT"))
    parser.add_argument("--clients", type=int, default=1000, help="clients, all in every round")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per run (1 is warm-up)")
    parser.add_argument("--params", type=int, default=10_000, help="float32 model values")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", default="off,metrics", help="comma-separated, off first")
    parser.add_argument("--scrape-interval", type=float, default=1.0, help="seconds")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-lock", action="store_true", help="do not take the heavy-work lock")
    args = parser.parse_args(argv)
    if args.child is not None:
        return _child(args.child[0], args.child[1], args.scrape_interval)
    cases = args.cases.split(",")
    if cases[0] != "off" or any(c not in CASES for c in cases):
        parser.error(f"--cases: 'off' first, then any of {sorted(CASES)}")
    repeats: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="geofl-ops-") as tmp:
        for index in range(args.repeats):
            order = cases if index % 2 == 0 else cases[::-1]  # neither always goes first
            with heavy_lock() if not args.no_lock else contextlib.nullcontext():
                runs = {
                    case: run_case(
                        case,
                        args.clients,
                        args.rounds,
                        args.params,
                        args.scrape_interval,
                        Path(tmp),
                    )
                    for case in order
                }
            repeats.append(runs)
            shown = {c: round(r["steady_round_s"], 4) for c, r in runs.items()}
            print(f"repeat {index + 1}: steady s/round {shown}", flush=True)
    result = {
        "workload": {
            "clients": args.clients,
            "per_round": args.clients,
            "rounds": args.rounds,
            "params": args.params,
            "scrape_interval_s": args.scrape_interval,
            "regions": REGIONS,
        },
        "summary": overheads(repeats),
        "repeats": repeats,
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
