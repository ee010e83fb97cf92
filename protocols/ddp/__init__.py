"""Distributed differential privacy under secure aggregation: the arithmetic both sides share.

The distributed discrete Gaussian mechanism of Kairouz, Liu and Steinke (2021): each client
clips, rotates and conditionally rounds its update, adds its share of discrete Gaussian
noise in the ring and only then masks it (:mod:`.encoding`); the server decodes the
unmasked sum. The accounting lives with the server (``geofl.server.privacy.distributed``).
"""

from geofl.protocols.ddp.encoding import (
    ROUNDING_BETA,
    DistributedDpParams,
    clip_to_norm,
    conditional_round,
    plan_granularity,
    rounding_bound,
    wrap_probability,
)
from geofl.protocols.ddp.errors import DistributedDpError
from geofl.protocols.ddp.rotation import padded_size, rotate, unrotate
from geofl.protocols.ddp.sampler import discrete_gaussian, secure_generator

__all__ = [
    "ROUNDING_BETA",
    "DistributedDpError",
    "DistributedDpParams",
    "clip_to_norm",
    "conditional_round",
    "discrete_gaussian",
    "padded_size",
    "plan_granularity",
    "rotate",
    "rounding_bound",
    "secure_generator",
    "unrotate",
    "wrap_probability",
]
