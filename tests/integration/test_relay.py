"""Regional relays over real gRPC: a coordinator, two relays, and each relay's clients.

The coordinator runs in a thread (the ``serve`` fixture), each relay runs its real
upstream runtime in a thread and its regional server on its own loop, and the clients
are the unchanged client runtime pointed at their relay. The test app's client ``p``
adds ``1 + p`` to every float and reports ``10 (p + 1)`` examples, so every aggregate is
known in closed form. With regions ``a = {0, 2}`` and ``b = {1, 4, 8}`` the regional
means (5/2 and 55/8) and the flat mean over all five clients (6) are exact in float32,
so hierarchical and flat FedAvg can be compared bit for bit.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from geofl.client.app import Client, ClientContext, ClientFactory, load_client_app
from geofl.client.runtime import ClientOptions, ClientRuntime
from geofl.protocols.serde import scalar_map
from geofl.protocols.types import Config, Metrics, Weights, WeightsView
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.cli.exit_codes import ExitCode
from geofl.server.relay import Relay, RelayConfig
from geofl.storage import CheckpointRecord, CheckpointStore, open_database, queries

from .conftest import ServerHandle, run_config
from .processes import free_port, run_geofl, start_geofl, write_config
from .test_tls import pki  # noqa: F401 - the fixture: a CA and a localhost certificate

APP = "geofl_testapp:client_app"
REGIONS = {"a": [0, 2], "b": [1, 4, 8]}


def _mean(partitions: list[int]) -> Fraction:
    """FedAvg of the test app's shifts ``1 + p`` weighted by ``10 (p + 1)``."""
    return Fraction(
        sum((1 + p) * 10 * (p + 1) for p in partitions), sum(10 * (p + 1) for p in partitions)
    )


FLAT = _mean(REGIONS["a"] + REGIONS["b"])
assert FLAT == 6 and _mean(REGIONS["a"]) == Fraction(5, 2)  # exact in float32


class PullClient(Client):
    """Moves every float halfway to ``1 + p``: unlike the test app's constant shift, its
    update depends on the model it starts from (a stale model would show)."""

    def __init__(self, partition: int) -> None:
        self.partition = partition

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        target = 1 + self.partition
        out = {k: (v + target) / 2 if v.dtype.kind == "f" else v + 1 for k, v in parameters.items()}
        return out, 10 * (self.partition + 1), {}


def pull_app(context: ClientContext) -> Client:
    return PullClient(int(context.node_config["partition-id"]))


def _pulled(start: Fraction, partitions: list[int], rounds: int) -> Fraction:
    """A region's model after ``rounds`` FedAvg rounds of :class:`PullClient`."""
    model = start
    for _ in range(rounds):
        model += (_mean(partitions) - model) / 2
    return model


@dataclass
class RegionHandle:
    """A relay and its clients, each in a thread."""

    relay: Relay
    ca: Path | None = None  # what the clients trust, when the relay speaks TLS
    threads: list[threading.Thread] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    runtimes: list[ClientRuntime] = field(default_factory=list)

    def _spawn(self, target: Callable[[], None]) -> None:
        def guarded() -> None:
            try:
                target()
            except BaseException as exc:  # surfaced by wait()
                self.errors.append(exc)

        thread = threading.Thread(target=guarded, daemon=True)
        thread.start()
        self.threads.append(thread)

    def add_client(
        self, partition: int, runtime_class: type[ClientRuntime], app: ClientFactory
    ) -> None:
        options = ClientOptions(
            server=f"localhost:{self.relay.port}",
            node_name=f"node-{partition}",
            node_config={"partition-id": partition},
            root_certificates=self.ca,
            reconnect_for_s=10,
            region=self.relay.config.relay.region,
        )
        runtime = runtime_class(options, app)
        self.runtimes.append(runtime)
        self._spawn(runtime.run)

    def wait(self) -> None:
        for thread in self.threads:
            thread.join(timeout=30)
            assert not thread.is_alive(), "a relay or client did not exit after the run"
        assert not self.errors, self.errors


def relay_config(port: int, region: str, **sections: Any) -> RelayConfig:
    data: dict[str, Any] = {
        "relay": {"region": region},
        "upstream": {"address": f"localhost:{port}", "reconnect_for_s": 10},
        "server": {"address": "127.0.0.1:0", "heartbeat_interval_s": 0.5},
        "schedule": {"deadline_s": 20, "wait_for_clients_s": 5},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return RelayConfig.model_validate(data)


@pytest.fixture
def region() -> Iterator[Callable[..., RegionHandle]]:
    """``region(server, name, partitions)``: a relay with its clients connected, running."""

    def start(
        coordinator: ServerHandle,
        name: str,
        partitions: list[int],
        runtime_class: type[ClientRuntime] = ClientRuntime,
        app: ClientFactory | None = None,
        ca: Path | None = None,
        **sections: Any,
    ) -> RegionHandle:
        handle = RegionHandle(Relay(relay_config(coordinator.port, name, **sections)), ca)
        handle.relay.start()
        for partition in partitions:
            handle.add_client(partition, runtime_class, app or load_client_app(APP))
        deadline = time.monotonic() + 15
        while handle.relay.local_clients() < len(partitions):  # all in the first round
            assert time.monotonic() < deadline, "local clients did not connect"
            time.sleep(0.05)
        handle._spawn(handle.relay.run)
        return handle

    yield start


def coordinator_config(tmp_path: Path, **sections: Any) -> Any:
    base: dict[str, Any] = {
        "run": {"name": "relays", "rounds": 2, "seed": 5},
        "strategy": {"name": "fedavg", "clients_per_round": 2, "min_clients": 2},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return run_config(tmp_path, **base)


def _final(config: Any, run_id: int) -> tuple[dict[str, np.ndarray], Any]:
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        row = queries.latest_checkpoint(session, run_id)
        detail = queries.run_detail(session, run_id)
        assert row is not None
    weights, _ = CheckpointStore(Path(config.storage.checkpoints)).load(
        CheckpointRecord.from_row(row)
    )
    return weights, detail


def _run_regions(
    serve: Any, region: Callable[..., RegionHandle], config: Any, **sections: Any
) -> tuple[dict[str, np.ndarray], Any, list[int]]:
    """Run both regions to the end: final weights, the run's record, tasks per local client."""
    server = serve(config)
    handles = [region(server, name, parts, **sections) for name, parts in REGIONS.items()]
    result = server.wait(timeout=90)
    for handle in handles:
        handle.wait()
    assert result.status == "completed", result.error
    weights, detail = _final(config, result.run_id)
    return weights, detail, [r.tasks_done for h in handles for r in h.runtimes]


def test_relays_with_one_local_round_equal_flat_fedavg_exactly(
    tmp_path: Path, serve: Any, region: Callable[..., RegionHandle]
) -> None:
    hierarchical, detail, tasks = _run_regions(serve, region, coordinator_config(tmp_path / "tree"))
    assert tasks == [4] * 5  # every local client fitted and evaluated in both rounds
    np.testing.assert_array_equal(hierarchical["w"], np.full((4, 3), 2 * FLAT, np.float32))
    np.testing.assert_array_equal(hierarchical["b"], np.full(3, 2 * FLAT, np.float32))
    assert int(hierarchical["steps"]) == 2

    flat_config = coordinator_config(
        tmp_path / "flat", strategy={"clients_per_round": 5, "min_clients": 5}
    )
    server = serve(flat_config)
    for partition in REGIONS["a"] + REGIONS["b"]:
        server.add_client(partition)
    flat, _ = _final(flat_config, server.wait(timeout=60).run_id)
    for name in flat:
        np.testing.assert_array_equal(hierarchical[name], flat[name])

    # The coordinator saw two nodes, each weighted by its region's examples.
    fits = [p for p in detail.participations if p.kind == "fit"]
    assert {(p.node_name, p.node_region) for p in fits} == {("relay-a", "a"), ("relay-b", "b")}
    by_node = {(p.node_name, p.round_number): p for p in fits}
    assert by_node["relay-a", 1].num_examples == 10 * (1 + 3)
    assert by_node["relay-b", 2].num_examples == 10 * (2 + 5 + 9)
    assert by_node["relay-b", 1].metrics["relay_clients"] == 3
    # Federated evaluation went through the relays to every client (5 examples each).
    evals = {p.node_name: p for p in detail.participations if p.kind == "evaluate"}
    assert evals["relay-a"].num_examples == 10 and evals["relay-b"].num_examples == 15
    assert all(p.status == "ok" for p in detail.participations)
    # One copy of each model version per region crossed the WAN: v0 for round 1's fit, v1
    # for round 1's evaluation (then reused by round 2's fit), v2 for round 2's evaluation.
    for relay in ("relay-a", "relay-b"):
        downloads = [p.bytes_down for p in detail.participations if p.node_name == relay]
        assert len([b for b in downloads if b > 0]) == 3, downloads
        assert len(set(b for b in downloads if b > 0)) == 1, downloads


def test_two_local_rounds_per_global_round(
    tmp_path: Path, serve: Any, region: Callable[..., RegionHandle]
) -> None:
    weights, detail, _ = _run_regions(
        serve,
        region,
        coordinator_config(tmp_path, evaluation={"every": 0}),
        app=pull_app,
        relay={"local_rounds": 2},
    )
    # HierFAVG: two regional rounds from the global model, then regions weighted by their
    # examples (40 and 160).
    model = Fraction(0)
    for _ in range(2):
        moved = {name: _pulled(model, parts, 2) - model for name, parts in REGIONS.items()}
        model += (40 * moved["a"] + 160 * moved["b"]) / 200
    assert model.denominator <= 1 << 10  # exact in float32
    np.testing.assert_array_equal(weights["w"], np.full((4, 3), float(model), np.float32))
    assert int(weights["steps"]) == 4  # two local rounds in each of two global rounds
    fits = [p for p in detail.participations if p.kind == "fit"]
    assert all(p.status == "ok" and p.metrics["relay_rounds"] == 2 for p in fits)
    assert sorted({p.num_examples for p in fits}) == [40, 160]


def test_secure_aggregation_in_regions_and_among_relays(
    tmp_path: Path, serve: Any, region: Callable[..., RegionHandle]
) -> None:
    secure = {"enabled": True, "degree": "full", "max_examples": 1000, "stage_deadline_s": 10}
    config = coordinator_config(
        tmp_path, run={"rounds": 1}, evaluation={"every": 0}, secure_aggregation=secure
    )
    weights, detail, tasks = _run_regions(
        serve, region, config, relay={"min_clients": 2}, secure_aggregation=secure
    )
    assert tasks == [4] * 5  # advertise, share, masked fit and unmask at every relay
    np.testing.assert_allclose(weights["w"], np.full((4, 3), float(FLAT), np.float32), atol=1e-5)
    kinds = {(p.node_name, p.kind, p.status) for p in detail.participations}
    assert kinds == {
        (relay, kind, "ok")
        for relay in ("relay-a", "relay-b")
        for kind in ("advertise", "share", "fit", "unmask")
    }


def test_tls_between_clients_relays_and_coordinator(
    tmp_path: Path,
    serve: Any,
    region: Callable[..., RegionHandle],
    pki: dict[str, Path],  # noqa: F811 - the fixture imported above
) -> None:
    tls = {"cert": str(pki["cert"]), "key": str(pki["key"])}
    config = coordinator_config(
        tmp_path, run={"rounds": 1}, evaluation={"every": 0}, server={"tls": tls}
    )
    weights, _, tasks = _run_regions(
        serve,
        region,
        config,
        ca=pki["ca"],
        server={"tls": tls},
        upstream={"root_certificates": str(pki["ca"])},
    )
    np.testing.assert_array_equal(weights["w"], np.full((4, 3), float(FLAT), np.float32))
    assert tasks == [1] * 5


class _CrashError(Exception):
    """Stops a client runtime as a killed process would stop."""


class CrashInGlobalRoundTwo(ClientRuntime):
    """A client that dies on receiving a fit task of the coordinator's round 2."""

    def _handle(self, task: pb.Task) -> None:
        if task.kind == pb.TASK_KIND_FIT and scalar_map(task.config).get("global_round") == 2:
            raise _CrashError("crashed")
        super()._handle(task)

    def run(self) -> None:
        with contextlib.suppress(_CrashError):
            super().run()


def test_a_relay_losing_its_clients_does_not_break_the_run(
    tmp_path: Path, serve: Any, region: Callable[..., RegionHandle]
) -> None:
    config = coordinator_config(
        tmp_path,
        run={"rounds": 3},
        strategy={"clients_per_round": 2, "min_clients": 1},
        evaluation={"every": 0},
    )
    server = serve(config)
    steady = region(server, "a", REGIONS["a"])
    lossy = region(
        server, "b", REGIONS["b"], CrashInGlobalRoundTwo, schedule={"wait_for_clients_s": 1}
    )
    result = server.wait(timeout=90)
    steady.wait()
    lossy.wait()
    assert result.status == "completed", result.error
    weights, detail = _final(config, result.run_id)
    # Round 1 from both regions, rounds 2 and 3 from region a alone.
    expected = FLAT + 2 * _mean(REGIONS["a"])
    np.testing.assert_array_equal(weights["w"], np.full((4, 3), float(expected), np.float32))
    assert [r.status for r in detail.rounds] == ["committed"] * 3
    lost = {p.round_number: p for p in detail.participations if p.node_name == "relay-b"}
    assert lost[1].status == "ok"
    assert lost[2].status == "failed" and "no regional round committed" in (lost[2].reason or "")
    assert lost[3].status == "failed" and "too few local clients" in (lost[3].reason or "")


# ---------------------------------------------------------------- the command line


def test_relay_help_names_every_setting(tmp_path: Path) -> None:
    result = run_geofl(tmp_path, "relay", "--help")
    assert result.returncode == 0, result.stderr
    for flag in (
        "--server",
        "--region",
        "--listen",
        "--local-rounds",
        "--clients-per-round",
        "--min-clients",
        "--deadline",
        "--wait-for-clients",
        "--root-certificates",
        "--tls-cert",
        "--tls-key",
        "--config",
        "--set",
    ):
        assert flag in result.stdout
    assert "relay" in run_geofl(tmp_path, "--help").stdout


def test_relay_usage_errors_are_one_clear_message(tmp_path: Path) -> None:
    missing = run_geofl(tmp_path, "relay", "--server", "127.0.0.1:1", "--listen", "127.0.0.1:0")
    assert missing.returncode == ExitCode.USAGE
    assert "relay.region" in missing.stderr and "--region" in missing.stderr
    empty = run_geofl(
        tmp_path, "relay", "--server", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--region", ""
    )
    assert empty.returncode == ExitCode.USAGE and "relay.region" in empty.stderr
    for result in (missing, empty):
        assert "Traceback" not in result.stderr


def test_relay_on_a_busy_port_or_without_coordinator(tmp_path: Path) -> None:
    base = ("relay", "--region", "eu", "--server", f"127.0.0.1:{free_port()}")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_geofl(tmp_path, *base, "--listen", f"127.0.0.1:{port}")
    assert result.returncode == ExitCode.ADDRESS_IN_USE, result.stderr
    assert f"127.0.0.1:{port}" in result.stderr
    unreachable = run_geofl(tmp_path, *base, "--listen", "127.0.0.1:0", "--reconnect-for", "1")
    assert unreachable.returncode == ExitCode.SERVER_UNREACHABLE, unreachable.stderr
    assert "unreachable" in unreachable.stderr and "Traceback" not in unreachable.stderr


def _finish(processes: list[subprocess.Popen[str]], timeout: float = 60) -> list[tuple[int, str]]:
    """Each process's exit code and output (killed after ``timeout``); pipes closed."""
    finished = []
    for process in processes:
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        finished.append((process.returncode, output))
    return finished


def test_coordinator_relays_and_clients_as_processes(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(
        tmp_path,
        run={"name": "proc-relays", "rounds": 2, "seed": 3},
        server={"address": f"127.0.0.1:{port}", "heartbeat_interval_s": 0.5},
    )
    processes = [start_geofl(tmp_path, "server", "-c", str(config))]
    try:
        for name, partitions in REGIONS.items():
            listen = free_port()
            processes.append(
                start_geofl(
                    tmp_path,
                    "relay",
                    "--server",
                    f"127.0.0.1:{port}",
                    "--region",
                    name,
                    "--listen",
                    f"127.0.0.1:{listen}",
                    "--clients-per-round",
                    str(len(partitions)),
                    "--min-clients",
                    str(len(partitions)),
                    "--set",
                    "server.heartbeat_interval_s=0.5",
                )
            )
            processes += [
                start_geofl(
                    tmp_path,
                    "client",
                    "--server",
                    f"127.0.0.1:{listen}",
                    "--app",
                    APP,
                    "--region",
                    name,
                    "--name",
                    f"node-{p}",
                    "--node-config",
                    f"partition-id={p}",
                )
                for p in partitions
            ]
        finished = _finish(processes)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert [code for code, _ in finished] == [0] * len(processes), finished
    db = f"sqlite:///{tmp_path / 'runs' / 'geofl.db'}"
    shown = json.loads(run_geofl(tmp_path, "runs", "show", "1", "--db", db, "--json").stdout)
    assert [r["status"] for r in shown["rounds"]] == ["committed"] * 2
    assert {p["node_name"] for p in shown["participations"]} == {"relay-a", "relay-b"}
    with open_database(db, migrate=False) as database, database.session() as session:
        row = queries.latest_checkpoint(session, 1)
        assert row is not None
    weights, _ = CheckpointStore(tmp_path / "runs" / "checkpoints").load(
        CheckpointRecord.from_row(row)
    )
    np.testing.assert_array_equal(weights["w"], np.full((4, 3), 2 * FLAT, np.float32))


def test_simulate_with_one_relay_per_region(tmp_path: Path) -> None:
    link = {"share": 0.5, "rtt_ms": 0, "up_mbps": 100, "down_mbps": 100}
    config = write_config(
        tmp_path,
        simulation={"clients": 4, "app": APP, "relays": True, "regions": {"a": link, "b": link}},
    )
    result = run_geofl(tmp_path, "simulate", "-c", str(config), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "round 2/2 committed" in result.stderr
    db = f"sqlite:///{tmp_path / 'runs' / 'geofl.db'}"
    shown = json.loads(run_geofl(tmp_path, "runs", "show", "1", "--db", db, "--json").stdout)
    fits = [p for p in shown["participations"] if p["kind"] == "fit"]
    assert {(p["node_name"], p["node_region"]) for p in fits} == {
        ("relay-a", "a"),
        ("relay-b", "b"),
    }
    assert all(p["status"] == "ok" for p in fits)
    # Round 1 may start before a slow client process joins its relay; by round 2 all have.
    assert [p["metrics"]["relay_clients"] for p in fits if p["round_number"] == 2] == [2, 2]


def test_simulate_relays_need_regions_and_enough_relays(tmp_path: Path) -> None:
    config = write_config(tmp_path, simulation={"clients": 4, "app": APP, "relays": True})
    result = run_geofl(tmp_path, "simulate", "-c", str(config))
    assert result.returncode == ExitCode.USAGE and "simulation.regions" in result.stderr
    link = {"share": 1.0, "rtt_ms": 0, "up_mbps": 100, "down_mbps": 100}
    config = write_config(
        tmp_path, simulation={"clients": 4, "app": APP, "relays": True, "regions": {"a": link}}
    )
    result = run_geofl(tmp_path, "simulate", "-c", str(config))
    assert result.returncode == ExitCode.USAGE and "strategy.min_clients" in result.stderr
