"""Compress and decompress one tensor through a chain of codecs.

Encoding starts from the payload ``{"x": tensor}``; each step ``i`` rewrites it with
its own generator ``default_rng([seed, i])`` and the caller's per-tensor ``state``.
Same input, chain and seed give the same bytes (see ``docs/compression.md`` for the
limits of that promise across BLAS builds).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from geofl.protocols.codecs.base import Chain, CodecState, PayloadSpec, check_chain
from geofl.protocols.codecs.wire import finish, framed_size, run_decode, run_encode, step_tag

NDArray = npt.NDArray[Any]


def encode_tensor(
    array: npt.ArrayLike, chain: Chain, *, seed: int, state: CodecState | None = None
) -> bytes:
    """The compressed bytes of ``array``.

    Parameters
    ----------
    array
        Any dtype; lossy codecs act on float tensors and pass the others through.
    chain
        The steps, applied in order (sparsifiers and factorizations before casts and
        quantizers).
    seed
        In ``0 .. 2**64 - 1``; drives stochastic rounding and random-k index sets.
        Clients that must share a random-k index set (secure aggregation) share it.
    state
        This tensor's codec state (PowerSGD's warm-start factor), updated in place.
    """
    return run_encode(array, chain, seed, state)


def decode_tensor(
    payload: bytes | bytearray | memoryview, chain: Chain, dtype: str, shape: tuple[int, ...]
) -> NDArray:
    """The tensor ``payload`` represents, as a new array of ``dtype`` and ``shape``.

    Raises :class:`~geofl.protocols.codecs.CodecError` (a ``ProtocolError``) for a
    malformed payload: wrong length, truncated, unknown or unexpected codec id, indices
    out of range, bad or non-finite scales, or a size that does not match ``shape``.
    """
    shape = tuple(int(d) for d in shape)
    limit = int(np.prod(shape, dtype=np.int64))
    return finish(run_decode(payload, chain, limit), dtype, shape)


def estimate_bytes(dtype: str, shape: tuple[int, ...], chain: Chain) -> int:
    """Size of :func:`encode_tensor`'s output for a tensor of ``dtype`` and ``shape``.

    Exact for every codec except ``topk``, where it is an upper bound (the index
    encoding adapts to the data).
    """
    check_chain(chain)
    spec: PayloadSpec = {"x": (np.dtype(dtype).name, tuple(int(d) for d in shape))}
    for index, step in enumerate(chain):
        spec = step.codec.estimate(spec, step.params, step_tag(index))
    return framed_size([step.codec.wire_id for step in chain], spec)
