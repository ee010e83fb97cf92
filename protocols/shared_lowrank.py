"""A low-rank linear map shared by a round's whole cohort, so masked sums still decode.

Secure aggregation adds masks in a ring and the server only ever sees the sum, so an
upload codec must be one linear map ``L`` for every client: ``sum L(x_i) = L(sum x_i)``.
PowerSGD's factors differ per client and do not qualify. This codec projects each
matrix-shaped tensor ``M`` (``rows x cols``, trailing dimensions flattened) on a random
orthonormal basis ``Q`` (``cols x rank``) drawn from the round's public seed: the client
sends ``P = M Q`` and the server lifts the sum back with ``(sum P) Q^T``.

What a projection drops is kept by the client as an error-feedback residual and added to
its next update, so it is sent in a later round. A random subspace is not PowerSGD's
power-iterated top subspace: convergence per byte is closer to random-k sparsification
with error feedback than to PowerSGD.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from geofl.protocols.ddp.rotation import padded_size
from geofl.protocols.tensors import ModelSpec, masked_length
from geofl.protocols.v1 import geofl_pb2 as pb

__all__ = ["SharedLowRank", "projection_of", "vector_length"]

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class _Part:
    """Where one tensor sits in the projected vector."""

    name: str
    shape: tuple[int, ...]
    rows: int
    cols: int
    projected: bool
    rank: int

    @property
    def length(self) -> int:
        """Elements this tensor takes in the vector."""
        return self.rows * (self.rank if self.projected else self.cols)


@dataclass(frozen=True)
class SharedLowRank:
    """Project tensors of at least ``min_elements`` with more than ``rank`` columns."""

    rank: int
    min_elements: int
    seed: bytes

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"low-rank projection needs rank >= 1, got {self.rank}")
        if len(self.seed) < 16:
            raise ValueError("the shared projection seed must have at least 16 bytes")

    def layout(self, spec: ModelSpec) -> tuple[_Part, ...]:
        """Each tensor's rows, columns and whether it is projected, in model order."""
        parts = []
        for tensor in spec:
            size = int(np.prod(tensor.shape, dtype=np.int64))
            rows = tensor.shape[0] if len(tensor.shape) >= 2 else 1
            cols = size // rows if rows else 0
            projected = len(tensor.shape) >= 2 and size >= self.min_elements and cols > self.rank
            parts.append(_Part(tensor.name, tensor.shape, rows, cols, projected, self.rank))
        return tuple(parts)

    def length(self, spec: ModelSpec) -> int:
        """Elements of the projected vector of a model with this specification."""
        return sum(part.length for part in self.layout(spec))

    def basis(self, name: str, cols: int) -> F64:
        """The shared orthonormal basis of one tensor (``cols x rank``)."""
        digest = hashlib.sha256(b"geofl-shared-lowrank\0" + self.seed + name.encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:16], "little"))
        q, _ = np.linalg.qr(rng.standard_normal((cols, self.rank)))
        return q

    def project(self, tensors: Mapping[str, npt.NDArray[np.generic]], spec: ModelSpec) -> F64:
        """The flat vector a client sends (before weighting and masking)."""
        out = np.empty(self.length(spec), dtype=np.float64)
        offset = 0
        for part in self.layout(spec):
            matrix = np.asarray(tensors[part.name], dtype=np.float64).reshape(part.rows, -1)
            values = matrix @ self.basis(part.name, part.cols) if part.projected else matrix
            out[offset : offset + part.length] = values.reshape(-1)
            offset += part.length
        return out

    def lift(self, vector: F64, spec: ModelSpec) -> dict[str, F64]:
        """Tensors from a projected vector (or a sum of them: the map is linear)."""
        if vector.shape != (self.length(spec),):
            raise ValueError(f"projected vector of {vector.shape}, expected {self.length(spec)}")
        tensors: dict[str, F64] = {}
        offset = 0
        for part in self.layout(spec):
            values = vector[offset : offset + part.length]
            if part.projected:
                values = values.reshape(part.rows, self.rank) @ self.basis(part.name, part.cols).T
            tensors[part.name] = values.reshape(part.shape)
            offset += part.length
        return tensors


def projection_of(setup: pb.SecAggSetup) -> SharedLowRank | None:
    """The round's shared low-rank map, if its setup asks for one (same on both sides)."""
    if not setup.low_rank:
        return None
    return SharedLowRank(setup.low_rank, int(setup.low_rank_min_elements), bytes(setup.graph_seed))


def vector_length(spec: ModelSpec, setup: pb.SecAggSetup) -> int:
    """Elements of a masked upload: the (projected) update, then the client's weight; under
    distributed DP the rotated (padded) update alone."""
    if setup.HasField("ddp"):
        return padded_size(int(setup.ddp.dimension))
    projection = projection_of(setup)
    return (projection.length(spec) if projection else masked_length(spec) - 1) + 1
