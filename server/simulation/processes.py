"""Child processes a simulation starts on this machine: named, waited for, always reaped.

``geofl simulate`` runs its clients (and relays) as real ``geofl`` processes, so that the
wall clock exercises the deployed code paths. Whatever ends the run, a normal finish, a
failure or Ctrl-C, no child may outlive it: :meth:`ProcessGroup.stop` terminates the
stragglers and waits, killing any that ignore SIGTERM.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
from collections.abc import Mapping, Sequence

__all__ = ["EXIT_WAIT_S", "ProcessGroup", "free_port", "wait_for_exit"]

#: How long a child is given to exit (after the run ends, or after SIGTERM) before a kill.
EXIT_WAIT_S = 30.0


def free_port() -> int:
    """A loopback port nothing listens on now (for a relay the clients then connect to)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_exit(process: subprocess.Popen[bytes]) -> int:
    """The exit code of a child process, killing it if it does not exit in time."""
    try:
        return process.wait(timeout=EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


class ProcessGroup:
    """Processes started together, each with a name for messages (``"client 3"``)."""

    def __init__(self) -> None:
        self._started: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(
        self, name: str, command: Sequence[str], env: Mapping[str, str] | None = None
    ) -> None:
        """Start ``command`` (inheriting stdout and stderr, so its output shows) as ``name``."""
        self._started.append((name, subprocess.Popen(command, env=env)))

    def poll(self) -> list[int | None]:
        """Each process's exit code, or None while it runs."""
        return [process.poll() for _, process in self._started]

    async def exit_codes(self) -> list[tuple[str, int]]:
        """Wait for every process (see :func:`wait_for_exit`); their names and exit codes."""
        return [(name, await asyncio.to_thread(wait_for_exit, p)) for name, p in self._started]

    async def stop(self) -> None:
        """Terminate the processes still running, and reap them."""
        for _, process in self._started:
            if process.poll() is None:
                process.terminate()
                await asyncio.to_thread(wait_for_exit, process)
