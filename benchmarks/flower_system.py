"""Flower 1.42 on loopback: a real deployment (SuperLink, N SuperNodes) or its simulation.

Deployment process layout (each ``flwr``-spawned child is found through the process tree):

* group ``server``: ``flower-superlink`` -> its ``flower-superexec`` -> ``flwr-serverapp``;
* group ``site-<i>``: ``flower-supernode`` -> ``flower-superexec`` -> one ``flwr-clientapp``
  per message.

SuperNodes dial the harness's byte proxy, so Fleet traffic (the only traffic that would
cross a WAN) is counted; the CLI and the ServerApp talk to the SuperLink directly.

Simulation (:class:`FlowerSimulationSystem`): ``flower-superlink --simulation`` ->
``flower-superexec`` -> ``flwr-simulation`` (the ServerApp and the Ray driver) -> Ray's
processes, with the ClientApps in ``ray::ClientAppActor`` workers; no SuperNodes and no
Fleet traffic, so bytes are the ServerApp's count of serialized arrays.

Offline settings: telemetry and update checks off, no runtime ``uv sync``, ``--insecure``,
and a separate ``FLWR_HOME`` per process so no state is shared through ``~/.flwr``. Every
process gets the interpreter's ``bin`` directory first on ``PATH`` (the SuperLink and
SuperNode start ``flower-superexec`` by name) and the repository root on ``PYTHONPATH``
(the ``mlp-digits`` task imports ``benchmarks.apps.digits_mlp``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from benchmarks.core import (
    REPO_ROOT,
    SERVER_GROUP,
    BenchmarkError,
    MemoryRole,
    RunContext,
    System,
    SystemRun,
    Workload,
    console_script,
    free_port,
    wait_for_port,
)
from benchmarks.metrics import rounds_from_events

__all__ = [
    "FLOWER_APP_TEMPLATE",
    "SIMULATION_CPUS_PER_CLIENT",
    "FlowerSimulationSystem",
    "FlowerSystem",
    "cli_config_toml",
    "read_events",
    "traffic_from_ls",
]

#: The Flower app folder copied to a temporary directory for every run.
FLOWER_APP_TEMPLATE = Path(__file__).resolve().parent / "flower_app"
_CONNECTION = "bench"
_OFFLINE_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
#: Ray CPUs per virtual client: 1 gives one ClientApp actor per core (Flower's default of
#: 2 would run a single actor on the benchmark host's 2 cores).
SIMULATION_CPUS_PER_CLIENT = 1


def _process_env() -> dict[str, str]:
    """PATH and PYTHONPATH for Flower's processes (see the module docstring)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**_OFFLINE_ENV, "PATH": path, "PYTHONPATH": pythonpath}


def cli_config_toml(connection: str, port: int) -> str:
    """The ``$FLWR_HOME/config.toml`` that makes ``flwr run APP <connection>`` hit our SuperLink.

    In 1.42 the SUPERLINK argument of ``flwr run`` names a connection in this file (a
    ``[tool.flwr.federations]`` table in the app's pyproject is a legacy form that the CLI
    migrates); the Control API shares the SuperLink's single HTTP port.
    """
    return (
        f'[superlink]\ndefault = "{connection}"\n\n'
        f'[superlink.{connection}]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    )


def read_events(path: Path) -> list[dict[str, object]]:
    """Parse the ServerApp's JSON-lines timing file (empty if not written yet)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


class FlowerSystem(System):
    """Deploy Flower for a workload and read round times from the ServerApp's log."""

    name = "flower"
    #: Run the SuperLink with ``--simulation`` (Ray) instead of starting SuperNodes.
    simulation: ClassVar[bool] = False

    def run(self, workload: Workload, ctx: RunContext) -> SystemRun:
        """Start the SuperLink (and SuperNodes), submit the app, wait for the last round."""
        app_dir = ctx.workdir / "app"
        shutil.copytree(FLOWER_APP_TEMPLATE, app_dir, ignore=shutil.ignore_patterns("__pycache__"))
        timing = ctx.workdir / "timing.jsonl"
        self._start_superlink(ctx)
        if not self.simulation:
            for i in range(workload.clients):
                self._start_supernode(ctx, i, workload.clients)
        run_id = self._submit(ctx, app_dir, workload, timing)
        events = self._wait_for_end(ctx, timing, workload)
        end = next(e for e in events if e.get("event") == "end")
        run = SystemRun(
            rounds=rounds_from_events(events, workload.rounds),
            final_shift=_float_or_none(end.get("final_shift")),
            accuracy=_float_or_none(end.get("accuracy")),
        )
        if not self.simulation:  # a simulation's Fleet counters are always zero
            run.system_bytes = self._flower_traffic(ctx, run_id)
        run.notes["run_id"] = str(run_id)
        return run

    def _env(self, ctx: RunContext, home: str) -> dict[str, str]:
        path = ctx.workdir / "homes" / home
        path.mkdir(parents=True, exist_ok=True)
        return {**_process_env(), "FLWR_HOME": str(path)}

    def _start_superlink(self, ctx: RunContext) -> None:
        argv = [
            console_script("flower-superlink"),
            "--insecure",
            *(["--simulation"] if self.simulation else []),
            "--host",
            "127.0.0.1",
            "--port",
            str(ctx.server_port),
            "--disable-runtime-dependency-installation",
        ]
        ctx.spawn(SERVER_GROUP, "superlink", argv, self._env(ctx, "superlink"))
        wait_for_port(ctx.server_port, timeout_s=120, ctx=ctx)

    def _start_supernode(self, ctx: RunContext, index: int, total: int) -> None:
        argv = [
            console_script("flower-supernode"),
            "--insecure",
            "--superlink",
            f"127.0.0.1:{ctx.client_port}",
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--node-config",
            f"partition-id={index} num-partitions={total}",
        ]
        name = f"site-{index}"
        ctx.spawn(name, f"supernode-{index}", argv, self._env(ctx, name))

    def _cli(self, ctx: RunContext, args: list[str], timeout_s: float = 300) -> str:
        """Run the ``flwr`` CLI against our SuperLink; its output, or a clear error."""
        home = ctx.workdir / "homes" / "cli"
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(cli_config_toml(_CONNECTION, ctx.server_port))
        env = {**os.environ, **_process_env(), "FLWR_HOME": str(home)}
        done = subprocess.run(
            [console_script("flwr"), *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=ctx.workdir,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            raise BenchmarkError(
                f"flwr {' '.join(args)} exited {done.returncode}: {done.stdout}{done.stderr}"
            )
        return done.stdout

    def _submit(self, ctx: RunContext, app_dir: Path, workload: Workload, timing: Path) -> int:
        run_config = (
            f'task="{workload.task}" num-params={workload.params} num-rounds={workload.rounds} '
            f'num-clients={workload.clients} timing-file="{timing}"'
        )
        args = ["run", str(app_dir), _CONNECTION, "--run-config", run_config, "--format", "json"]
        if self.simulation:
            federation = (
                f"num-supernodes={workload.clients} "
                f"client-resources-num-cpus={SIMULATION_CPUS_PER_CLIENT} "
                "client-resources-num-gpus=0.0"
            )
            args += ["--federation-config", federation]
        out = self._cli(ctx, args)
        try:
            reply = json.loads(out[out.index("{") :])
            return int(reply["run-id"])
        except (ValueError, KeyError) as exc:
            raise BenchmarkError(f"could not read the run id from `flwr run`: {out!r}") from exc

    def _wait_for_end(
        self, ctx: RunContext, timing: Path, workload: Workload
    ) -> list[dict[str, object]]:
        deadline = time.monotonic() + workload.timeout_s
        while time.monotonic() < deadline:
            ctx.check_alive()
            events = read_events(timing)
            if any(e.get("event") == "end" for e in events):
                return events
            time.sleep(1.0)
        raise BenchmarkError(
            f"Flower run did not finish within {workload.timeout_s:.0f} s; "
            f"last events: {read_events(timing)[-3:]}; logs in {ctx.workdir / 'logs'}"
        )

    def _flower_traffic(self, ctx: RunContext, run_id: int) -> dict[str, int]:
        """Flower's own per-run Fleet accounting (``flwr ls --run-id``), best effort.

        An empty result (CLI failure) is reported as missing rather than failing a run
        whose timings are already complete.
        """
        try:
            out = self._cli(ctx, ["ls", "--run-id", str(run_id), "--format", "json"], 60)
            reply = json.loads(out[out.index("{") :])
        except (BenchmarkError, ValueError, subprocess.TimeoutExpired):
            return {}
        return traffic_from_ls(reply)


class FlowerSimulationSystem(FlowerSystem):
    """Flower's simulation runtime (Ray backend) for a workload, ``workload.clients`` virtual
    SuperNodes with :data:`SIMULATION_CPUS_PER_CLIENT` CPU each.

    Memory roles: ``server`` = SuperLink + SuperExec + ``flwr-simulation`` (ServerApp and
    Ray driver); ``client`` = the largest ``ray::ClientAppActor`` (one actor runs the
    ClientApps of many virtual clients); ``ray`` = Ray's own daemons (GCS, raylet,
    dashboard, agents, idle workers), which exist only because of the simulation backend.
    """

    simulation = True
    wire_proxy = False
    memory_roles: ClassVar[Mapping[str, MemoryRole]] = {
        "server": MemoryRole(frozenset({"superlink", "superexec", "simulation"})),
        "client": MemoryRole(frozenset({"ray-actor"}), per_process=True),
        "ray": MemoryRole(frozenset({"ray-infra"})),
    }


def _float_or_none(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def traffic_from_ls(reply: object) -> dict[str, int]:
    """Byte counters of the first run in ``flwr ls --format json`` output (1.42 layout)."""
    if not isinstance(reply, dict) or not isinstance(reply.get("runs"), list) or not reply["runs"]:
        return {}
    traffic = reply["runs"][0].get("network-traffic", {})
    if not isinstance(traffic, dict):
        return {}
    return {str(k): int(v) for k, v in traffic.items() if isinstance(v, int | float)}
