"""Helpers for tests that run the ``geofl`` program as real processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

APPS = Path(__file__).parent / "apps"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def env() -> dict[str, str]:
    """The environment of child processes: test apps importable, no stray config."""
    child = dict(os.environ)
    child["PYTHONPATH"] = os.pathsep.join(filter(None, [str(APPS), child.get("PYTHONPATH")]))
    return child


def geofl(*args: str) -> list[str]:
    return [sys.executable, "-m", "geofl.server.cli.main", *args]


def run_geofl(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        geofl(*args),
        cwd=cwd,
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_geofl(cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        geofl(*args),
        cwd=cwd,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def start_client(
    cwd: Path,
    port: int,
    index: int,
    node_config: str,
    *,
    reconnect_for_s: float = 60,
    verbose: bool = False,
) -> subprocess.Popen[str]:
    """``geofl client`` of the test app as ``site-<index>`` against 127.0.0.1:``port``.

    ``node_config`` is the test app's ``--node-config`` (e.g. ``behaviour=slow delay_s=6``);
    ``partition-id=<index>`` is added in front.
    """
    return start_geofl(
        cwd,
        "client",
        *(["-v"] if verbose else []),
        "--server",
        f"127.0.0.1:{port}",
        "--app",
        "geofl_testapp:client_app",
        "--name",
        f"site-{index}",
        "--reconnect-for",
        f"{reconnect_for_s:g}",
        "--node-config",
        f"partition-id={index} {node_config}",
    )


def write_config(directory: Path, **sections: Any) -> Path:
    """A run of the test app, with relative paths (resolved against ``directory``)."""
    data: dict[str, Any] = {
        "run": {"name": "proc", "rounds": 2, "seed": 3},
        "model": "geofl_testapp:make_model",
        "strategy": {"name": "fedavg", "clients_per_round": 2, "min_clients": 2},
        "schedule": {"deadline_s": 30, "wait_for_clients_s": 60},
        "evaluation": {"every": 1},
        "storage": {"url": "sqlite:///runs/geofl.db", "checkpoints": "runs/checkpoints"},
        "server": {"address": "127.0.0.1:0", "heartbeat_interval_s": 0.5},
        "simulation": {"clients": 2, "app": "geofl_testapp:client_app"},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path = directory / "run.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
