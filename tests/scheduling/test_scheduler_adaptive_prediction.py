"""Scheduler: with adaptive compression, selection predicts the chain the client will get.

Links are measured the way the round engine measures them: one fit task on the link
model ``rtt/2 + 8 B / R`` per transfer (raw upload) and a handshake for the RTT, fed to
:meth:`Scheduler.observe`.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.protocols.compression import UploadPlan
from geofl.server.config.schedule import SelectionConfig
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import NodeSession, TaskRecord
from geofl.server.scheduling.adaptive import DEFAULT_LADDER, ChainOption
from geofl.server.scheduling.scheduler import Scheduler, SchedulerSettings

MODEL_BYTES = 4_000_000  # 32 Mbit
SAMPLES = 500
DEADLINE_S = 10.0
MARGIN = 0.9
CUTOFF_S = MARGIN * DEADLINE_S
SMALLEST = min(DEFAULT_LADDER, key=lambda o: o.ratio)


@dataclass(frozen=True)
class Link:
    """A client's true link and compute speed."""

    rtt_s: float
    down_bps: float
    up_bps: float
    samples_per_s: float

    def transfer_s(self, nbytes: float, rate_bps: float) -> float:
        return self.rtt_s / 2 + 8 * nbytes / rate_bps

    def round_s(self, upload_bytes: float) -> float:
        """One fit's seconds: download the model, train, upload ``upload_bytes``."""
        return (
            self.transfer_s(MODEL_BYTES, self.down_bps)
            + SAMPLES / self.samples_per_s
            + self.transfer_s(upload_bytes, self.up_bps)
        )


def _link(up_bps: float) -> Link:
    return Link(rtt_s=0.1, down_bps=100e6, up_bps=up_bps, samples_per_s=500.0)


#: Raw: 0.05 + 0.32 + 1 + 0.05 + 8 = 9.42 s, late; fp16 (~4 s upload) fits the 9 s cutoff.
COMPRESSIBLE = _link(4e6)
#: Even the smallest chain (~270 kbit) takes ~13 s to upload.
HOPELESS = _link(2e4)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """Futures for TaskRecord need a loop; nothing here runs it."""
    created = asyncio.new_event_loop()
    yield created
    created.close()


def _scheduler(*, adaptive: bool) -> Scheduler:
    selection = SelectionConfig(policy="deadline", margin=MARGIN, exploration=0.0)
    return Scheduler(
        SchedulerSettings(
            selection=selection,
            deadline_s=DEADLINE_S,
            over_select=1.0,
            model_bytes=MODEL_BYTES,
            adaptive=adaptive,
        )
    )


def _measure(
    scheduler: Scheduler, loop: asyncio.AbstractEventLoop, node_id: int, link: Link
) -> None:
    """One raw-upload fit of ``node_id`` over ``link``, settled ok, plus a handshake."""
    scheduler.estimator.observe_handshake(node_id, link.rtt_s)
    start = 1000.0
    compute_s = SAMPLES / link.samples_per_s
    downloaded = start + link.transfer_s(MODEL_BYTES, link.down_bps)
    task = TaskRecord(
        task_id=node_id,
        node_id=node_id,
        kind="fit",
        round=1,
        model_version=1,
        config={},
        deadline=math.inf,
        future=loop.create_future(),
        issued_at=start,
        started_at=start,
        bytes_down=MODEL_BYTES,
        downloaded_at=downloaded,
        settled_at=downloaded + compute_s + link.transfer_s(MODEL_BYTES, link.up_bps),
    )
    outcome = Outcome(
        "ok",
        num_examples=SAMPLES,
        loss=0.5,
        metrics={"samples_trained": SAMPLES},
        compute_s=compute_s,
        bytes_up=MODEL_BYTES,
    )
    scheduler.observe(task, outcome)


def _session(node_id: int) -> NodeSession:
    return NodeSession(node_id, f"node-{node_id}", "eu", {}, f"token-{node_id}")


def _ratio(plan: UploadPlan | None) -> float:
    """The ladder ratio of the chain a plan carries (None: raw)."""
    chain = () if plan is None else plan.chain
    return next(o.ratio for o in DEFAULT_LADDER if o.chain == chain)


def test_adaptive_predicts_the_compressed_upload_and_selects_the_client(
    loop: asyncio.AbstractEventLoop,
) -> None:
    scheduler = _scheduler(adaptive=True)
    _measure(scheduler, loop, 1, COMPRESSIBLE)
    _measure(scheduler, loop, 2, HOPELESS)

    plan = scheduler.upload_plan(_session(1), None)
    assert plan is not None and plan.chain == DEFAULT_LADDER[1].chain  # fp16
    predicted = scheduler.predict_s(1)
    assert predicted == pytest.approx(COMPRESSIBLE.round_s(DEFAULT_LADDER[1].ratio * MODEL_BYTES))
    assert predicted is not None and predicted <= CUTOFF_S

    choice = scheduler.choose([_session(1), _session(2)], 1, 1, random.Random(0))
    assert [s.node_id for s in choice.sessions] == [1]
    assert choice.plan is not None and choice.plan.fallback is None
    assert [p.reason for p in choice.plan.selected] == ["fits"]


def test_without_adaptive_the_same_client_is_predicted_late(
    loop: asyncio.AbstractEventLoop,
) -> None:
    scheduler = _scheduler(adaptive=False)
    _measure(scheduler, loop, 1, COMPRESSIBLE)

    assert scheduler.predict_s(1) == pytest.approx(COMPRESSIBLE.round_s(MODEL_BYTES))
    assert COMPRESSIBLE.round_s(MODEL_BYTES) > CUTOFF_S
    default = UploadPlan(DEFAULT_LADDER[2].chain)
    assert scheduler.upload_plan(_session(1), default) is default
    choice = scheduler.choose([_session(1)], 1, 1, random.Random(0))
    assert choice.plan is not None and choice.plan.fallback is not None
    assert [p.reason for p in choice.plan.selected] == ["fallback-fastest"]


def test_too_slow_for_any_chain_is_late_with_the_smallest_upload(
    loop: asyncio.AbstractEventLoop,
) -> None:
    scheduler = _scheduler(adaptive=True)
    _measure(scheduler, loop, 2, HOPELESS)

    plan = scheduler.upload_plan(_session(2), None)
    assert plan is not None and plan.chain == SMALLEST.chain
    predicted = scheduler.predict_s(2)
    assert predicted == pytest.approx(HOPELESS.round_s(SMALLEST.ratio * MODEL_BYTES))
    assert predicted is not None and predicted > CUTOFF_S


def test_unmeasured_client_stays_unpredicted_and_gets_the_default() -> None:
    scheduler = _scheduler(adaptive=True)
    default = UploadPlan(DEFAULT_LADDER[1].chain)
    assert scheduler.predict_s(3) is None
    assert scheduler.upload_plan(_session(3), default) is default


def _fits(link: Link, option: ChainOption) -> bool:
    return link.round_s(option.ratio * MODEL_BYTES) <= CUTOFF_S


@settings(max_examples=40, deadline=None)
@given(
    up_bps=st.floats(1e4, 1e9),
    down_bps=st.floats(1e6, 1e9),
    rtt_s=st.floats(0.0, 0.5),
    samples_per_s=st.floats(100.0, 1e5),
)
def test_prediction_uses_the_chain_upload_plan_hands_out(
    up_bps: float, down_bps: float, rtt_s: float, samples_per_s: float
) -> None:
    link = Link(rtt_s, down_bps, up_bps, samples_per_s)
    scheduler = _scheduler(adaptive=True)
    loop = asyncio.new_event_loop()
    try:
        _measure(scheduler, loop, 1, link)
    finally:
        loop.close()

    ratio = _ratio(scheduler.upload_plan(_session(1), None))
    predicted = scheduler.predict_s(1)
    assert predicted == pytest.approx(link.round_s(ratio * MODEL_BYTES), rel=1e-6)
    fitting = [o for o in DEFAULT_LADDER if _fits(link, o)]
    expected = fitting[0] if fitting else SMALLEST
    assert ratio == expected.ratio  # the least lossy chain that fits, else the smallest
