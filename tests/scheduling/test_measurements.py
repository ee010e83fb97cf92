"""LinkEstimator: recovering a known link from the tasks it carried, and staying robust.

Tasks are built on the link model the estimator documents (and the simulator implements):
a transfer of ``B`` bytes takes ``rtt/2 + 8 B / R`` (plus an optional jitter), training
takes ``samples / samples_per_s``.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Literal

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import TaskKindName, TaskRecord
from geofl.server.scheduling import LinkEstimate, LinkEstimator

SETTINGS = settings(max_examples=40, deadline=None)
NODE = 7
Status = Literal["ok", "failed", "rejected", "late", "dropped"]


@dataclass(frozen=True)
class Link:
    """A client's true link and compute speed."""

    rtt_s: float
    down_bps: float
    up_bps: float
    samples_per_s: float

    def transfer_s(self, nbytes: int, rate_bps: float, jitter_s: float = 0.0) -> float:
        return max(0.0, self.rtt_s / 2 + jitter_s) + 8 * nbytes / rate_bps


@dataclass(frozen=True)
class Work:
    """What one task moves and computes."""

    bytes_down: int
    bytes_up: int
    samples: int


REFERENCE = Link(rtt_s=0.2, down_bps=20e6, up_bps=5e6, samples_per_s=100.0)
MODEL = Work(bytes_down=4_000_000, bytes_up=2_000_000, samples=500)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """Futures for TaskRecord need a loop; nothing here runs it."""
    created = asyncio.new_event_loop()
    yield created
    created.close()


def _task(
    loop: asyncio.AbstractEventLoop,
    link: Link,
    work: Work,
    *,
    round_number: int = 1,
    kind: TaskKindName = "fit",
    start: float = 1000.0,
    jitter: tuple[float, float] = (0.0, 0.0),
    config: dict[str, int] | None = None,
) -> TaskRecord:
    """A task as the registry leaves it once the node downloaded, trained and uploaded."""
    downloaded = start + link.transfer_s(work.bytes_down, link.down_bps, jitter[0])
    compute = work.samples / link.samples_per_s
    settled = downloaded + compute + link.transfer_s(work.bytes_up, link.up_bps, jitter[1])
    return TaskRecord(
        task_id=round_number,
        node_id=NODE,
        kind=kind,
        round=round_number,
        model_version=round_number,
        config=dict(config or {}),
        deadline=math.inf,
        future=loop.create_future(),
        issued_at=start - 30.0,  # a long poll's wait: must not read as latency
        started_at=start,
        bytes_down=work.bytes_down,
        settled_at=settled,
        downloaded_at=downloaded,
    )


def _ok(link: Link, work: Work, *, kind: str = "fit") -> Outcome:
    return Outcome(
        "ok",
        num_examples=work.samples,
        metrics={"samples_trained": work.samples} if kind == "fit" else {},
        compute_s=work.samples / link.samples_per_s,
        bytes_up=work.bytes_up,
    )


def _fit(estimator: LinkEstimator, loop: asyncio.AbstractEventLoop, link: Link, work: Work) -> None:
    round_number = (estimator.estimate(NODE).last_round or 0) + 1
    estimator.observe(_task(loop, link, work, round_number=round_number), _ok(link, work))


def _close(value: float | None, truth: float, rel: float) -> bool:
    return value is not None and abs(value - truth) <= rel * truth


links = st.builds(
    Link,
    rtt_s=st.floats(0.005, 0.6),
    down_bps=st.floats(1e6, 1e9),
    up_bps=st.floats(1e5, 1e8),
    samples_per_s=st.floats(5.0, 5e4),
)
#: Seconds of serialization and compute per task; bytes and samples follow from the link.
durations = st.tuples(st.floats(0.5, 30.0), st.floats(0.5, 30.0), st.floats(0.5, 60.0))


def _work(link: Link, seconds: tuple[float, float, float]) -> Work:
    down_s, up_s, compute_s = seconds
    return Work(
        bytes_down=max(1, round(down_s * link.down_bps / 8)),
        bytes_up=max(1, round(up_s * link.up_bps / 8)),
        samples=max(1, round(compute_s * link.samples_per_s)),
    )


@SETTINGS
@given(link=links, seconds=durations, seed=st.integers(0, 2**32 - 1))
@example(link=REFERENCE, seconds=(1.6, 3.2, 5.0), seed=0)
def test_recovers_a_known_link_with_handshakes(
    loop: asyncio.AbstractEventLoop, link: Link, seconds: tuple[float, float, float], seed: int
) -> None:
    rng = random.Random(seed)
    work = _work(link, seconds)
    estimator = LinkEstimator()
    for round_number in range(1, 9):
        estimator.observe_handshake(NODE, link.rtt_s * rng.uniform(0.97, 1.03))
        jitter = (rng.uniform(-0.05, 0.05) * link.rtt_s, rng.uniform(-0.05, 0.05) * link.rtt_s)
        task = _task(loop, link, work, round_number=round_number, jitter=jitter)
        estimator.observe(task, _ok(link, work))
    got = estimator.estimate(NODE)
    assert _close(got.rtt_s, link.rtt_s, 0.03)
    # A rate sample's serialization time is off by the jitter plus half the RTT's error:
    # at most 0.065 rtt over at least min(seconds); the averages stay within that.
    off = 0.065 * link.rtt_s / min(seconds[:2])
    assert _close(got.down_bps, link.down_bps, off / (1 - off) + 1e-6)
    assert _close(got.up_bps, link.up_bps, off / (1 - off) + 1e-6)
    assert _close(got.samples_per_s, link.samples_per_s, 1e-6)
    assert got.availability == 1.0 and got.observations == 8 and got.last_round == 8


def test_the_reference_link_within_a_few_percent(loop: asyncio.AbstractEventLoop) -> None:
    """RTT 0.2 s, 20 Mbit/s down, 5 Mbit/s up, 100 samples/s, measured with jitter."""
    rng = random.Random(5)
    estimator = LinkEstimator()
    for _ in range(6):
        estimator.observe_handshake(NODE, 0.2 * rng.uniform(0.95, 1.05))
        jitter = (rng.uniform(-0.02, 0.02), rng.uniform(-0.02, 0.02))
        round_number = (estimator.estimate(NODE).last_round or 0) + 1
        task = _task(loop, REFERENCE, MODEL, round_number=round_number, jitter=jitter)
        estimator.observe(task, _ok(REFERENCE, MODEL))
    got = estimator.estimate(NODE)
    assert got.rtt_s == pytest.approx(0.2, rel=0.05)
    assert got.down_bps == pytest.approx(20e6, rel=0.03)
    assert got.up_bps == pytest.approx(5e6, rel=0.03)
    assert got.samples_per_s == pytest.approx(100.0, rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(link=links, seconds=durations)
@example(link=REFERENCE, seconds=(1.6, 3.2, 5.0))
def test_without_handshakes_rtt_comes_from_small_transfers(
    loop: asyncio.AbstractEventLoop, link: Link, seconds: tuple[float, float, float]
) -> None:
    """Each round a fit (large transfers) and an evaluation (no result payload)."""
    work = _work(link, seconds)
    evaluation = replace(work, bytes_up=0)
    estimator = LinkEstimator()
    for round_number in range(1, 25):
        fit = _task(loop, link, work, round_number=round_number)
        estimator.observe(fit, _ok(link, work))
        assessed = _task(loop, link, evaluation, round_number=round_number, kind="evaluate")
        estimator.observe(assessed, _ok(link, evaluation, kind="evaluate"))
    got = estimator.estimate(NODE)
    assert _close(got.rtt_s, link.rtt_s, 1e-6)
    assert _close(got.down_bps, link.down_bps, 0.02)
    assert _close(got.up_bps, link.up_bps, 0.02)
    assert _close(got.samples_per_s, link.samples_per_s, 1e-6)


def test_without_any_latency_sample_rates_are_effective_and_predict_exactly(
    loop: asyncio.AbstractEventLoop,
) -> None:
    estimator = LinkEstimator()
    for _ in range(3):
        _fit(estimator, loop, REFERENCE, MODEL)
    got = estimator.estimate(NODE)
    assert got.rtt_s is None
    down_s = REFERENCE.transfer_s(MODEL.bytes_down, REFERENCE.down_bps)
    assert got.down_bps == pytest.approx(8 * MODEL.bytes_down / down_s)  # latency included
    predicted = estimator.predict_round_s(NODE, MODEL.bytes_down, MODEL.bytes_up, MODEL.samples)
    task = _task(loop, REFERENCE, MODEL)
    assert task.settled_at is not None and task.started_at is not None
    assert predicted == pytest.approx(task.settled_at - task.started_at)


def test_estimates_are_none_before_data() -> None:
    estimator = LinkEstimator()
    assert estimator.estimate(NODE) == LinkEstimate(NODE)
    assert estimator.estimates() == {} and estimator.snapshot() == []
    assert estimator.predict_round_s(NODE, 100, 100, 10) is None
    estimator.observe_handshake(NODE, 0.05)
    got = estimator.estimate(NODE)
    assert got.rtt_s == 0.05
    assert (got.down_bps, got.up_bps, got.samples_per_s, got.availability) == (None,) * 4
    assert got.observations == 0 and got.last_round is None
    assert estimator.predict_round_s(NODE, 100, 0, 0) is None  # no downlink rate yet
    assert estimator.predict_round_s(NODE, 0, 0, 0) == pytest.approx(0.05)


def test_a_dropped_task_gives_availability_only(loop: asyncio.AbstractEventLoop) -> None:
    estimator = LinkEstimator()
    task = _task(loop, REFERENCE, MODEL)
    task.downloaded_at = task.settled_at = None
    estimator.observe(task, Outcome("dropped", "went offline"))
    got = estimator.estimate(NODE)
    assert got.availability == 0.0 and got.observations == 1 and got.last_round == 1
    assert (got.rtt_s, got.down_bps, got.up_bps, got.samples_per_s) == (None,) * 4


def test_availability_follows_drops(loop: asyncio.AbstractEventLoop) -> None:
    estimator = LinkEstimator(alpha=0.3)
    statuses: list[Status] = ["ok", "failed", "dropped", "late", "rejected", "ok"]
    expected = 1.0
    for number, status in enumerate(statuses, start=1):
        task = _task(loop, REFERENCE, MODEL, round_number=number)
        outcome = _ok(REFERENCE, MODEL) if status == "ok" else Outcome(status, "why")
        estimator.observe(task, outcome)
        present = 0.0 if status in ("dropped", "late") else 1.0
        expected = present if number == 1 else 0.7 * expected + 0.3 * present
        assert estimator.estimate(NODE).availability == pytest.approx(expected)
    assert estimator.estimate(NODE).availability == pytest.approx(0.7 * 0.7 * 0.49 + 0.51)


def test_an_outlier_moves_an_estimate_by_a_bounded_step(loop: asyncio.AbstractEventLoop) -> None:
    estimator = LinkEstimator()
    estimator.observe_handshake(NODE, REFERENCE.rtt_s)
    for _ in range(3):
        _fit(estimator, loop, REFERENCE, MODEL)
    assert estimator.estimate(NODE).up_bps == pytest.approx(5e6)
    # One upload that took 100 times as long (a stalled connection): clipped to 0.2x.
    stalled = replace(REFERENCE, up_bps=REFERENCE.up_bps / 100)
    round_number = (estimator.estimate(NODE).last_round or 0) + 1
    task = _task(loop, stalled, MODEL, round_number=round_number)
    estimator.observe(task, _ok(stalled, MODEL))
    assert estimator.estimate(NODE).up_bps == pytest.approx(5e6 * (0.7 + 0.3 * 0.2))
    # A hundredfold faster one is clipped to 5x.
    estimator = LinkEstimator()
    estimator.observe_handshake(NODE, REFERENCE.rtt_s)
    _fit(estimator, loop, REFERENCE, MODEL)
    _fit(estimator, loop, replace(REFERENCE, down_bps=REFERENCE.down_bps * 100), MODEL)
    assert estimator.estimate(NODE).down_bps == pytest.approx(20e6 * (0.7 + 0.3 * 5))
    for _ in range(12):
        _fit(estimator, loop, REFERENCE, MODEL)
    assert estimator.estimate(NODE).down_bps == pytest.approx(20e6, rel=0.03)


def test_small_results_measure_latency_not_throughput(loop: asyncio.AbstractEventLoop) -> None:
    """Evaluation results of a few hundred bytes must not drag the uplink rate down."""
    estimator = LinkEstimator()
    estimator.observe_handshake(NODE, REFERENCE.rtt_s)
    _fit(estimator, loop, REFERENCE, MODEL)
    # On a real network the result's trip holds a whole RTT, not the model's half.
    slow_result = replace(REFERENCE, rtt_s=2 * REFERENCE.rtt_s)
    result = replace(MODEL, bytes_up=300)
    for number in range(2, 6):
        task = _task(loop, slow_result, result, round_number=number, kind="evaluate")
        estimator.observe(task, _ok(slow_result, result, kind="evaluate"))
    assert estimator.estimate(NODE).up_bps == pytest.approx(5e6)


def test_a_first_small_transfer_is_replaced_by_the_first_payload(
    loop: asyncio.AbstractEventLoop,
) -> None:
    estimator = LinkEstimator()
    estimator.observe_handshake(NODE, REFERENCE.rtt_s)
    result = replace(MODEL, bytes_up=300)
    jittered = _task(loop, REFERENCE, result, kind="evaluate", jitter=(0.0, -0.09))
    estimator.observe(jittered, _ok(REFERENCE, result, kind="evaluate"))
    # Jitter made it arrive before half an RTT had passed: the time is floored at ε.
    assert estimator.estimate(NODE).up_bps == pytest.approx(8 * 300 / 1e-3)
    _fit(estimator, loop, REFERENCE, MODEL)  # 2 MB: far larger than anything before
    assert estimator.estimate(NODE).up_bps == pytest.approx(5e6)


def test_a_faster_link_is_followed(loop: asyncio.AbstractEventLoop) -> None:
    estimator = LinkEstimator()
    estimator.observe_handshake(NODE, REFERENCE.rtt_s)
    _fit(estimator, loop, REFERENCE, MODEL)
    faster = replace(REFERENCE, down_bps=REFERENCE.down_bps * 100)  # now latency-bound
    for _ in range(15):
        _fit(estimator, loop, faster, MODEL)
    assert estimator.estimate(NODE).down_bps == pytest.approx(2e9, rel=0.03)


def test_a_lasting_change_is_followed(loop: asyncio.AbstractEventLoop) -> None:
    estimator = LinkEstimator()
    estimator.observe_handshake(NODE, REFERENCE.rtt_s)
    _fit(estimator, loop, REFERENCE, MODEL)
    slower = replace(REFERENCE, down_bps=2e6, samples_per_s=30.0)
    for _ in range(25):
        _fit(estimator, loop, slower, MODEL)
    got = estimator.estimate(NODE)
    assert got.down_bps == pytest.approx(2e6, rel=0.02)
    assert got.samples_per_s == pytest.approx(30.0, rel=0.02)


def test_the_handshake_rtt_supersedes_transfer_latencies(
    loop: asyncio.AbstractEventLoop,
) -> None:
    estimator = LinkEstimator()
    evaluation = replace(MODEL, bytes_up=0)
    estimator.observe(_task(loop, REFERENCE, MODEL), _ok(REFERENCE, MODEL))
    estimator.observe(
        _task(loop, REFERENCE, evaluation, kind="evaluate"),
        _ok(REFERENCE, evaluation, kind="evaluate"),
    )
    assert estimator.estimate(NODE).rtt_s == pytest.approx(0.2)
    estimator.observe_handshake(NODE, 0.35)
    assert estimator.estimate(NODE).rtt_s == pytest.approx(0.35)


def test_compute_speed_from_epochs_and_only_from_fits(loop: asyncio.AbstractEventLoop) -> None:
    estimator = LinkEstimator()
    work = Work(bytes_down=0, bytes_up=1000, samples=300)  # 3 epochs over 100 examples
    task = _task(loop, REFERENCE, work, config={"local_epochs": 3})
    estimator.observe(task, replace(_ok(REFERENCE, work), num_examples=100, metrics={}))
    assert estimator.estimate(NODE).samples_per_s == pytest.approx(100.0)
    evaluation = _task(loop, REFERENCE, work, kind="evaluate")
    estimator.observe(evaluation, replace(_ok(REFERENCE, work), compute_s=99.0))
    assert estimator.estimate(NODE).samples_per_s == pytest.approx(100.0)


def test_unusable_timings_and_reports_give_no_samples(loop: asyncio.AbstractEventLoop) -> None:
    estimator = LinkEstimator()
    task = _task(loop, REFERENCE, MODEL)
    assert task.started_at is not None
    task.downloaded_at = task.started_at - 1.0  # the wall clock stepped back
    estimator.observe(task, replace(_ok(REFERENCE, MODEL), compute_s=-5.0))
    held = _task(loop, REFERENCE, replace(MODEL, bytes_down=0))  # held the model: no download
    estimator.observe(held, replace(_ok(REFERENCE, MODEL), compute_s=None))
    got = estimator.estimate(NODE)
    assert (got.rtt_s, got.down_bps, got.up_bps, got.samples_per_s) == (None,) * 4
    assert got.observations == 2 and got.availability == 1.0


def test_predict_round_s_follows_the_link_model(loop: asyncio.AbstractEventLoop) -> None:
    estimator = LinkEstimator()
    estimator.observe_handshake(NODE, REFERENCE.rtt_s)
    _fit(estimator, loop, REFERENCE, MODEL)
    predicted = estimator.predict_round_s(NODE, 10_000_000, 1_000_000, 2000)
    expected = 0.2 + 8 * 10_000_000 / 20e6 + 2000 / 100 + 8 * 1_000_000 / 5e6
    assert predicted == pytest.approx(expected)
    assert estimator.predict_round_s(NODE + 1, 1, 1, 1) is None
    with pytest.raises(ValueError, match="upload_bytes"):
        estimator.predict_round_s(NODE, 1, -1, 1)
    with pytest.raises(ValueError, match="samples"):
        estimator.predict_round_s(NODE, 1, 1, -1)


def test_snapshot_and_load_round_trip(loop: asyncio.AbstractEventLoop) -> None:
    estimator = LinkEstimator()
    estimator.observe_handshake(NODE, 0.1)
    _fit(estimator, loop, REFERENCE, MODEL)
    estimator.observe_handshake(NODE + 1, 0.4)
    restored = LinkEstimator()
    restored.load(estimator.snapshot())
    assert restored.estimates() == estimator.estimates()
    assert [e.node_id for e in restored.snapshot()] == [NODE, NODE + 1]
    # A loaded RTT is a starting point that a handshake replaces.
    restored.observe_handshake(NODE, 0.3)
    assert restored.estimate(NODE).rtt_s == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"down_bps": -1.0}, "down_bps must be a finite number >= 0"),
        ({"rtt_s": math.nan}, "rtt_s must be a finite number >= 0"),
        ({"availability": 1.5}, "availability 1.5 is above 1"),
        ({"observations": -1}, "observations -1 is negative"),
    ],
)
def test_load_rejects_bad_rows(change: dict[str, float], message: str) -> None:
    valid = LinkEstimate(NODE, rtt_s=0.1, availability=1.0, observations=1)
    row = replace(valid, **change)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        LinkEstimator().load([row])


def test_load_rejects_a_node_twice_and_keeps_its_state() -> None:
    estimator = LinkEstimator()
    estimator.observe_handshake(NODE, 0.1)
    with pytest.raises(ValueError, match=f"node {NODE} appears twice"):
        estimator.load([LinkEstimate(NODE, rtt_s=0.5), LinkEstimate(NODE)])
    assert estimator.estimate(NODE).rtt_s == 0.1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": 1.5}, "alpha"),
        ({"clip_low": 2.0}, "clip_low"),
        ({"clip_high": 0.5}, "clip_high"),
        ({"min_transfer_s": 0.0}, "min_transfer_s"),
        ({"max_serialization_share": 1.0}, "max_serialization_share"),
        ({"payload_fraction": 0.0}, "payload_fraction"),
        ({"latency_window": 0}, "latency_window"),
    ],
)
def test_bad_parameters_are_named(arguments: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LinkEstimator(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize("rtt_s", [-0.1, math.inf, math.nan])
def test_a_bad_handshake_is_refused(rtt_s: float) -> None:
    with pytest.raises(ValueError, match="rtt_s must be a finite number >= 0"):
        LinkEstimator().observe_handshake(NODE, rtt_s)
