"""The metrics observer and endpoint in isolation: what each event does to the families.

The live runs (tests/integration/test_metrics.py) check the figures against a database;
these cover what those runs cannot provoke cheaply: staging failures, nodes leaving,
failures that are not secure-aggregation aborts, an address in use, two runs in one
process.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from geofl.server.config.metrics import MetricsConfig
from geofl.server.metrics import (
    MetricsAddressError,
    MetricsEndpoint,
    MetricsObserver,
    RunMetrics,
    UploadBufferCollector,
)
from geofl.server.metrics.observer import NO_REGION
from geofl.server.models.spool import MemoryBudget
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import Registry, TaskRecord
from geofl.server.rounds.records import Phase, RoundRecord, secagg_abort_reason


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


@pytest.fixture
def nodes() -> Registry:
    registry = Registry(heartbeat_interval_s=1.0)
    registry.add(1, "a", "eu", {})
    registry.add(2, "b", "eu", {})
    registry.add(3, "c", None, {})
    return registry


@pytest.fixture
def observed(nodes: Registry) -> Iterator[tuple[MetricsObserver, CollectorRegistry]]:
    collectors = CollectorRegistry()
    observer = MetricsObserver(RunMetrics(collectors), nodes)
    yield observer, collectors
    observer.close()


def task(node_id: int, round_number: int = 1, *, down: int = 0) -> TaskRecord:
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
    finally:
        loop.close()
    return TaskRecord(
        1, node_id, "fit", round_number, 0, {}, 0.0, future, bytes_down=down, bytes_down_raw=down
    )


def test_connected_nodes_are_counted_by_region_and_fall_to_zero(
    nodes: Registry, observed: tuple[MetricsObserver, CollectorRegistry]
) -> None:
    observer, collectors = observed
    assert sample(collectors, "geofl_connected_nodes", region="eu") == 2
    assert sample(collectors, "geofl_connected_nodes", region=NO_REGION) == 1
    for session in nodes.online():
        session.online = False
    observer.recount_nodes()
    assert sample(collectors, "geofl_connected_nodes", region="eu") == 0
    assert sample(collectors, "geofl_connected_nodes", region=NO_REGION) == 0


def test_bytes_are_labelled_with_the_nodes_region(
    observed: tuple[MetricsObserver, CollectorRegistry],
) -> None:
    observer, collectors = observed
    observer.round_started(1, 3)
    observer.task_settled(1, task(1, down=100), Outcome("ok", bytes_up=40, bytes_up_raw=80))
    observer.task_settled(1, task(3, down=100), Outcome("late", bytes_up=0))
    assert sample(collectors, "geofl_transfer_bytes_total", direction="up", region="eu") == 40
    assert sample(collectors, "geofl_transfer_raw_bytes_total", direction="up", region="eu") == 80
    assert (
        sample(collectors, "geofl_transfer_bytes_total", direction="down", region=NO_REGION) == 100
    )
    assert sample(collectors, "geofl_participations_total", kind="fit", status="late") == 1


def test_only_secure_aggregation_aborts_count_as_aborts(
    observed: tuple[MetricsObserver, CollectorRegistry],
) -> None:
    observer, collectors = observed
    for number, reason in (
        (1, secagg_abort_reason("share", "2 of 5 clients left, threshold 3")),
        (2, "1 of 3 clients succeeded, min_clients is 2"),
    ):
        record = RoundRecord(number, phase_durations={"select": 0.5, "fit": 2.0})
        observer.round_started(number, 5)
        observer.phase(number, Phase.FAILED, 0.1)
        observer.round_failed(record, reason)
        observer.round_ended(record, f"failed: {reason}")
    assert sample(collectors, "geofl_secagg_aborts_total", stage="share") == 1
    assert sample(collectors, "geofl_rounds_total", status="failed") == 2
    assert sample(collectors, "geofl_round_duration_seconds_count", status="failed") == 2
    assert sample(collectors, "geofl_phase_duration_seconds_sum", phase="fit") == 4.0
    assert sample(collectors, "geofl_round_phase", geofl_round_phase="idle") == 1


def test_staging_is_counted_and_a_failure_goes_through(
    observed: tuple[MetricsObserver, CollectorRegistry],
) -> None:
    observer, collectors = observed

    async def stage(task: TaskRecord, outcome: Outcome) -> None:
        if outcome.status != "ok":
            raise OSError("disk full")

    timed = observer.timed_staging(stage)
    asyncio.run(timed(task(1, 4), Outcome("ok")))
    with pytest.raises(OSError, match="disk full"):
        asyncio.run(timed(task(2, 4), Outcome("failed")))
    observer.resumed_updates(4, 2)
    assert sample(collectors, "geofl_staged_updates_total") == 1
    assert sample(collectors, "geofl_staging_failures_total") == 1
    assert sample(collectors, "geofl_staging_duration_seconds_count") == 1
    assert sample(collectors, "geofl_staged_updates_pending") == 3
    observer.round_started(4, 2)
    observer.round_ended(RoundRecord(4), "committed")
    assert sample(collectors, "geofl_staged_updates_pending") == 0


def test_the_upload_buffer_is_read_at_scrape_time() -> None:
    budget = MemoryBudget(1000)
    collectors = CollectorRegistry()
    collectors.register(UploadBufferCollector(budget))
    assert budget.take(300)
    assert sample(collectors, "geofl_upload_buffer_used_bytes") == 300
    budget.give_back(300)
    assert sample(collectors, "geofl_upload_buffer_used_bytes") == 0
    assert sample(collectors, "geofl_upload_buffer_peak_bytes") == 300
    assert sample(collectors, "geofl_upload_buffer_limit_bytes") == 1000


def test_two_runs_in_one_process_keep_their_own_figures(nodes: Registry) -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    one, two = MetricsObserver(RunMetrics(first), nodes), MetricsObserver(RunMetrics(second), nodes)
    one.round_started(1, 3)
    one.round_ended(RoundRecord(1), "committed")
    assert sample(first, "geofl_rounds_total", status="committed") == 1
    assert sample(second, "geofl_rounds_total", status="committed") is None
    one.close()
    two.close()


def test_an_address_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        endpoint = MetricsEndpoint(MetricsConfig(address=f"127.0.0.1:{port}"), CollectorRegistry())
        with pytest.raises(MetricsAddressError, match=f"server.metrics.address 127.0.0.1:{port}"):
            endpoint.start()


def test_the_endpoint_binds_port_zero_and_stops() -> None:
    endpoint = MetricsEndpoint(MetricsConfig(address="127.0.0.1:0"), CollectorRegistry())
    port = endpoint.start()
    assert port > 0 and endpoint.url == f"http://127.0.0.1:{port}/metrics"
    endpoint.stop()
    with socket.socket() as again:  # the port is free again
        again.bind(("127.0.0.1", port))
