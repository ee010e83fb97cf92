"""The WAN link model: region assignment, per-client speeds and transfer times."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from geofl.server.config import parse_config
from geofl.server.config.simulation import (
    ComputeConfig,
    Distribution,
    Heterogeneity,
    LogNormalDistribution,
    RegionModel,
    UniformDistribution,
)
from geofl.server.simulation.links import (
    DEFAULT_REGION,
    SEGMENT_BYTES,
    ClientLink,
    LinkModel,
    draw_multipliers,
    region_counts,
    sync_round_time_s,
    transfer_time_s,
)
from geofl.server.simulation.traces import Availability, ClientTrace, DeviceCapacity

THREE = {
    "near": RegionModel(share=0.2, rtt_ms=20, up_mbps=50, down_mbps=100),
    "mid": RegionModel(share=0.5, rtt_ms=80, up_mbps=20, down_mbps=40),
    "far": RegionModel(share=0.3, rtt_ms=220, up_mbps=5, down_mbps=10, jitter_ms=4, loss=0.01),
}


@st.composite
def shares(draw: st.DrawFn) -> dict[str, float]:
    weights = draw(st.lists(st.integers(1, 1000), min_size=1, max_size=8))
    total = sum(weights)
    return {f"r{i}": w / total for i, w in enumerate(weights)}


@given(shares=shares(), num_clients=st.integers(0, 5000))
def test_region_counts_sum_to_n_and_follow_the_shares(
    shares: dict[str, float], num_clients: int
) -> None:
    counts = region_counts(shares, num_clients)
    assert list(counts) == list(shares)
    assert sum(counts.values()) == num_clients
    for name, share in shares.items():
        assert abs(counts[name] - share * num_clients) < 1
    assert region_counts(shares, num_clients) == counts


def test_largest_remainder_gives_ties_to_the_first_region() -> None:
    third = 1 / 3
    assert region_counts({"a": third, "b": third, "c": third}, 10) == {"a": 4, "b": 3, "c": 3}
    assert region_counts({"a": 0.55, "b": 0.45}, 3) == {"a": 2, "b": 1}
    assert region_counts({"a": 0.05, "b": 0.95}, 10) == {"a": 1, "b": 9}


def test_inconsistent_shares_are_listed_with_their_sum() -> None:
    with pytest.raises(ValueError, match=r"got a=0\.3, b=0\.6 \(sum 0\.9\)"):
        region_counts({"a": 0.3, "b": 0.6}, 10)
    with pytest.raises(ValueError, match="no regions"):
        region_counts({}, 10)


def test_transfer_time_is_delay_plus_serialization() -> None:
    assert transfer_time_s(1_000_000, 1e8, 0.02) == pytest.approx(0.01 + 0.08, rel=1e-12)
    assert transfer_time_s(0, 1e6, 0.1) == pytest.approx(0.05, rel=1e-12)
    # Jitter moves the delay, never below zero.
    assert transfer_time_s(125, 1e3, 0.01, jitter_s=0.002) == pytest.approx(1.007, rel=1e-12)
    assert transfer_time_s(125, 1e3, 0.01, jitter_s=-1.0) == pytest.approx(1.0, rel=1e-12)
    for bad in ((-1, 1e6, 0.0), (1, 0.0, 0.0), (1, 1e6, -0.1)):
        with pytest.raises(ValueError, match="need nbytes >= 0"):
            transfer_time_s(*bad)


def test_loss_adds_one_rtt_per_expected_lost_segment() -> None:
    # 10 segments (the last one partial), 10 % lost: one rtt of stall expected.
    nbytes = 9 * SEGMENT_BYTES + 1
    lossless = transfer_time_s(nbytes, 1e6, 0.2)
    assert transfer_time_s(nbytes, 1e6, 0.2, loss=0.1) == pytest.approx(lossless + 0.2)
    assert transfer_time_s(0, 1e6, 0.2, loss=0.5) == pytest.approx(0.1)
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match=r"loss must be in \[0, 1\)"):
            transfer_time_s(1, 1e6, 0.1, loss=bad)


def test_constant_distributions_give_exact_region_figures() -> None:
    model = LinkModel.build(1000, seed=3, regions=THREE, compute=ComputeConfig(samples_per_s=50))
    assert model.region_counts() == {"near": 200, "mid": 500, "far": 300}
    for link in model.links:
        region = THREE[link.region]
        assert link.up_bps == region.up_mbps * 1e6
        assert link.down_bps == region.down_mbps * 1e6
        assert (link.rtt_s, link.jitter_s, link.loss) == (
            region.rtt_ms / 1000,
            region.jitter_ms / 1000,
            region.loss,
        )
        assert link.samples_per_s == 50
        megabyte = 1_000_000
        # One rtt of stall per expected lost segment (only "far" has loss).
        retransmit = region.loss * math.ceil(megabyte / SEGMENT_BYTES) * region.rtt_ms / 1000
        down = region.rtt_ms / 2000 + 8 * megabyte / (region.down_mbps * 1e6) + retransmit
        up = region.rtt_ms / 2000 + 8 * megabyte / (region.up_mbps * 1e6) + retransmit
        assert link.download_s(megabyte) == pytest.approx(down, rel=1e-12)
        assert link.upload_s(megabyte) == pytest.approx(up, rel=1e-12)
        assert link.compute_s(100) == pytest.approx(2.0, rel=1e-12)
        # Fetching a model adds the task's notice and the request: one rtt.
        fetch = region.rtt_ms / 1000 + down
        assert link.fetch_s(megabyte) == pytest.approx(fetch, rel=1e-12)
        assert link.fetch_s(0) == pytest.approx(region.rtt_ms / 2000, rel=1e-12)  # held
        assert link.round_s(megabyte, megabyte, 100) == pytest.approx(fetch + 2 + up, rel=1e-12)


def test_region_assignment_is_seeded_and_unrelated_to_the_index() -> None:
    a = LinkModel.build(300, seed=1, regions=THREE)
    assert a == LinkModel.build(300, seed=1, regions=THREE)
    b = LinkModel.build(300, seed=2, regions=THREE)
    assert a.client_regions != b.client_regions
    assert a.region_counts() == b.region_counts()
    # Not contiguous blocks: the first 60 clients are not all in the first region.
    assert set(a.client_regions[:60]) != {"near"}
    assert sorted(a.clients_in("near") + a.clients_in("mid") + a.clients_in("far")) == list(
        range(300)
    )


def test_unknown_region_names_are_errors() -> None:
    model = LinkModel.build(10, seed=0, regions=THREE)
    with pytest.raises(KeyError, match=r"unknown region 'moon'; the regions are \['far'"):
        model.clients_in("moon")
    with pytest.raises(IndexError, match=r"client 10 is not in 0\.\.9"):
        model.link(10)
    bad = {"eu west": RegionModel(share=1, rtt_ms=1, up_mbps=1, down_mbps=1)}
    with pytest.raises(ValueError, match="region names must be"):
        LinkModel.build(10, seed=0, regions=bad)


def _distribution(**kind: object) -> Distribution:
    return Distribution.model_validate(kind)


def test_heterogeneity_draws_per_client_multipliers() -> None:
    heterogeneity = Heterogeneity(
        compute=_distribution(lognormal={"sigma": 0.5}),
        bandwidth=_distribution(uniform={"low": 0.5, "high": 2.0}),
    )
    model = LinkModel.build(4000, seed=5, regions=THREE, heterogeneity=heterogeneity)
    speeds = np.array([link.samples_per_s for link in model.links])
    assert 0.9 * 200 < np.median(speeds) < 1.1 * 200  # log-normal with median 1
    assert speeds.std() > 0
    multipliers = np.array(
        [link.up_bps / (THREE[link.region].up_mbps * 1e6) for link in model.links]
    )
    assert multipliers.min() >= 0.5 and multipliers.max() <= 2.0
    for link in model.links:  # one multiplier scales both directions of a client
        region = THREE[link.region]
        assert link.down_bps / link.up_bps == pytest.approx(region.down_mbps / region.up_mbps)


def test_changing_one_distribution_leaves_the_other_draws_alone() -> None:
    bandwidth = _distribution(lognormal={"sigma": 1.0})
    a = LinkModel.build(50, 9, THREE, Heterogeneity(bandwidth=bandwidth))
    b = LinkModel.build(
        50,
        9,
        THREE,
        Heterogeneity(compute=_distribution(uniform={"low": 1, "high": 3}), bandwidth=bandwidth),
    )
    assert [x.up_bps for x in a.links] == [x.up_bps for x in b.links]
    assert a.client_regions == b.client_regions
    assert [x.samples_per_s for x in a.links] != [x.samples_per_s for x in b.links]


def test_draw_multipliers_by_kind() -> None:
    rng = np.random.default_rng(0)
    assert (draw_multipliers(_distribution(constant={}), 5, rng) == 1).all()
    uniform = draw_multipliers(_distribution(uniform={"low": 2, "high": 2}), 5, rng)
    np.testing.assert_array_equal(uniform, np.full(5, 2.0))
    lognormal = draw_multipliers(Distribution(lognormal=LogNormalDistribution(sigma=0.1)), 5, rng)
    assert (lognormal > 0).all() and not (lognormal == 1).all()
    assert UniformDistribution(low=1, high=1).high == 1


def test_sync_round_is_bound_by_the_slowest_client() -> None:
    model = LinkModel.build(30, seed=0, regions=THREE)
    samples = [100] * 30
    expected = max(link.round_s(4_000_000, 4_000_000, 100) for link in model.links)
    assert sync_round_time_s(model.links, 4_000_000, 4_000_000, samples) == expected
    slowest = max(model.links, key=lambda link: link.round_s(4_000_000, 4_000_000, 100))
    assert slowest.region == "far"  # 5 Mbit/s up dominates
    with pytest.raises(ValueError, match="2 sample counts for 30 clients"):
        sync_round_time_s(model.links, 1, 1, [1, 1])
    with pytest.raises(ValueError, match="at least one client"):
        sync_round_time_s([], 1, 1, [])


@given(seed=st.integers(0, 2**32 - 1))
def test_jitter_stays_within_its_bound(seed: int) -> None:
    link = ClientLink(
        0, "x", rtt_s=0.004, up_bps=1e6, down_bps=1e6, jitter_s=0.005, loss=0, samples_per_s=10
    )
    rng = np.random.default_rng(seed)
    base = link.round_s(1000, 1000, 10)
    jittered = link.round_s(1000, 1000, 10, rng)
    assert base - 2 * 0.002 <= jittered <= base + 2 * 0.005
    assert abs(link.sample_jitter_s(rng)) <= 0.005


def _trace(computation: float | None, windows: list[tuple[float, float]] | None) -> ClientTrace:
    capacity = None if computation is None else DeviceCapacity(computation, 1000.0)
    availability = None if windows is None else Availability.from_windows(windows)
    return ClientTrace(capacity, availability)


def test_a_trace_replaces_drawn_speeds() -> None:
    traces = [_trace(5.0, None), _trace(None, [(0, 10)])]
    model = LinkModel.build(
        2,
        seed=0,
        regions=THREE,
        traces=traces,
        heterogeneity=Heterogeneity(compute=_distribution(lognormal={"sigma": 1.0})),
    )
    measured, drawn = model.links
    assert measured.samples_per_s == pytest.approx(1000 / 15)
    assert measured.up_bps == measured.down_bps == 1000 * 1024
    assert measured.rtt_s == THREE[measured.region].rtt_ms / 1000
    assert drawn.up_bps == THREE[drawn.region].up_mbps * 1e6
    assert drawn.samples_per_s != 200  # drawn from the log-normal


def test_a_trace_alone_gives_a_zero_delay_region() -> None:
    model = LinkModel.build(3, seed=0, regions={}, traces=[_trace(2.0, None)] * 3)
    assert model.region_counts() == {DEFAULT_REGION: 3}
    assert model.links[0].download_s(128) == pytest.approx(128 * 8 / (1000 * 1024))
    with pytest.raises(ValueError, match="client 1's trace gives no communication speed"):
        LinkModel.build(2, seed=0, regions={}, traces=[_trace(2.0, None), _trace(None, [])])
    with pytest.raises(ValueError, match="no regions and no trace"):
        LinkModel.build(2, seed=0, regions={})
    with pytest.raises(ValueError, match="1 client traces for 2 clients"):
        LinkModel.build(2, seed=0, regions=THREE, traces=[_trace(2.0, None)])
    with pytest.raises(ValueError, match="num_clients must be >= 1"):
        LinkModel.build(0, seed=0, regions=THREE)


def test_from_config_reads_the_simulation_section() -> None:
    config = parse_config(
        {
            "run": {"name": "x", "seed": 4},
            "model": "m:f",
            "simulation": {
                "clients": 12,
                "regions": {
                    "a": {"share": 0.25, "rtt_ms": 20, "up_mbps": 50, "down_mbps": 50},
                    "b": {"share": 0.75, "rtt_ms": 220, "up_mbps": 5, "down_mbps": 5},
                },
                "compute": {"samples_per_s": 10.0},
            },
        }
    )
    model = LinkModel.from_config(config.simulation, config.run.seed)
    assert model.region_counts() == {"a": 3, "b": 9}
    assert model == LinkModel.build(
        12, 4, config.simulation.regions, compute=ComputeConfig(samples_per_s=10.0)
    )
    assert math.isclose(model.link(0).compute_s(10), 1.0)
