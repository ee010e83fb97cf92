"""Who a joining node is: the authorized keys, the challenges, and certificate names.

Two ways to prove an identity (docs/security.md), usable together:

- **a key**: the node signs a fresh nonce of :meth:`ChallengeBook.issue` with its
  Ed25519 key (:func:`geofl.protocols.identity.join_message`), and the key must be in
  :class:`AuthorizedNodes` (``server.auth.nodes``), which names the node;
- **a certificate** (mutual TLS, ``server.tls.client_ca``): the TLS layer verified the
  node's certificate; its common name is the node's name, its organizational unit the
  region.

A nonce is bound to the connection it was asked on (gRPC's peer address of the call:
gRPC Python exposes no TLS channel binding), used once, and valid for ``ttl_s``.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID
from pydantic import Field, ValidationError

from geofl.protocols.errors import IdentityRefusedError
from geofl.protocols.identity import (
    KeyFileError,
    fingerprint,
    join_message,
    load_public_key,
    raw_public_key,
    verify,
)
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.config.errors import ConfigError
from geofl.server.config.fields import Section
from geofl.server.config.yamlsource import parse_yaml
from geofl.server.nodes.revocation import CertificateId, RevokedCertificates

__all__ = [
    "AuthorizedKey",
    "AuthorizedNodes",
    "ChallengeBook",
    "JoinCheck",
    "NodeIdentity",
    "certificate_identity",
    "key_identity",
]

log = logging.getLogger(__name__)

_NAME = r"^[A-Za-z0-9_.-]+$"


@dataclass(frozen=True)
class NodeIdentity:
    """A proven identity: the node's name, its region if the credential names one, and
    the credential (``key SHA256:...`` or ``certificate CN=...``) for logs and revocation;
    with mutual TLS, the client certificate's issuer and serial (what a CRL revokes)."""

    name: str
    region: str | None
    credential: str
    certificate: CertificateId | None = None


@dataclass(frozen=True)
class AuthorizedKey:
    """One authorized node: its name, optional region and raw Ed25519 public key."""

    name: str
    region: str | None
    raw_key: bytes

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.raw_key)


class _Entry(Section):
    name: str = Field(min_length=1, max_length=128, pattern=_NAME)
    public_key: str = Field(min_length=1)
    region: str | None = Field(default=None, min_length=1, max_length=64, pattern=_NAME)


def _entries(data: object) -> list[object]:
    """One entry, or a list of them under ``nodes:``."""
    if isinstance(data, Mapping) and set(data) == {"nodes"}:
        listed = data["nodes"]
        return list(listed) if isinstance(listed, list) else [listed]
    return [data]


def _read_file(path: Path) -> list[AuthorizedKey]:
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError.single(source, f"cannot read the authorized nodes: {exc}") from None
    _, data = parse_yaml(text, source)
    keys = []
    for index, item in enumerate(_entries(data)):
        try:
            entry = _Entry.model_validate(item)
        except ValidationError as exc:
            first = exc.errors()[0]
            at = ".".join(str(part) for part in first["loc"])
            raise ConfigError.single(
                source, f"entry {index}: {at}: {first['msg']}", path="server.auth.nodes"
            ) from None
        try:
            key = load_public_key(entry.public_key, f"{source}: node {entry.name}")
        except KeyFileError as exc:
            raise ConfigError.single(source, str(exc), path="server.auth.nodes") from None
        keys.append(AuthorizedKey(entry.name, entry.region, raw_public_key(key)))
    return keys


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    return [path]


class AuthorizedNodes:
    """The public keys at ``server.auth.nodes`` (a file or a directory of files).

    :meth:`refresh` re-reads them when a file changed (or when forced, on SIGHUP); a list
    that became unreadable or invalid keeps the previous one in force and logs why.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._by_key: dict[bytes, AuthorizedKey] = {}
        self._stamp: tuple[tuple[str, int, int], ...] = ()
        self._load()

    def _current_stamp(self) -> tuple[tuple[str, int, int], ...]:
        try:
            found = _files(self.path)
            return tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in found)
        except OSError:
            return (("<missing>", 0, 0),)

    def _load(self) -> None:
        """Read every file.

        Raises
        ------
        ConfigError
            Naming the file and the entry that is wrong, or two entries that clash.
        """
        stamp = self._current_stamp()
        if not self.path.exists():
            raise ConfigError.single(str(self.path), "authorized nodes not found")
        by_key: dict[bytes, AuthorizedKey] = {}
        names: dict[str, str] = {}
        for path in _files(self.path):
            for key in _read_file(path):
                if key.raw_key in by_key or key.name in names:
                    raise ConfigError.single(
                        str(path),
                        f"node {key.name!r} ({key.fingerprint}) is listed twice",
                        path="server.auth.nodes",
                    )
                by_key[key.raw_key] = key
                names[key.name] = str(path)
        self._by_key, self._stamp = by_key, stamp

    def lookup(self, raw_key: bytes) -> AuthorizedKey | None:
        """The authorized node with this public key, or ``None``."""
        return self._by_key.get(raw_key)

    def __len__(self) -> int:
        return len(self._by_key)

    def names(self) -> frozenset[str]:
        """The names of every authorized key."""
        return frozenset(key.name for key in self._by_key.values())

    def refresh(self, *, force: bool = False) -> bool:
        """Re-read the list if a file changed (or ``force``); whether a new list took effect."""
        if not force and self._current_stamp() == self._stamp:
            return False
        try:
            self._load()
        except ConfigError as exc:
            self._stamp = self._current_stamp()  # do not retry every tick until it changes
            log.error("authorized nodes not reloaded, the previous list stays in force: %s", exc)
            return False
        log.info("authorized nodes reloaded: %d keys from %s", len(self._by_key), self.path)
        return True

    def still_valid(self, identity: NodeIdentity) -> bool:
        """Whether a key identity is still authorized under the same name and region."""
        if not identity.credential.startswith("key "):
            return True
        fingerprint_text = identity.credential.removeprefix("key ")
        return any(
            key.fingerprint == fingerprint_text and key.name == identity.name
            for key in self._by_key.values()
        )


class ChallengeBook:
    """Outstanding join nonces: each bound to one connection, used once, short-lived.

    At most ``capacity`` are kept (the oldest are forgotten first), so a flood of
    Challenge calls costs bounded memory.
    """

    def __init__(
        self,
        ttl_s: float = 30.0,
        capacity: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self._capacity = capacity
        self._clock = clock
        self._open: OrderedDict[bytes, tuple[str, float]] = OrderedDict()

    def issue(self, channel: str) -> bytes:
        """A fresh nonce for ``channel``."""
        nonce = secrets.token_bytes(32)
        self._open[nonce] = (channel, self._clock() + self.ttl_s)
        while len(self._open) > self._capacity:
            self._open.popitem(last=False)
        return nonce

    def redeem(self, nonce: bytes, channel: str) -> None:
        """Use ``nonce`` once, on the connection it was issued to.

        Raises
        ------
        IdentityRefusedError
            If the nonce is unknown, already used, expired, or was issued to another
            connection (a replay).
        """
        found = self._open.pop(nonce, None)
        if found is None:
            raise IdentityRefusedError("join challenge unknown, already used, or expired")
        bound, expires = found
        if bound != channel:
            raise IdentityRefusedError(
                "join challenge was issued to another connection (replayed signature?)"
            )
        if self._clock() > expires:
            raise IdentityRefusedError("join challenge expired; ask for a new one")


def key_identity(
    keys: AuthorizedNodes,
    book: ChallengeBook,
    proof: pb.JoinProof,
    binding: tuple[int, str, str, str],
) -> NodeIdentity:
    """Check a join's key proof; ``binding`` is (run id, run name, channel, claimed name).

    Raises
    ------
    IdentityRefusedError
        If the key is not authorized, the nonce cannot be redeemed on this connection, or
        the signature does not cover this run, connection and name.
    """
    run_id, run_name, channel, claimed = binding
    if not proof.public_key:
        raise IdentityRefusedError(
            "this server authenticates nodes by key (server.auth): start the client with "
            "--node-key NAME.key"
        )
    entry = keys.lookup(bytes(proof.public_key))
    if entry is None:
        raise IdentityRefusedError(
            f"key {fingerprint(bytes(proof.public_key))} is not authorized (unknown or revoked)"
        )
    book.redeem(bytes(proof.nonce), channel)
    message = join_message(run_id, run_name, bytes(proof.nonce), channel, claimed)
    if not verify(bytes(proof.public_key), bytes(proof.signature), message):
        raise IdentityRefusedError(
            f"the signature of key {entry.fingerprint} does not cover this run, connection "
            "and node name"
        )
    return NodeIdentity(entry.name, entry.region, f"key {entry.fingerprint}")


def certificate_identity(auth_context: Mapping[str, Any]) -> NodeIdentity:
    """The identity in the client certificate that TLS verified (mutual TLS).

    Raises
    ------
    IdentityRefusedError
        If the connection carries no client certificate or it names no common name.
    """
    pems = auth_context.get("x509_pem_cert") or []
    if not pems:
        raise IdentityRefusedError("this server requires a client certificate (mutual TLS)")
    pem = pems[0]
    certificate = x509.load_pem_x509_certificate(pem if isinstance(pem, bytes) else pem.encode())
    subject = certificate.subject

    def first(oid: x509.ObjectIdentifier) -> str | None:
        found = subject.get_attributes_for_oid(oid)
        value = found[0].value if found else None
        return value.decode() if isinstance(value, bytes) else value

    name = first(NameOID.COMMON_NAME)
    if not name:
        raise IdentityRefusedError("the client certificate has no common name (CN)")
    region = first(NameOID.ORGANIZATIONAL_UNIT_NAME)
    serial = f"{certificate.serial_number:x}"
    return NodeIdentity(
        name, region, f"certificate CN={name} serial {serial}", CertificateId.of(certificate)
    )


@dataclass(frozen=True)
class JoinCheck:
    """How a server checks who joins: by key, by certificate, both, or not at all."""

    keys: AuthorizedNodes | None = None
    certificates: bool = False
    #: Mutual TLS: the certificates revoked by ``server.tls.crl`` (None: no CRL).
    revoked: RevokedCertificates | None = None

    @property
    def enabled(self) -> bool:
        return self.keys is not None or self.certificates

    def refresh(self, *, force: bool = False) -> bool:
        """Re-read the authorized keys and the CRL where changed; whether either changed."""
        sources = [s for s in (self.keys, self.revoked) if s is not None]
        changed = [source.refresh(force=force) for source in sources]  # every one, no short cut
        return any(changed)

    def still_valid(self, identity: NodeIdentity) -> bool:
        """Whether a session's identity is still authorized: key listed, certificate not
        revoked."""
        if self.keys is not None and not self.keys.still_valid(identity):
            return False
        if self.revoked is None or identity.certificate is None:
            return True
        return not self.revoked.is_revoked(identity.certificate)

    def identify(
        self,
        request: pb.JoinRequest,
        book: ChallengeBook,
        auth_context: Mapping[str, Any],
        run: tuple[int, str, str],
    ) -> NodeIdentity | None:
        """The joining node's proven identity, or ``None`` when the server checks none.

        ``run`` is (run id, run name, channel). A node may leave ``node_name`` empty (it
        gets the credential's name) but may not claim another name.

        Raises
        ------
        IdentityRefusedError
            If a credential is missing or wrong, or the claimed name or region is not the
            credential's.
        """
        if not self.enabled:
            return None
        cert = certificate_identity(auth_context) if self.certificates else None
        if cert is not None and not self.still_valid(cert):
            raise IdentityRefusedError(
                f"the client certificate of {cert.name!r} ({cert.credential}) is revoked "
                "(server.tls.crl)"
            )
        found = cert
        if self.keys is not None:
            binding = (run[0], run[1], run[2], request.node_name)
            found = key_identity(self.keys, book, request.proof, binding)
            if cert is not None and cert.name != found.name:
                raise IdentityRefusedError(
                    f"the client certificate names {cert.name!r} but the key is {found.name!r}'s"
                )
            if cert is not None:  # revoking either credential ends the session
                found = replace(found, certificate=cert.certificate)
        if found is None:  # unreachable: enabled means keys or certificates
            raise IdentityRefusedError("no credential")
        if request.node_name and request.node_name != found.name:
            raise IdentityRefusedError(
                f"claims node name {request.node_name!r}, but its {found.credential} is "
                f"{found.name!r}'s"
            )
        if found.region and request.region and request.region != found.region:
            raise IdentityRefusedError(
                f"claims region {request.region!r}, but {found.name!r} is authorized for "
                f"region {found.region!r}"
            )
        return found
