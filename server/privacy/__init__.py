"""Differential privacy, accounted by Google's ``dp-accounting`` (docs/privacy.md): central
client-level DP (the server clips, then adds Gaussian noise to the sum) and distributed DP
under secure aggregation (clients add discrete Gaussian noise in the ring before masking,
:mod:`geofl.server.privacy.distributed`).
"""

from geofl.server.privacy.accounting import (
    INSTALL_HINT,
    AccountedMechanism,
    RoundMechanism,
    Sampling,
    calibrate_noise,
    epsilon,
    load_dp_accounting,
)
from geofl.server.privacy.distributed import (
    WRAP_PROBABILITY,
    DistributedMechanism,
    calibrate_distributed,
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
    "WRAP_PROBABILITY",
    "AccountedMechanism",
    "DistributedMechanism",
    "GaussianClip",
    "NoisedClippedMean",
    "PrivacyError",
    "RoundMechanism",
    "Sampling",
    "calibrate_distributed",
    "calibrate_noise",
    "check_float_model",
    "epsilon",
    "load_dp_accounting",
    "secure_generator",
]
