"""Dtype rules shared by the accumulator and the server optimizers.

All arithmetic runs in float64; results go back to each tensor's own dtype. Integer tensors
(batch-norm counters and the like) carry integer deltas: rounded half to even, and for
unsigned tensors expressed in the signed type of the same width, because a delta can be
negative.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from geofl.server.strategies.errors import StrategyError

F64Array = npt.NDArray[np.float64]

__all__ = ["F64Array", "add_integer", "delta_dtype", "is_integer", "to_dtype"]

_SUPPORTED_KINDS = frozenset("fiu")


def is_integer(dtype: np.dtype[Any]) -> bool:
    """Return whether ``dtype`` is a (signed or unsigned) integer type."""
    return dtype.kind in "iu"


def delta_dtype(dtype: np.dtype[Any], name: str) -> np.dtype[Any]:
    """Return the dtype a delta of a ``dtype`` tensor is expressed in.

    Raises
    ------
    StrategyError
        If the tensor is neither a float nor an integer (bool, complex, object...).
    """
    if dtype.kind not in _SUPPORTED_KINDS:
        raise StrategyError(f"tensor {name!r}: dtype {dtype} is not a real float or integer type")
    if dtype.kind == "u":
        return np.dtype(f"i{dtype.itemsize}")
    return dtype


#: Elements per block when large tensors are processed piecewise: float64 temporaries
#: stay at 8 MiB whatever the model size.
BLOCK = 1 << 20


def blocks(size: int, block: int | None = None) -> Iterator[slice]:
    """Consecutive slices covering ``range(size)`` (one empty slice for size 0)."""
    block = block or BLOCK
    if size == 0:
        yield slice(0, 0)
        return
    for start in range(0, size, block):
        yield slice(start, min(start + block, size))


def flat(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A 1-d view of ``array`` (a copy only if it is not contiguous)."""
    return np.ascontiguousarray(array).reshape(-1)


def to_dtype(values: F64Array, dtype: np.dtype[Any], name: str) -> npt.NDArray[Any]:
    """Cast float64 ``values`` to ``dtype``: round and clip integers, refuse overflow to inf.

    Raises
    ------
    StrategyError
        If a finite float64 value does not fit the float ``dtype`` (it would become inf), or
        if ``values`` holds NaN or inf.
    """
    values = np.asarray(values, dtype=np.float64)
    if not bool(np.isfinite(values).all()):
        raise StrategyError(f"tensor {name!r}: result is not finite")
    if is_integer(dtype):
        low, high = _float_bounds(dtype)
        return np.asarray(np.clip(np.rint(values), low, high), dtype=dtype)
    with np.errstate(over="ignore"):
        cast = np.asarray(values, dtype=dtype)
    if not bool(np.isfinite(cast).all()):
        raise StrategyError(f"tensor {name!r}: result overflows {dtype}")
    return cast


def _float_bounds(dtype: np.dtype[Any]) -> tuple[float, float]:
    """Return the widest float64 range whose values all fit integer ``dtype`` exactly.

    ``float(iinfo(int64).max)`` rounds up to 2**63, which no longer fits; step one float
    inwards so the final cast cannot wrap.
    """
    info = np.iinfo(dtype)
    low, high = float(info.min), float(info.max)
    if high > info.max:
        high = float(np.nextafter(high, 0.0))
    return low, high


def add_integer(weights: npt.NDArray[Any], delta: npt.NDArray[Any], name: str) -> npt.NDArray[Any]:
    """Return ``weights + round(delta)`` in the dtype of ``weights``, clipped to its range.

    Computed in float64, so exact while the values stay below 2**53 in magnitude, which
    counters such as batch-norm's ``num_batches_tracked`` do.
    """
    rounded = np.rint(np.asarray(delta, dtype=np.float64))
    total = np.asarray(weights, dtype=np.float64) + rounded
    return to_dtype(total, weights.dtype, name)
