"""geofl as a real deployment on loopback — STUB, wired by the lead.

What the finished :class:`GeoflSystem` does (the harness provides everything else: ports,
byte proxy, memory sampling, cleanup, result tables):

1. :meth:`GeoflSystem.write_config` writes ``workdir/run.yaml``: ``workload.rounds`` rounds,
   FedAvg over all ``workload.clients`` clients, model ``benchmarks.apps.geofl_echo:make_model``,
   server address ``127.0.0.1:{ctx.server_port}``, storage ``sqlite:///{db_path}``.
2. ``ctx.spawn("server", "geofl-server", ["geofl", "server", "-c", yaml],
   {"GEOFL_BENCH_PARAMS": str(workload.params), "PYTHONPATH": str(REPO_ROOT)})``
   (processes run in ``ctx.workdir``, so ``benchmarks.apps`` needs the root on PYTHONPATH;
   the same env for the clients).
3. For each i: ``ctx.spawn(f"site-{i}", f"geofl-client-{i}", ["geofl", "client", "--server",
   f"127.0.0.1:{ctx.client_port}", "--app", "benchmarks.apps.geofl_echo:client_app",
   "--node-config", f"partition-id={i}"])`` (clients dial the proxy port, not the server).
4. Wait until every spawned process has exited, all with code 0 (else BenchmarkError).
5. ``geofl runs show RUN_ID --json`` -> :func:`rounds_from_runs_show` -> ``SystemRun``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from benchmarks.core import (
    REPO_ROOT,
    BenchmarkError,
    RoundRecord,
    RunContext,
    System,
    SystemRun,
    Workload,
)

__all__ = [
    "GEOFL_APP",
    "GEOFL_MODEL",
    "GEOFL_REPO_ROOT",
    "GeoflSystem",
    "rounds_from_runs_show",
]

#: Put on PYTHONPATH of geofl processes so ``benchmarks.apps.geofl_echo`` imports.
GEOFL_REPO_ROOT = REPO_ROOT

#: The client app and server model factory for this workload (``module:attr``).
GEOFL_APP = "benchmarks.apps.geofl_echo:client_app"
GEOFL_MODEL = "benchmarks.apps.geofl_echo:make_model"


def rounds_from_runs_show(reply: Mapping[str, object]) -> list[RoundRecord]:
    """Round records from ``geofl runs show RUN_ID --json``.

    Expects ``{"rounds": [{"number", "duration_s", "bytes_up", "bytes_down", ...}]}``;
    ``started_at`` (ISO 8601 or Unix seconds), when present, lets the harness attribute
    proxy bytes to each round.
    """
    rounds = reply.get("rounds")
    if not isinstance(rounds, list):
        raise BenchmarkError(f"`geofl runs show` JSON has no 'rounds' list: {dict(reply)!r}")
    out = []
    for item in rounds:
        if not isinstance(item, dict):
            raise BenchmarkError(f"`geofl runs show` round is not an object: {item!r}")
        try:
            out.append(
                RoundRecord(
                    number=int(item["number"]),
                    duration_s=float(item["duration_s"]),
                    start_wall=_wall(item.get("started_at")),
                    bytes_up=_opt_int(item.get("bytes_up")),
                    bytes_down=_opt_int(item.get("bytes_down")),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BenchmarkError(f"`geofl runs show` round {item!r} is malformed: {exc}") from exc
    return sorted(out, key=lambda r: r.number)


def _opt_int(value: object) -> int | None:
    return None if value is None else int(str(value))


def _wall(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    return datetime.fromisoformat(str(value)).timestamp()


class GeoflSystem(System):
    """STUB: geofl server + N ``geofl client`` processes. Wired by the lead."""

    name = "geofl"

    def write_config(self, workload: Workload, ctx: RunContext, db_path: Path) -> Path:
        """Write the run YAML for ``workload`` (see the module docstring); return its path."""
        raise NotImplementedError("geofl system: wired by the lead")

    def run(self, workload: Workload, ctx: RunContext) -> SystemRun:
        """Deploy geofl, wait for every process to exit 0, read rounds from the database."""
        raise NotImplementedError("geofl system: wired by the lead")
