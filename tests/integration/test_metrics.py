"""The Prometheus endpoint of live runs, scraped over HTTP and parsed by prometheus_client.

A test observer (subscribed after the metrics) scrapes the endpoint when each round ends,
while the run is still going; the figures must match what the run recorded in its
database: rounds committed, participations by kind and status, bytes by direction and
region, round durations (simulated ones on the virtual clock), connected nodes, staged
uploads. Runs: the coordinator on real gRPC with real clients (``geofl server``), and the
virtual clock (``geofl simulate``'s in-process path).
"""

from __future__ import annotations

import contextlib
import socket
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from geofl.client.runtime import ClientRuntime
from geofl.server.cli.exit_codes import ExitCode
from geofl.server.config import RunConfig
from geofl.server.coordinator import Coordinator
from geofl.server.rounds.observers import RoundObserver
from geofl.server.rounds.records import RoundRecord
from geofl.server.simulation.virtual import run_virtual_simulation
from geofl.storage.models import Node, Participation, Round
from tests.integration.conftest import run_config, run_rows
from tests.integration.processes import free_port, run_geofl, start_geofl, write_config
from tests.integration.test_secure_aggregation import crashing_at

REGIONS = {
    "near": {"share": 0.5, "rtt_ms": 20, "up_mbps": 8, "down_mbps": 40},
    "far": {"share": 0.5, "rtt_ms": 200, "up_mbps": 0.5, "down_mbps": 2},
}


def scrape(port: int) -> dict[str, list[Sample]]:
    """The endpoint's samples by metric family name (prometheus_client's own parser)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode("utf-8")
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def value(samples: Iterable[Sample], suffix: str = "", **labels: str) -> float:
    """The one sample whose name ends with ``suffix`` and whose labels include ``labels``."""
    found = [
        s.value
        for s in samples
        if s.name.endswith(suffix) and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (suffix, labels, list(samples))
    return found[0]


def total(samples: Iterable[Sample], suffix: str = "_total", **labels: str) -> float:
    """Sum of the samples ending with ``suffix`` whose labels include ``labels``."""
    return sum(
        s.value
        for s in samples
        if s.name.endswith(suffix) and all(s.labels.get(k) == v for k, v in labels.items())
    )


class Scraper(RoundObserver):
    """Scrapes the run's endpoint as each round ends (on the coordinator's loop)."""

    def __init__(self) -> None:
        self.coordinator: Coordinator | None = None
        self.scrapes: dict[int, dict[str, list[Sample]]] = {}
        self.port = 0

    def round_ended(self, record: RoundRecord, status: str) -> None:
        assert self.coordinator is not None
        port = self.coordinator.instruments.metrics_port
        assert port is not None
        self.port = port
        self.scrapes[record.number] = scrape(port)


def check_against_database(
    config: RunConfig,
    families: Mapping[str, list[Sample]],
    regions: Mapping[str | None, str] | None = None,
) -> tuple[list[Round], list[tuple[Participation, Node]]]:
    """The last scrape against the run's rows; ``regions`` maps node regions to labels."""
    _, rounds, pairs = run_rows(config)
    committed = [r for r in rounds if r.status == "committed"]
    assert value(families["geofl_rounds"], "_total", status="committed") == len(committed)
    assert value(families["geofl_round_last_committed"]) == committed[-1].number
    by_status = Counter((p.kind, p.status) for p, _ in pairs)
    for (kind, status), count in by_status.items():
        scraped = value(families["geofl_participations"], "_total", kind=kind, status=status)
        assert scraped == count, (kind, status)
    assert total(families["geofl_participations"]) == len(pairs)
    label = regions or {}
    for direction in ("up", "down"):
        wire = f"bytes_{direction}"
        raw = f"bytes_{direction}_raw"
        assert total(families["geofl_transfer_bytes"], direction=direction) == sum(
            getattr(p, wire) for p, _ in pairs
        )
        assert total(families["geofl_transfer_raw_bytes"], direction=direction) == sum(
            getattr(p, raw) or getattr(p, wire) for p, _ in pairs
        )
        for region, name in label.items():
            expected = sum(getattr(p, wire) for p, n in pairs if n.region == region)
            scraped = total(families["geofl_transfer_bytes"], direction=direction, region=name)
            assert scraped == expected, (direction, region)
    durations = families["geofl_round_duration_seconds"]
    assert value(durations, "_count", status="committed") == len(committed)
    return rounds, pairs


@pytest.fixture
def metrics_config(tmp_path: Path) -> Any:
    def make(**sections: Any) -> RunConfig:
        server = {"metrics": {"address": "127.0.0.1:0"}, **sections.pop("server", {})}
        return run_config(tmp_path, server=server, **sections)

    return make


def test_a_live_server_run_is_scraped_and_matches_its_database(
    metrics_config: Any, serve_coordinator: Any
) -> None:
    config = metrics_config(run={"name": "metrics-grpc", "rounds": 2, "seed": 1})
    scraper = Scraper()

    def make() -> Coordinator:
        scraper.coordinator = Coordinator(config, observers=[scraper])
        return scraper.coordinator

    handle = serve_coordinator(make)
    for partition in range(3):
        handle.add_client(partition, region="eu" if partition < 2 else "us")
    result = handle.wait()
    assert result.status == "completed"
    assert sorted(scraper.scrapes) == [1, 2]
    first, last = scraper.scrapes[1], scraper.scrapes[2]
    assert value(first["geofl_rounds"], "_total", status="committed") == 1
    rounds, pairs = check_against_database(config, last, {"eu": "eu", "us": "us"})
    fits_ok = sum(1 for p, _ in pairs if p.kind == "fit" and p.status == "ok")
    assert fits_ok == 6
    # Every accepted fit was staged durably before its ack; the ended rounds left none.
    assert value(last["geofl_staged_updates"], "_total") == fits_ok
    assert value(last["geofl_staged_updates_pending"]) == 0
    assert value(last["geofl_connected_nodes"], region="eu") == 2
    assert value(last["geofl_connected_nodes"], region="us") == 1
    info = last["geofl_run_info"][0].labels
    assert info["run_name"] == "metrics-grpc" and info["clock"] == "wall"
    assert info["run_id"] == str(result.run_id)
    # Every phase of a plain round was timed once per round.
    for phase in ("select", "broadcast", "fit", "aggregate", "evaluate", "commit"):
        assert value(last["geofl_phase_duration_seconds"], "_count", phase=phase) == 2
    assert value(last["geofl_round_loss"], source="eval") == pytest.approx(rounds[-1].eval_loss)
    assert value(last["geofl_upload_buffer_limit_bytes"]) == config.server.upload_buffer_bytes
    # The run is over: the endpoint is gone with it.
    with pytest.raises(urllib.error.URLError):
        scrape(scraper.port)


def test_a_virtual_clock_simulation_is_scraped_live(metrics_config: Any) -> None:
    config = metrics_config(
        run={"name": "metrics-virtual", "rounds": 3, "seed": 1},
        strategy={"name": "fedavg", "clients_per_round": 8, "min_clients": 2},
        schedule={"deadline_s": 600, "wait_for_clients_s": 5},
        evaluation={"every": 0, "server": "geofl_testapp:server_evaluate"},
        simulation={
            "clients": 8,
            "app": "geofl_testapp:virtual_app",
            "clock": "virtual",
            "workers": 0,
            "regions": REGIONS,
            "compute": {"samples_per_s": 1000.0},
        },
    )
    scraper = Scraper()
    outcome = run_virtual_simulation(
        config,
        observers=[scraper],
        on_start=lambda coordinator, links: setattr(scraper, "coordinator", coordinator),
    )
    assert outcome.result.status == "completed"
    assert sorted(scraper.scrapes) == [1, 2, 3]
    last = scraper.scrapes[3]
    rounds, _ = check_against_database(config, last, {"near": "near", "far": "far"})
    # Simulated seconds: the histogram's sum is the rounds' recorded (simulated) durations.
    durations = last["geofl_round_duration_seconds"]
    assert value(durations, "_sum", status="committed") == pytest.approx(
        sum(r.duration_s or 0.0 for r in rounds),
        abs=1e-5,  # the rows keep microseconds
    )
    assert total(last["geofl_connected_nodes"], "") == 8
    assert last["geofl_run_info"][0].labels["clock"] == "virtual"


def test_a_secure_aggregation_abort_is_counted_by_its_stage(
    metrics_config: Any, serve_coordinator: Any
) -> None:
    """Threshold = every client: one crash at unmask aborts round 1; round 2 commits."""
    config = metrics_config(
        run={"name": "metrics-secagg", "rounds": 2, "seed": 3},
        strategy={"name": "fedavg", "clients_per_round": 4, "min_clients": 2},
        schedule={"deadline_s": 30, "wait_for_clients_s": 30},
        evaluation={"every": 0},
        secure_aggregation={
            "enabled": True,
            "degree": "full",
            "threshold": 1.0,
            "max_examples": 1000,
            "stage_deadline_s": 20,
        },
    )
    scraper = Scraper()

    def make() -> Coordinator:
        scraper.coordinator = Coordinator(config, observers=[scraper])
        return scraper.coordinator

    handle = serve_coordinator(make)
    for partition in range(4):
        runtime = crashing_at("unmask") if partition == 0 else ClientRuntime
        handle.add_client(partition, runtime_class=runtime)
    assert handle.wait(timeout=120).status == "completed"
    after_abort, last = scraper.scrapes[1], scraper.scrapes[2]
    assert value(after_abort["geofl_secagg_aborts"], "_total", stage="unmask") == 1
    assert value(after_abort["geofl_rounds"], "_total", status="failed") == 1
    assert value(last["geofl_rounds"], "_total", status="committed") == 1
    assert total(last["geofl_secagg_aborts"]) == 1
    # Masked updates are not staged (they are useless without the round's SecAgg+ state).
    assert value(last["geofl_staged_updates"], "_total") == 0
    _, _, pairs = run_rows(config)
    stages = {p.kind for p, _ in pairs}
    assert {"advertise", "share", "unmask"} <= stages
    for kind in stages:
        assert total(last["geofl_participations"], kind=kind) == sum(
            1 for p, _ in pairs if p.kind == kind
        )


def test_geofl_simulate_on_the_wall_clock_serves_metrics_while_it_runs(tmp_path: Path) -> None:
    """The command line: real client processes, the endpoint scraped until the run exits."""
    port = free_port()
    config = write_config(tmp_path, server={"metrics": {"address": f"127.0.0.1:{port}"}})
    process = start_geofl(tmp_path, "simulate", "-c", str(config))
    scrapes: list[dict[str, list[Sample]]] = []
    try:
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(urllib.error.URLError, ConnectionError):
                scrapes.append(scrape(port))  # refused: not listening yet, or gone
            time.sleep(0.05)
        output, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, output
    assert f"metrics at http://127.0.0.1:{port}/metrics" in output
    assert scrapes, "the endpoint never answered while the run went on"
    info = scrapes[-1]["geofl_run_info"][0].labels
    assert info["run_name"] == "proc" and info["clock"] == "wall"
    committed = [total(s["geofl_rounds"], status="committed") for s in scrapes]
    assert committed == sorted(committed) and committed[-1] <= 2
    with pytest.raises(urllib.error.URLError):
        scrape(port)


def test_a_metrics_port_in_use_stops_the_server_with_exit_code_4(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_geofl(
            tmp_path,
            "server",
            "-c",
            str(config),
            "--set",
            f"server.metrics.address=127.0.0.1:{port}",
        )
    assert result.returncode == ExitCode.ADDRESS_IN_USE, result.stderr
    assert f"server.metrics.address 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr
