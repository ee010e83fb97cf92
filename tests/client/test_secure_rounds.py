"""The client's side of the shared low-rank projection: error feedback across rounds."""

from __future__ import annotations

import numpy as np

from geofl.client.secure_rounds import SecureRounds
from geofl.protocols.shared_lowrank import SharedLowRank
from geofl.protocols.tensors import Difference, TensorSpec

SPEC = (TensorSpec("w", "float32", (8, 16)), TensorSpec("b", "float32", (16,)))


def _delta(rng: np.random.Generator) -> dict[str, Difference]:
    return {
        t.name: Difference(
            rng.standard_normal(t.shape).astype(np.float32), np.zeros(t.shape, np.float32)
        )
        for t in SPEC
    }


def test_what_the_projection_drops_is_sent_in_later_rounds() -> None:
    """Error feedback: everything sent plus the residual equals everything trained."""
    rounds, rng = SecureRounds(), np.random.default_rng(0)
    trained = {t.name: np.zeros(t.shape) for t in SPEC}
    sent = {t.name: np.zeros(t.shape) for t in SPEC}
    for number in range(3):
        projection = SharedLowRank(2, 1, bytes([number]) * 32)  # a fresh basis every round
        delta = _delta(rng)
        for name, d in delta.items():
            trained[name] += d.materialize()
        lifted = projection.lift(rounds._project(projection, delta), SPEC)
        for name in sent:
            sent[name] += lifted[name]
    assert set(rounds._residual) == {"w"}  # the 1-D bias travels whole: nothing kept
    np.testing.assert_allclose(sent["w"] + rounds._residual["w"], trained["w"], atol=1e-9)
    np.testing.assert_allclose(sent["b"], trained["b"], atol=1e-6)
    assert not np.allclose(rounds._residual["w"], 0)
