"""The harness's byte proxy: on by default for a deployment, off on request."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.core import RoundRecord, RunContext, System, SystemRun, Workload
from benchmarks.harness import run_case


class _Recorder(System):
    """Deploys nothing; remembers which ports the harness gave it."""

    name = "recorder"

    def __init__(self) -> None:
        self.ports: tuple[int, int] | None = None

    def run(self, workload: Workload, ctx: RunContext) -> SystemRun:
        self.ports = (ctx.server_port, ctx.client_port)
        shift = workload.expected_shift()
        return SystemRun(rounds=[RoundRecord(number=1, duration_s=0.5)], final_shift=shift)


@pytest.mark.parametrize("wire_proxy", [None, False])
def test_direct_cases_dial_the_server_and_say_so(wire_proxy: Any) -> None:
    system = _Recorder()
    record = run_case(system, Workload(params=10, clients=1, rounds=1), wire_proxy=wire_proxy)
    assert record["ok"], record.get("error")
    assert system.ports is not None
    server_port, client_port = system.ports
    if wire_proxy is None:  # the default: clients reach the server through the proxy
        assert client_port != server_port
        assert record["wire_proxy"] is True
    else:
        assert client_port == server_port
        assert record["wire_proxy"] is False
        assert record["median_up_mb"] is None  # no proxy: no wire bytes, not zero
