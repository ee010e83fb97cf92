"""Masks from a cryptographic PRG: the AES-256-CTR keystream under the full 32-byte key.

Every key expanded here is used for one mask only (a fresh self-mask seed per round,
or a pairwise key bound to the round by HKDF), so a fixed all-zero counter block is
safe.  The keystream bytes are read as little-endian ring words and reduced modulo
``2**ring_bits``; the low bits of uniform words are uniform.  The keystream is written
chunk by chunk into one preallocated array (about 5 GB/s with AES-NI).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from geofl.protocols.secagg.errors import SecAggError
from geofl.protocols.secagg.ring import RingArray, ring_dtype, ring_reduce

MASK_KEY_BYTES = 32
_COUNTER_BLOCK = bytes(16)
_CHUNK_BYTES = 1 << 20
_ZEROS = bytes(_CHUNK_BYTES)
#: ``update_into`` wants room for one block beyond the input.
_SLACK = 15


def mask_buffer(count: int, ring_bits: int) -> npt.NDArray[np.uint8]:
    """Room for one mask of ``count`` ring elements, for :func:`expand` to reuse.

    A client adds several masks to its vector and the server removes one per survivor;
    expanding each into the same buffer saves a fresh allocation (and its page faults)
    per mask.
    """
    return np.empty(count * ring_dtype(ring_bits).itemsize + _SLACK, dtype=np.uint8)


def expand(
    key: bytes, count: int, ring_bits: int, *, buffer: npt.NDArray[np.uint8] | None = None
) -> RingArray:
    """``count`` pseudo-random ring elements, uniform in ``[0, 2**ring_bits)``, from ``key``.

    With ``buffer`` (from :func:`mask_buffer`) the elements are written there and the
    result is a view of it, valid until the buffer's next use.
    """
    if not isinstance(key, bytes) or len(key) != MASK_KEY_BYTES:
        raise SecAggError(f"a mask key must be {MASK_KEY_BYTES} bytes")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise SecAggError(f"mask length must be an int >= 0, got {count!r}")
    dtype = ring_dtype(ring_bits)
    size = count * dtype.itemsize
    if buffer is None:
        buffer = mask_buffer(count, ring_bits)
    elif buffer.dtype != np.uint8 or buffer.ndim != 1 or buffer.size < size + _SLACK:
        raise SecAggError(f"a mask buffer for {count} elements must be uint8[>= {size + _SLACK}]")
    view = buffer.data
    encryptor = Cipher(algorithms.AES(key), modes.CTR(_COUNTER_BLOCK)).encryptor()
    for start in range(0, size, _CHUNK_BYTES):
        length = min(_CHUNK_BYTES, size - start)
        encryptor.update_into(_ZEROS[:length], view[start : start + length + _SLACK])
    words = buffer[:size].view(dtype.newbyteorder("<")).astype(dtype, copy=False)
    return ring_reduce(words, ring_bits)


def apply_self_mask(
    out: RingArray,
    seed: bytes,
    ring_bits: int,
    *,
    remove: bool = False,
    buffer: npt.NDArray[np.uint8] | None = None,
) -> None:
    """Add (``remove``: subtract) the self mask PRG(``seed``) to ``out`` in place, mod ring.

    ``buffer``: scratch space from :func:`mask_buffer` (else one is allocated).
    """
    mask = expand(seed, out.size, ring_bits, buffer=buffer)
    (np.subtract if remove else np.add)(out, mask, out=out)
    ring_reduce(out, ring_bits)


def apply_pairwise_masks(
    out: RingArray,
    node: int,
    pair_keys: Mapping[int, bytes],
    ring_bits: int,
    *,
    buffer: npt.NDArray[np.uint8] | None = None,
) -> None:
    """Add ``node``'s pairwise masks to ``out`` in place, mod ring.

    For each peer ``j`` with agreed key ``s``: ``+PRG(s)`` when ``j > node`` and
    ``-PRG(s)`` when ``j < node``, so the masks of both ends of a pair cancel in a sum.
    The server removes a dropped client's unmatched masks by applying that client's
    masks towards the survivors: they are exactly the negation of what is left over.
    """
    if buffer is None and pair_keys:
        buffer = mask_buffer(out.size, ring_bits)  # one for every peer's mask
    for peer, key in pair_keys.items():
        if peer == node:
            raise SecAggError(f"node {node} cannot hold a pairwise mask with itself")
        mask = expand(key, out.size, ring_bits, buffer=buffer)
        (np.add if peer > node else np.subtract)(out, mask, out=out)
    ring_reduce(out, ring_bits)


__all__ = ["MASK_KEY_BYTES", "apply_pairwise_masks", "apply_self_mask", "expand", "mask_buffer"]
