"""Adaptive upload compression: measured ladder, least lossy fit, monotone in bandwidth."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.protocols.codecs import estimate_bytes, parse_chain
from geofl.server.scheduling.adaptive import (
    DEFAULT_CHAINS,
    DEFAULT_LADDER,
    MEASURE_ELEMENTS,
    ChainOption,
    choose_upload_chain,
    measure_ladder,
    upload_budget_s,
    upload_time_s,
)

SETTINGS = settings(max_examples=200, deadline=None)
MB = 1_000_000

bandwidths = st.floats(1e3, 1e10)
rtts = st.floats(0, 1)
sizes = st.integers(0, 10**9)
budgets = st.floats(-10, 1000)


def test_default_ladder_ratios_are_the_measured_ones() -> None:
    measured = measure_ladder(DEFAULT_CHAINS)
    assert measured == DEFAULT_LADDER
    assert [option.chain for option in DEFAULT_LADDER] == list(DEFAULT_CHAINS)
    assert [option.loss_rank for option in DEFAULT_LADDER] == list(range(len(DEFAULT_CHAINS)))


def test_ladder_shrinks_as_loss_grows() -> None:
    ratios = [option.ratio for option in DEFAULT_LADDER]
    assert ratios[0] == 1.0
    assert all(later < earlier for earlier, later in itertools.pairwise(ratios))


@pytest.mark.parametrize("rank", [1, 2])
def test_exact_codec_ratios_match_their_size_formula(rank: int) -> None:
    # fp16 and qsgd sizes are exact (docs/compression.md): 2n and n + 4 ceil(n / 512).
    shape = (MEASURE_ELEMENTS,)
    expected = estimate_bytes("float32", shape, DEFAULT_CHAINS[rank]) / estimate_bytes(
        "float32", shape, ()
    )
    assert DEFAULT_LADDER[rank].ratio == pytest.approx(expected, rel=1e-12)
    assert DEFAULT_LADDER[rank].ratio == pytest.approx((0.5, 0.25)[rank - 1], abs=0.003)


def test_top_k_ratios_are_near_values_plus_indices() -> None:
    # k half-precision values (2 bytes each of 4) and a byte or two of index per value.
    top10, top1 = DEFAULT_LADDER[3].ratio, DEFAULT_LADDER[4].ratio
    assert 0.1 * 2 / 4 < top10 < 0.1 * 4 / 4
    assert 0.01 * 2 / 4 < top1 < 0.01 * 4 / 4


def test_measure_ladder_refuses_nothing_to_measure() -> None:
    with pytest.raises(ValueError, match="at least one chain"):
        measure_ladder(())
    with pytest.raises(ValueError, match="elements must be >= 1"):
        measure_ladder(DEFAULT_CHAINS, elements=0)


def test_least_lossy_chain_that_fits_is_chosen() -> None:
    # 10 MB at 8 Mbit/s: raw 10 s, fp16 ~5 s, qsgd ~2.5 s.
    choice = choose_upload_chain(8e6, 0.0, 10 * MB, budget_s=6.0)
    assert choice.chain == parse_chain("fp16")
    assert choice.fits
    assert choice.note is None
    assert choice.predicted_upload_s == pytest.approx(8 * 10 * MB * DEFAULT_LADDER[1].ratio / 8e6)
    assert choose_upload_chain(8e6, 0.0, 10 * MB, budget_s=11.0).chain == ()
    assert choose_upload_chain(8e6, 0.0, 10 * MB, budget_s=3.0).option.loss_rank == 2


def test_round_trip_time_counts_half() -> None:
    # Raw needs exactly 10 s of serialization; 0.2 s RTT adds 0.1 s and pushes it out.
    assert choose_upload_chain(8e6, 0.2, 10 * MB, budget_s=10.05).option.loss_rank == 1
    assert choose_upload_chain(8e6, 0.2, 10 * MB, budget_s=10.1).option.loss_rank == 0


def test_nothing_fits_takes_the_smallest_and_says_so() -> None:
    choice = choose_upload_chain(1e3, 0.5, 10 * MB, budget_s=1.0)
    assert not choice.fits
    assert choice.option == min(DEFAULT_LADDER, key=lambda o: o.ratio)
    assert choice.note is not None
    assert choice.note.startswith("no chain uploads 10000000 bytes at 1000 bit/s within 1 s")


def test_option_order_does_not_matter() -> None:
    shuffled = list(DEFAULT_LADDER)
    random.Random(3).shuffle(shuffled)
    for budget in (0.1, 1.0, 3.0, 6.0, 11.0):
        assert choose_upload_chain(8e6, 0.0, 10 * MB, budget, shuffled) == choose_upload_chain(
            8e6, 0.0, 10 * MB, budget
        )


@SETTINGS
@given(bandwidths, bandwidths, rtts, sizes, budgets)
def test_more_bandwidth_is_never_lossier(
    low: float, high: float, rtt: float, nbytes: int, budget: float
) -> None:
    low, high = sorted((low, high))
    slow = choose_upload_chain(low, rtt, nbytes, budget)
    fast = choose_upload_chain(high, rtt, nbytes, budget)
    assert fast.option.loss_rank <= slow.option.loss_rank
    assert fast.fits or not slow.fits


@SETTINGS
@given(bandwidths, rtts, sizes, budgets)
def test_choice_fits_and_nothing_less_lossy_does(
    bandwidth: float, rtt: float, nbytes: int, budget: float
) -> None:
    choice = choose_upload_chain(bandwidth, rtt, nbytes, budget)
    assert choice.predicted_upload_s == upload_time_s(bandwidth, rtt, choice.option.ratio * nbytes)
    assert choice.fits == (choice.predicted_upload_s <= budget)
    for option in DEFAULT_LADDER:
        if option.loss_rank < choice.option.loss_rank:
            assert upload_time_s(bandwidth, rtt, option.ratio * nbytes) > budget


def test_upload_budget() -> None:
    assert upload_budget_s(60.0, 10.0, 20.0, 0.9) == pytest.approx(24.0)
    assert upload_budget_s(10.0, 8.0, 5.0, 1.0) == pytest.approx(-3.0)
    with pytest.raises(ValueError, match="margin"):
        upload_budget_s(60.0, 1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="predicted download"):
        upload_budget_s(60.0, -1.0, 1.0, 0.9)
    with pytest.raises(ValueError, match="deadline_s"):
        upload_budget_s(math.inf, 1.0, 1.0, 0.9)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="bandwidth_bps"):
        choose_upload_chain(0.0, 0.0, 1, 1.0)
    with pytest.raises(ValueError, match="rtt_s"):
        choose_upload_chain(1e6, -1.0, 1, 1.0)
    with pytest.raises(ValueError, match="update_bytes"):
        choose_upload_chain(1e6, 0.0, -1, 1.0)
    with pytest.raises(ValueError, match="NaN"):
        choose_upload_chain(1e6, 0.0, 1, math.nan)
    with pytest.raises(ValueError, match="no compression options"):
        choose_upload_chain(1e6, 0.0, 1, 1.0, ())
    with pytest.raises(ValueError, match="ratio"):
        ChainOption((), 0.0, 0)
    with pytest.raises(ValueError, match="loss_rank"):
        ChainOption((), 1.0, -1)
