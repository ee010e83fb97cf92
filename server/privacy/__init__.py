"""Differential privacy: central client-level DP (clip, then Gaussian noise on the sum),
accounted by Google's ``dp-accounting`` (docs/privacy.md).

Distributed DP under secure aggregation is not built yet; it would add a mechanism whose
noise the clients add in the ring, accounted through the same :class:`RoundMechanism`.
"""

from geofl.server.privacy.accounting import (
    INSTALL_HINT,
    RoundMechanism,
    Sampling,
    calibrate_noise,
    epsilon,
    load_dp_accounting,
)
from geofl.server.privacy.errors import PrivacyError
from geofl.server.privacy.mechanism import (
    GaussianClip,
    NoisedClippedMean,
    check_float_model,
    secure_generator,
)

__all__ = [
    "INSTALL_HINT",
    "GaussianClip",
    "NoisedClippedMean",
    "PrivacyError",
    "RoundMechanism",
    "Sampling",
    "calibrate_noise",
    "check_float_model",
    "epsilon",
    "load_dp_accounting",
    "secure_generator",
]
