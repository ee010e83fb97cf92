"""Node identity by key: Ed25519 key files and the message a node signs to join.

Shared by the client (which signs) and the server (which verifies), so both build the
signed bytes in one place. A node proves who it is by signing a fresh server nonce
together with the run and the connection the nonce was issued on (the server's view
of the peer address): a signature is worth one join, on one connection, of one run.
gRPC Python exposes no TLS channel binding (no exporter keying material), so the
connection is named by its peer address; with TLS the peer address is that of the
encrypted connection, so a captured signature cannot be replayed on another one.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from geofl.protocols.errors import GeoflError

__all__ = [
    "KeyFileError",
    "fingerprint",
    "generate_key",
    "join_message",
    "load_private_key",
    "load_public_key",
    "private_pem",
    "public_pem",
    "raw_public_key",
    "verify",
]

_DOMAIN = b"geofl-join-v1\x00"


class KeyFileError(GeoflError):
    """A key file is missing, unreadable, or not an Ed25519 key in PEM."""


def _field(value: bytes) -> bytes:
    """Length-prefixed, so no two different field lists sign the same bytes."""
    return len(value).to_bytes(4, "big") + value


def join_message(run_id: int, run_name: str, nonce: bytes, channel: str, node_name: str) -> bytes:
    """The bytes a node signs to join ``run_id`` on ``channel`` as ``node_name``."""
    parts = (str(run_id).encode(), run_name.encode(), nonce, channel.encode(), node_name.encode())
    return _DOMAIN + b"".join(_field(part) for part in parts)


def generate_key() -> Ed25519PrivateKey:
    """A new Ed25519 private key."""
    return Ed25519PrivateKey.generate()


def private_pem(key: Ed25519PrivateKey) -> bytes:
    """PKCS#8 PEM of ``key`` (unencrypted: protect the file with its permissions)."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_pem(key: Ed25519PublicKey) -> str:
    """SubjectPublicKeyInfo PEM of ``key``."""
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")


def raw_public_key(key: Ed25519PublicKey) -> bytes:
    """The 32 raw bytes of ``key`` (what travels in a JoinProof)."""
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def fingerprint(raw: bytes) -> str:
    """``SHA256:...`` of a raw public key, as operators see it in logs and refusals."""
    digest = base64.b64encode(hashlib.sha256(raw).digest()).decode("ascii").rstrip("=")
    return f"SHA256:{digest}"


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in the PEM file ``path``.

    Raises
    ------
    KeyFileError
        If the file is missing, unreadable, or holds another kind of key.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"node key {path}: cannot read: {exc.strerror or exc}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"node key {path}: not a PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"node key {path}: not an Ed25519 key (make one: geofl keys new)")
    return key


def load_public_key(pem: str, where: str) -> Ed25519PublicKey:
    """The Ed25519 public key in ``pem``; ``where`` names its source in errors.

    Raises
    ------
    KeyFileError
        If ``pem`` is not an Ed25519 public key in PEM.
    """
    try:
        key = serialization.load_pem_public_key(pem.encode("ascii"))
    except (ValueError, TypeError, UnicodeEncodeError) as exc:
        raise KeyFileError(f"{where}: not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{where}: not an Ed25519 public key")
    return key


def verify(raw_key: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is ``raw_key``'s Ed25519 signature of ``message``."""
    try:
        Ed25519PublicKey.from_public_bytes(raw_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True
