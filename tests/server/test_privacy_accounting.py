"""Privacy accounting: dp_accounting's RDP accountant, monotone in rounds, calibrated noise."""

from __future__ import annotations

import dp_accounting
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.server.privacy import PrivacyError, RoundMechanism, Sampling, calibrate_noise, epsilon


@settings(max_examples=25, deadline=None)
@given(z=st.floats(0.5, 5.0), rounds=st.integers(1, 200))
def test_epsilon_grows_with_rounds(z: float, rounds: int) -> None:
    mechanism = RoundMechanism(z)
    assert 0 < epsilon(mechanism, rounds, 1e-5) <= epsilon(mechanism, rounds + 1, 1e-5)


def test_no_amplification_matches_dp_accounting_directly() -> None:
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(1.1), 30)
    assert epsilon(RoundMechanism(1.1), 30, 1e-5) == pytest.approx(accountant.get_epsilon(1e-5))


def test_uniform_sampling_matches_dp_accounting_directly() -> None:
    """Replace-one: the sum's sensitivity is 2C, so the event's multiplier is z / 2; the
    count of adaptive clipping composes as a second Gaussian."""
    accountant = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    inner = dp_accounting.ComposedDpEvent(
        [dp_accounting.GaussianDpEvent(1.0), dp_accounting.GaussianDpEvent(10.0)]
    )
    accountant.compose(dp_accounting.SampledWithoutReplacementDpEvent(1000, 100, inner), 50)
    mechanism = RoundMechanism(2.0, 10.0, Sampling(1000, 100))
    assert epsilon(mechanism, 50, 1e-5) == pytest.approx(accountant.get_epsilon(1e-5))


def test_sampling_amplifies() -> None:
    full = epsilon(RoundMechanism(2.0), 100, 1e-5)
    assert epsilon(RoundMechanism(2.0, sampling=Sampling(10_000, 100)), 100, 1e-5) < full


def test_calibrated_noise_meets_the_target() -> None:
    z = calibrate_noise(3.0, 1e-5, 40)
    assert epsilon(RoundMechanism(z), 40, 1e-5) <= 3.0 + 1e-6
    assert epsilon(RoundMechanism(z * 0.95), 40, 1e-5) > 3.0


def test_bad_inputs_are_named() -> None:
    with pytest.raises(PrivacyError, match="noise_multiplier"):
        RoundMechanism(0.0)
    with pytest.raises(PrivacyError, match="population"):
        Sampling(10, 20)
    with pytest.raises(PrivacyError, match="delta"):
        epsilon(RoundMechanism(1.0), 1, 1.5)
