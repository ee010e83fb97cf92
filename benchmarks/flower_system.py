"""Flower 1.42 as a real deployment on loopback: SuperLink, N SuperNodes, ``flwr run``.

Process layout (each ``flwr``-spawned child is found through the process tree):

* group ``server``: ``flower-superlink`` -> its ``flower-superexec`` -> ``flwr-serverapp``;
* group ``site-<i>``: ``flower-supernode`` -> ``flower-superexec`` -> one ``flwr-clientapp``
  per message.

SuperNodes dial the harness's byte proxy, so Fleet traffic (the only traffic that would
cross a WAN) is counted; the CLI and the ServerApp talk to the SuperLink directly. Offline
settings: telemetry and update checks off, no runtime ``uv sync``, ``--insecure``, and a
separate ``FLWR_HOME`` per process so no state is shared through ``~/.flwr``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from benchmarks.core import (
    SERVER_GROUP,
    BenchmarkError,
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
    "FlowerSystem",
    "cli_config_toml",
    "read_events",
    "traffic_from_ls",
]

#: The Flower app folder copied to a temporary directory for every run.
FLOWER_APP_TEMPLATE = Path(__file__).resolve().parent / "flower_app"
_CONNECTION = "bench"
_OFFLINE_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}


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

    def run(self, workload: Workload, ctx: RunContext) -> SystemRun:
        """Start SuperLink and SuperNodes, submit the app, wait for the last round."""
        app_dir = ctx.workdir / "app"
        shutil.copytree(FLOWER_APP_TEMPLATE, app_dir, ignore=shutil.ignore_patterns("__pycache__"))
        timing = ctx.workdir / "timing.jsonl"
        self._start_superlink(ctx)
        for i in range(workload.clients):
            self._start_supernode(ctx, i, workload.clients)
        run_id = self._submit(ctx, app_dir, workload, timing)
        events = self._wait_for_end(ctx, timing, workload)
        rounds = rounds_from_events(events, workload.rounds)
        final = next(e for e in events if e.get("event") == "end").get("final_shift")
        shift = float(final) if isinstance(final, int | float) else None
        run = SystemRun(rounds=rounds, final_shift=shift)
        run.system_bytes = self._flower_traffic(ctx, run_id)
        run.notes["run_id"] = str(run_id)
        return run

    def _env(self, ctx: RunContext, home: str) -> dict[str, str]:
        path = ctx.workdir / "homes" / home
        path.mkdir(parents=True, exist_ok=True)
        return {**_OFFLINE_ENV, "FLWR_HOME": str(path)}

    def _start_superlink(self, ctx: RunContext) -> None:
        argv = [
            console_script("flower-superlink"),
            "--insecure",
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
        env = {**os.environ, **_OFFLINE_ENV, "FLWR_HOME": str(home)}
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
            f"num-params={workload.params} num-rounds={workload.rounds} "
            f'num-clients={workload.clients} timing-file="{timing}"'
        )
        out = self._cli(
            ctx, ["run", str(app_dir), _CONNECTION, "--run-config", run_config, "--format", "json"]
        )
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


def traffic_from_ls(reply: object) -> dict[str, int]:
    """Byte counters of the first run in ``flwr ls --format json`` output (1.42 layout)."""
    if not isinstance(reply, dict) or not isinstance(reply.get("runs"), list) or not reply["runs"]:
        return {}
    traffic = reply["runs"][0].get("network-traffic", {})
    if not isinstance(traffic, dict):
        return {}
    return {str(k): int(v) for k, v in traffic.items() if isinstance(v, int | float)}
