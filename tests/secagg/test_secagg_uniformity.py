"""One client's masked vector looks uniform over the ring; its quantized input does not.

Chi-square goodness of fit over 256 buckets (the top byte and the low byte of each
ring element).  The critical value is for p = 1e-6 (Wilson-Hilferty approximation),
so an honest uniform vector fails about once in a million runs, while the quantized
input fails by orders of magnitude.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from geofl.client.secagg import SecAggClient
from geofl.protocols.secagg import RingArray
from geofl.server.rounds.secagg import SecAggServer

from .test_secagg_harness import make_params

BUCKETS = 256
PER_BUCKET = 200
Z_ONE_IN_A_MILLION = 4.753


def _critical_value(degrees: int, z: float = Z_ONE_IN_A_MILLION) -> float:
    """Upper quantile of chi-square(degrees) by the Wilson-Hilferty cube-root normal."""
    spread = 2.0 / (9.0 * degrees)
    return degrees * (1.0 - spread + z * math.sqrt(spread)) ** 3


def _chi_square(buckets: npt.NDArray[np.integer]) -> float:
    counts = np.bincount(buckets.astype(np.int64), minlength=BUCKETS).astype(np.float64)
    expected = buckets.size / BUCKETS
    return float(((counts - expected) ** 2 / expected).sum())


def _top_and_low_bytes(values: RingArray, bits: int) -> list[npt.NDArray[np.integer]]:
    return [values >> (bits - 8), values & 0xFF]


def _masked_and_quantized(bits: int) -> tuple[RingArray, RingArray]:
    params = make_params(3, 2, 2, ring_bits=bits)
    clients = {n: SecAggClient(n, params, rng=np.random.default_rng(n)) for n in params.cohort}
    server = SecAggServer(params)
    for node, client in clients.items():
        server.add_keys(node, client.advertise())
    for node, roster in server.close_advertise().items():
        server.add_shares(node, clients[node].share_keys(roster))
    for node, inbox in server.close_sharing().items():
        clients[node].receive_shares(inbox)
    vector = np.random.default_rng(42).normal(0.0, 0.1, BUCKETS * PER_BUCKET)
    node = params.cohort[1]
    masked = clients[node].mask(vector)
    quantized = params.quantizer().encode(vector, np.random.default_rng(node))
    return masked, quantized


@pytest.mark.parametrize("bits", [16, 20, 32])
def test_masked_vector_is_indistinguishable_from_uniform(bits: int) -> None:
    masked, quantized = _masked_and_quantized(bits)
    critical = _critical_value(BUCKETS - 1)
    for buckets in _top_and_low_bytes(masked, bits):
        assert _chi_square(buckets) < critical
    top_byte, _ = _top_and_low_bytes(quantized, bits)
    assert _chi_square(top_byte) > 100 * critical


def test_the_test_rejects_a_slightly_biased_ring_vector() -> None:
    rng = np.random.default_rng(7)
    values = rng.integers(0, 2**16, BUCKETS * PER_BUCKET, dtype=np.uint16)
    values[: values.size // 20] = 0  # 5 % of the coordinates leak a fixed value
    assert _chi_square(values >> 8) > _critical_value(BUCKETS - 1)
