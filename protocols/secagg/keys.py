"""X25519 key pairs and per-round, per-pair key agreement (HKDF-SHA256).

Each client holds two pairs per round: one whose agreed keys encrypt Shamir shares
in transit, one whose agreed keys seed the pairwise masks.  The HKDF ``info`` binds
the purpose, run, round and the unordered pair of node ids, so a key agreed for one
pair, round or purpose is useless for any other.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from geofl.protocols.secagg.errors import SecAggError

PUBLIC_KEY_BYTES = 32
PRIVATE_KEY_BYTES = 32
AGREED_KEY_BYTES = 32
#: HKDF purposes: share transport keys and pairwise-mask seeds never coincide.
SHARE_PURPOSE = b"share"
MASK_PURPOSE = b"mask"
_INFO_PREFIX = b"geofl-secagg/v1/"
_U64_MAX = (1 << 64) - 1


@dataclass(frozen=True)
class PublicKeys:
    """What a client advertises: raw X25519 public keys for encryption and masking."""

    encrypt: bytes
    mask: bytes

    def __post_init__(self) -> None:
        for name in ("encrypt", "mask"):
            value = getattr(self, name)
            if not isinstance(value, bytes) or len(value) != PUBLIC_KEY_BYTES:
                raise SecAggError(f"PublicKeys.{name} must be {PUBLIC_KEY_BYTES} raw bytes")


def generate_private_key() -> X25519PrivateKey:
    """A fresh X25519 private key from the operating system's randomness."""
    return X25519PrivateKey.generate()


def public_bytes(private: X25519PrivateKey) -> bytes:
    """The raw 32-byte public key of ``private``."""
    return private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


def private_bytes(private: X25519PrivateKey) -> bytes:
    """The raw 32-byte private key (what a client Shamir-shares for dropout recovery)."""
    return private.private_bytes_raw()


def load_private_key(raw: bytes) -> X25519PrivateKey:
    """The private key behind 32 raw bytes (e.g. reconstructed from shares)."""
    if not isinstance(raw, bytes) or len(raw) != PRIVATE_KEY_BYTES:
        raise SecAggError(f"an X25519 private key is {PRIVATE_KEY_BYTES} raw bytes")
    return X25519PrivateKey.from_private_bytes(raw)


def _u64(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _U64_MAX:
        raise SecAggError(f"{name} must be an int in 0..2**64-1, got {value!r}")
    return value


def agreement_info(purpose: bytes, run_id: int, round: int, node_a: int, node_b: int) -> bytes:
    """HKDF ``info`` for one purpose, run, round and unordered pair of nodes."""
    low, high = sorted((_u64("node id", node_a), _u64("node id", node_b)))
    if low == high:
        raise SecAggError(f"node {low} cannot agree a key with itself")
    numbers = struct.pack(">QQQQ", _u64("run_id", run_id), _u64("round", round), low, high)
    return _INFO_PREFIX + purpose + b"/" + numbers


def agree(private: X25519PrivateKey, peer_public: bytes, *, info: bytes) -> bytes:
    """X25519 with ``peer_public``, then HKDF-SHA256 to 32 bytes bound to ``info``."""
    if not isinstance(peer_public, bytes) or len(peer_public) != PUBLIC_KEY_BYTES:
        raise SecAggError(f"a peer public key must be {PUBLIC_KEY_BYTES} raw bytes")
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as error:  # a low-order point gives the all-zero secret
        raise SecAggError(f"key agreement failed: {error}") from error
    hkdf = HKDF(algorithm=hashes.SHA256(), length=AGREED_KEY_BYTES, salt=None, info=info)
    return hkdf.derive(shared)


__all__ = [
    "AGREED_KEY_BYTES",
    "MASK_PURPOSE",
    "PUBLIC_KEY_BYTES",
    "SHARE_PURPOSE",
    "PublicKeys",
    "agree",
    "agreement_info",
    "generate_private_key",
    "load_private_key",
    "private_bytes",
    "public_bytes",
]
