"""Per-round secure-aggregation parameters and the mean taken from an unmasked sum."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from geofl.protocols.secagg import SecAggError
from geofl.protocols.tensors import TensorSpec
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.rounds.secure import SecureSettings, mean_of_sum, round_params, setup_to_proto


def _settings(**changes: Any) -> SecureSettings:
    base: dict[str, Any] = {
        "run_id": 7,
        "degree": "auto",
        "threshold": 0.66,
        "clip": 8.0,
        "ring_bits": 32,
        "max_examples": 100,
        "stage_deadline_s": 10.0,
    }
    return SecureSettings(**{**base, **changes})


def test_full_graph_threshold_is_the_fraction_of_the_whole_cohort() -> None:
    params = round_params(_settings(degree="full"), 3, [5, 1, 9, 2, 8, 3, 4, 6, 7, 10])
    assert params.cohort == tuple(range(1, 11)) and params.effective_degree == 9
    assert params.threshold == 7  # ceil(0.66 * 10)
    assert (params.run_id, params.round) == (7, 3)


def test_auto_degree_grows_logarithmically_and_seeds_are_fresh() -> None:
    cohort = list(range(1, 101))
    first, second = (round_params(_settings(), 1, cohort) for _ in range(2))
    assert first.effective_degree == 2 * 10  # 2 * ceil(1.5 * log2(100))
    assert first.threshold == 14  # ceil(0.66 * 21)
    assert first.graph_seed != second.graph_seed


def test_threshold_never_below_two_or_above_the_holders() -> None:
    assert round_params(_settings(degree="full", threshold=0.51), 1, [1, 2]).threshold == 2
    assert round_params(_settings(degree=4, threshold=1.0), 1, list(range(1, 21))).threshold == 5


def test_a_cohort_of_one_cannot_start() -> None:
    with pytest.raises(SecAggError):
        round_params(_settings(), 1, [4])


def test_mean_of_sum_divides_by_the_total_weight_per_tensor() -> None:
    spec = (TensorSpec("w", "float32", (2, 2)), TensorSpec("b", "float32", (3,)))
    total = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 0.5])
    params = round_params(_settings(degree="full"), 1, [1, 2, 3])
    mean, weight = mean_of_sum(total, spec, setup_to_proto(params, _settings()))
    assert weight == 0.5
    np.testing.assert_array_equal(mean["w"], [[2.0, 4.0], [6.0, 8.0]])
    np.testing.assert_array_equal(mean["b"], [10.0, 12.0, 14.0])
    with pytest.raises(ValueError, match="total weight"):
        mean_of_sum(np.zeros(8), spec, pb.SecAggSetup())
