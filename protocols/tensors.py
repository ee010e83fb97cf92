"""Tensor specifications and dtype mapping (no wire types here).

A model is described by an ordered tuple of :class:`TensorSpec`; every inbound
tensor is checked against it before it touches an aggregate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from geofl.protocols.codecs import Chain
from geofl.protocols.errors import TensorError
from geofl.protocols.types import WeightsView

#: Dtypes that travel on the wire, by numpy name.  bfloat16 is reserved in the
#: schema for the compression codecs; numpy has no native bfloat16.
SUPPORTED_DTYPES: tuple[str, ...] = (
    "float32",
    "float64",
    "float16",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
    "uint16",
    "uint32",
)


@dataclass(frozen=True)
class TensorSpec:
    """Name, dtype and shape of one tensor."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Size of the tensor's raw data in bytes.

        Exact integer arithmetic: a hostile announced shape cannot wrap around to a small
        size, and receivers that check every tensor of every update pay ~0.4 us, not ~2.5.
        """
        return int(math.prod(self.shape)) * np.dtype(self.dtype).itemsize

    def describe(self) -> str:
        """``name: dtype[shape]`` for error messages."""
        return f"{self.name}: {self.dtype}{list(self.shape)}"


ModelSpec = tuple[TensorSpec, ...]


@dataclass(frozen=True)
class EncodedTensor:
    """A tensor compressed by a codec chain, as it travels: its payload and how to decode it.

    ``add_to_base`` marks a difference: the receiver adds the decoded values to its copy
    of the base model version it named (compressed broadcasts).
    """

    payload: bytes
    chain: Chain
    dtype: str
    shape: tuple[int, ...]
    add_to_base: bool = False

    @property
    def spec_bytes(self) -> int:
        """Size of the decoded tensor in bytes."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Difference:
    """``new - base``, computed piece by piece as it is sent (never whole in memory)."""

    new: npt.NDArray[np.generic]
    base: npt.NDArray[np.generic]

    @property
    def dtype(self) -> np.dtype[np.generic]:
        """dtype of the difference (that of the base)."""
        return self.base.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the difference."""
        return tuple(self.base.shape)

    @property
    def nbytes(self) -> int:
        """Size of the difference in bytes."""
        return int(self.base.nbytes)

    def materialize(self) -> npt.NDArray[np.generic]:
        """The whole difference as an array."""
        result: npt.NDArray[np.generic] = np.subtract(self.new, self.base, dtype=self.base.dtype)
        return result


#: What a tensor stream carries per name: raw arrays, differences or encoded payloads.
Tensorish = npt.NDArray[np.generic] | Difference | EncodedTensor


def spec_of(weights: WeightsView) -> ModelSpec:
    """The specification of ``weights``, in their order."""
    specs = []
    for name, array in weights.items():
        dtype = np.dtype(array.dtype)
        if dtype.name not in SUPPORTED_DTYPES:
            raise TensorError(f"tensor {name!r} has unsupported dtype {dtype}")
        specs.append(TensorSpec(name, dtype.name, tuple(int(d) for d in array.shape)))
    return tuple(specs)


def model_bytes(spec: Iterable[TensorSpec]) -> int:
    """Total raw size of a model."""
    return sum(t.nbytes for t in spec)


#: Name of the one tensor of a secure-aggregation (masked) upload.
MASKED_TENSOR = "masked"


def masked_length(spec: Iterable[TensorSpec]) -> int:
    """Elements of a secure-aggregation vector: every parameter, then the client's weight."""
    return sum(int(np.prod(t.shape, dtype=np.int64)) for t in spec) + 1


def check_matches(spec: ModelSpec, weights: WeightsView) -> None:
    """Raise :class:`TensorError` naming the first difference from ``spec``."""
    names = [t.name for t in spec]
    if list(weights) != names:
        missing = sorted(set(names) - set(weights))
        extra = sorted(set(weights) - set(names))
        detail = f"missing {missing}, unexpected {extra}" if missing or extra else "order differs"
        raise TensorError(f"tensor names do not match the model: {detail}")
    for expected, actual in zip(spec, spec_of(weights), strict=True):
        if expected != actual:
            raise TensorError(f"expected {expected.describe()}, got {actual.describe()}")


__all__ = [
    "MASKED_TENSOR",
    "SUPPORTED_DTYPES",
    "Difference",
    "EncodedTensor",
    "ModelSpec",
    "TensorSpec",
    "Tensorish",
    "check_matches",
    "masked_length",
    "model_bytes",
    "spec_of",
]
