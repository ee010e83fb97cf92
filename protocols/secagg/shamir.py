"""Shamir secret sharing over the prime field GF(2**521 - 1).

A secret of up to :data:`MAX_SECRET_BYTES` bytes is one field element: it is read as
the big-endian integer of ``0x01 || secret`` (the marker byte keeps leading zero bytes
and the length).  :func:`split` evaluates a random polynomial of degree
``threshold - 1`` whose constant term is that element at each (non-zero) share id;
any ``threshold`` shares recover it by Lagrange interpolation at zero, fewer reveal
nothing about it.  Shares travel as fixed-width big-endian :data:`SHARE_BYTES` bytes.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence

from geofl.protocols.secagg.errors import SecAggError

#: The Mersenne prime 2**521 - 1, so a 32-byte key (and up to 64 bytes) is one element.
PRIME = (1 << 521) - 1
#: Width of one encoded share: ceil(521 / 8) bytes.
SHARE_BYTES = 66
#: 0x01 marker + secret must stay below PRIME: 1 + 64 bytes = 520 bits.
MAX_SECRET_BYTES = 64


def _check_ids(share_ids: Sequence[int]) -> list[int]:
    ids = list(share_ids)
    for share_id in ids:
        if isinstance(share_id, bool) or not isinstance(share_id, int):
            raise SecAggError(f"share id {share_id!r} is not an int")
        if not 0 < share_id < PRIME:
            raise SecAggError(f"share id {share_id} must be in 1..2**521-2 (0 is the secret)")
    if len(set(ids)) != len(ids):
        raise SecAggError(f"share ids must be distinct, got {sorted(ids)}")
    return ids


def _check_threshold(threshold: int, available: int) -> None:
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise SecAggError(f"threshold must be an int >= 1, got {threshold!r}")
    if threshold > available:
        raise SecAggError(f"threshold {threshold} exceeds the {available} shares")


def _evaluate(coefficients: Sequence[int], x: int) -> int:
    """Horner's rule, modulo PRIME; ``coefficients[0]`` is the constant term."""
    value = 0
    for coefficient in reversed(coefficients):
        value = (value * x + coefficient) % PRIME
    return value


def split(secret: bytes, threshold: int, share_ids: Sequence[int]) -> dict[int, bytes]:
    """Shares of ``secret``, one per id, any ``threshold`` of which reconstruct it."""
    if not isinstance(secret, bytes) or len(secret) > MAX_SECRET_BYTES:
        raise SecAggError(f"the secret must be at most {MAX_SECRET_BYTES} bytes")
    ids = _check_ids(share_ids)
    _check_threshold(threshold, len(ids))
    constant = int.from_bytes(b"\x01" + secret, "big")
    coefficients = [constant] + [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    return {i: _evaluate(coefficients, i).to_bytes(SHARE_BYTES, "big") for i in ids}


def _share_value(share_id: int, share: bytes) -> int:
    if not isinstance(share, bytes) or len(share) != SHARE_BYTES:
        raise SecAggError(f"share {share_id} must be {SHARE_BYTES} bytes")
    value = int.from_bytes(share, "big")
    if value >= PRIME:
        raise SecAggError(f"share {share_id} is not a field element")
    return value


def _interpolate_at_zero(points: Mapping[int, int]) -> int:
    """Lagrange interpolation of the polynomial through ``points`` at x = 0."""
    total = 0
    for xi, yi in points.items():
        numerator, denominator = 1, 1
        for xj in points:
            if xj != xi:
                numerator = numerator * xj % PRIME
                denominator = denominator * (xj - xi) % PRIME
        total = (total + yi * numerator * pow(denominator, -1, PRIME)) % PRIME
    return total


def _decode_secret(value: int) -> bytes:
    """Undo the ``0x01 || secret`` encoding; anything else means inconsistent shares."""
    length, extra = divmod(value.bit_length() - 1, 8)
    if value == 0 or extra or length > MAX_SECRET_BYTES:
        raise SecAggError("the shares do not reconstruct a valid secret (corrupt or mixed)")
    return (value - (1 << (8 * length))).to_bytes(length, "big")


def reconstruct(shares: Mapping[int, bytes], threshold: int) -> bytes:
    """The secret behind ``shares`` (the ``threshold`` lowest ids are used)."""
    if len(shares) < threshold:
        raise SecAggError(f"need {threshold} shares to reconstruct, got {len(shares)}")
    ids = sorted(_check_ids(list(shares)))
    _check_threshold(threshold, len(ids))
    points = {i: _share_value(i, shares[i]) for i in ids[:threshold]}
    return _decode_secret(_interpolate_at_zero(points))


__all__ = ["MAX_SECRET_BYTES", "PRIME", "SHARE_BYTES", "reconstruct", "split"]
