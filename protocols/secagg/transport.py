"""Authenticated encryption of Shamir shares between two clients (AES-256-GCM).

The server relays the ciphertexts, so it must learn nothing from them and must not be
able to redirect them: the associated data binds run, round, sender and recipient,
and the 96-bit nonce is random per message (one key encrypts one message per round
and direction, far below GCM's random-nonce limit).
"""

from __future__ import annotations

import os
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from geofl.protocols.secagg.errors import SecAggError
from geofl.protocols.secagg.keys import AGREED_KEY_BYTES
from geofl.protocols.secagg.shamir import SHARE_BYTES

NONCE_BYTES = 12
TAG_BYTES = 16
#: A client's message to one neighbour: its share of the mask key, then of the seed.
SHARE_PLAINTEXT_BYTES = 2 * SHARE_BYTES
SHARE_CIPHERTEXT_BYTES = NONCE_BYTES + SHARE_PLAINTEXT_BYTES + TAG_BYTES
_AD_PREFIX = b"geofl-secagg/v1/share"


def _associated_data(run_id: int, round: int, sender: int, recipient: int) -> bytes:
    try:
        return _AD_PREFIX + struct.pack(">QQQQ", run_id, round, sender, recipient)
    except struct.error as error:
        raise SecAggError(f"run, round and node ids must fit in 64 bits: {error}") from error


def _cipher(key: bytes) -> AESGCM:
    if not isinstance(key, bytes) or len(key) != AGREED_KEY_BYTES:
        raise SecAggError(f"a share-transport key is {AGREED_KEY_BYTES} bytes")
    return AESGCM(key)


def seal(
    key: bytes, plaintext: bytes, *, run_id: int, round: int, sender: int, recipient: int
) -> bytes:
    """``nonce || AES-GCM(plaintext)`` addressed from ``sender`` to ``recipient``."""
    nonce = os.urandom(NONCE_BYTES)
    data = _associated_data(run_id, round, sender, recipient)
    return nonce + _cipher(key).encrypt(nonce, plaintext, data)


def open_sealed(
    key: bytes, ciphertext: bytes, *, run_id: int, round: int, sender: int, recipient: int
) -> bytes:
    """The plaintext of :func:`seal`; anything tampered or misaddressed raises."""
    where = f"share ciphertext from node {sender} to node {recipient} (run {run_id}, round {round})"
    if not isinstance(ciphertext, bytes) or len(ciphertext) < NONCE_BYTES + TAG_BYTES:
        raise SecAggError(f"{where} is too short to be a ciphertext")
    data = _associated_data(run_id, round, sender, recipient)
    try:
        return _cipher(key).decrypt(ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:], data)
    except InvalidTag:
        raise SecAggError(
            f"{where} failed authentication: tampered, misaddressed or from another round"
        ) from None


def pack_shares(mask_key_share: bytes, seed_share: bytes) -> bytes:
    """The plaintext a client sends one neighbour: two fixed-width Shamir shares."""
    if len(mask_key_share) != SHARE_BYTES or len(seed_share) != SHARE_BYTES:
        raise SecAggError(f"each share must be {SHARE_BYTES} bytes")
    return mask_key_share + seed_share


def unpack_shares(plaintext: bytes) -> tuple[bytes, bytes]:
    """``(mask_key_share, seed_share)`` from :func:`pack_shares`' output."""
    if len(plaintext) != SHARE_PLAINTEXT_BYTES:
        raise SecAggError(f"a share message is {SHARE_PLAINTEXT_BYTES} bytes, got {len(plaintext)}")
    return plaintext[:SHARE_BYTES], plaintext[SHARE_BYTES:]


__all__ = [
    "SHARE_CIPHERTEXT_BYTES",
    "SHARE_PLAINTEXT_BYTES",
    "open_sealed",
    "pack_shares",
    "seal",
    "unpack_shares",
]
