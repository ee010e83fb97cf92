"""What a secure round needs besides the engine: its parameters and the wire forms.

The engine drives the SecAgg+ stages (advertise -> share -> masked fit -> unmask) with the
same task machinery as plain rounds; this module chooses each round's parameters
(neighbourhood degree, threshold, a fresh graph seed) and converts between the protocol's
dataclasses and their protobuf messages. The cryptography lives in
:mod:`geofl.protocols.secagg` and the server's bookkeeping in :mod:`geofl.server.rounds.secagg`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from geofl.protocols.secagg import PublicKeys, SecAggParams, graph_degree, recommended_degree
from geofl.protocols.shared_lowrank import projection_of
from geofl.protocols.tensors import ModelSpec
from geofl.protocols.types import Weights
from geofl.protocols.v1 import geofl_pb2 as pb

__all__ = [
    "SecureSettings",
    "keys_from_proto",
    "keys_to_proto",
    "mean_of_sum",
    "roster_to_proto",
    "round_params",
    "setup_to_proto",
]


@dataclass(frozen=True)
class SecureSettings:
    """The ``secure_aggregation`` section, plus the run id the keys are bound to."""

    run_id: int
    degree: int | Literal["auto", "full"]
    threshold: float
    clip: float
    ring_bits: int
    max_examples: int
    stage_deadline_s: float
    low_rank: int = 0
    low_rank_min_elements: int = 0


def round_params(settings: SecureSettings, number: int, cohort: list[int]) -> SecAggParams:
    """This round's parameters for the selected ``cohort`` (node ids)."""
    n = len(cohort)
    if settings.degree == "full":
        degree = n - 1
    elif settings.degree == "auto":
        degree = recommended_degree(n)
    else:
        degree = settings.degree
    holders = graph_degree(n, degree) + 1  # the neighbours and the client itself
    threshold = min(holders, max(2, math.ceil(settings.threshold * holders)))
    return SecAggParams(
        run_id=settings.run_id,
        round=number,
        cohort=tuple(sorted(cohort)),
        threshold=threshold,
        degree=degree,
        graph_seed=os.urandom(32),
        clip=settings.clip,
        ring_bits=settings.ring_bits,
    )


def setup_to_proto(params: SecAggParams, settings: SecureSettings) -> pb.SecAggSetup:
    """The parameters as every stage task carries them."""
    return pb.SecAggSetup(
        cohort=list(params.cohort),
        threshold=params.threshold,
        degree=params.degree,
        graph_seed=params.graph_seed,
        clip=params.clip,
        ring_bits=params.ring_bits,
        max_examples=settings.max_examples,
        low_rank=settings.low_rank,
        low_rank_min_elements=settings.low_rank_min_elements,
    )


def keys_to_proto(keys: PublicKeys) -> pb.PublicKeys:
    """A client's advertised public keys on the wire."""
    return pb.PublicKeys(encrypt=keys.encrypt, mask=keys.mask)


def keys_from_proto(message: pb.PublicKeys) -> PublicKeys:
    """Public keys from the wire (their length is checked by the protocol classes)."""
    return PublicKeys(encrypt=bytes(message.encrypt), mask=bytes(message.mask))


def mean_of_sum(
    total: npt.NDArray[np.float64], spec: ModelSpec, setup: pb.SecAggSetup
) -> tuple[Weights, float]:
    """Split the unmasked sum into per-tensor weighted sums divided by the total weight.

    The last element of a secure-aggregation vector is the client's weight, so the last
    element of the sum is the cohort's total weight.
    """
    weight = float(total[-1])
    if not weight > 0:
        raise ValueError(f"the survivors' total weight is {weight}")
    projection = projection_of(setup)
    if projection is not None:
        return dict(projection.lift(total[:-1] / weight, spec)), weight
    mean: Weights = {}
    offset = 0
    for tensor in spec:
        size = int(np.prod(tensor.shape, dtype=np.int64))
        mean[tensor.name] = (total[offset : offset + size] / weight).reshape(tensor.shape)
        offset += size
    return mean, weight


def roster_to_proto(roster: Mapping[int, PublicKeys]) -> dict[int, pb.PublicKeys]:
    """A client's neighbours' keys, for its share task."""
    return {node: keys_to_proto(keys) for node, keys in roster.items()}
