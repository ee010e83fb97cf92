"""Revoked node certificates: the CRL at ``server.tls.crl`` (mutual TLS).

gRPC Python verifies a client certificate against ``server.tls.client_ca`` but exposes
no revocation check, so the server checks the certificate TLS verified against a
certificate revocation list at join, and ends the sessions of certificates the list
revokes later. The list must be signed by a CA of ``client_ca`` (a list anyone could
write would let anyone un-revoke a node). Like the authorized keys, it is re-read when
the file changes or on SIGHUP; a new list that is unreadable or badly signed leaves the
previous one in force.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa

from geofl.server.config.errors import ConfigError

__all__ = ["CertificateId", "RevokedCertificates", "read_crls"]

log = logging.getLogger(__name__)

#: Keys a CA can sign a CRL with.
_ISSUER_KEYS = (
    rsa.RSAPublicKey,
    ec.EllipticCurvePublicKey,
    ed25519.Ed25519PublicKey,
    ed448.Ed448PublicKey,
    dsa.DSAPublicKey,
)
_PEM_CRL = re.compile(rb"-----BEGIN X509 CRL-----.+?-----END X509 CRL-----", re.DOTALL)


class CertificateId(NamedTuple):
    """What a CRL names a certificate by: its issuer (DER) and serial number."""

    issuer: bytes
    serial: int

    @classmethod
    def of(cls, certificate: x509.Certificate) -> CertificateId:
        return cls(certificate.issuer.public_bytes(), certificate.serial_number)


def read_crls(data: bytes, source: str) -> list[x509.CertificateRevocationList]:
    """Every CRL in ``data``: PEM blocks (one or more), or one DER list.

    Raises
    ------
    ConfigError
        If ``data`` holds no CRL or one that does not parse.
    """
    blocks = _PEM_CRL.findall(data)
    try:
        if blocks:
            return [x509.load_pem_x509_crl(block) for block in blocks]
        return [x509.load_der_x509_crl(data)]
    except ValueError as exc:
        raise ConfigError.single(
            source, f"not a certificate revocation list (PEM or DER): {exc}", path="server.tls.crl"
        ) from None


def _issuers(ca_path: Path) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(ca_path.read_bytes())


class RevokedCertificates:
    """The CRLs at ``path``, each checked against a CA certificate of ``ca_path``."""

    def __init__(self, path: Path, ca_path: Path) -> None:
        self.path = path
        self._cas = _issuers(ca_path)
        self._revoked: frozenset[CertificateId] = frozenset()
        self._stamp: tuple[int, int] = (0, 0)
        self._load()

    def _current_stamp(self) -> tuple[int, int]:
        try:
            stat = self.path.stat()
        except OSError:
            return (-1, -1)
        return (stat.st_mtime_ns, stat.st_size)

    def _load(self) -> None:
        """Read the file and check every list's signature.

        Raises
        ------
        ConfigError
            If the file is missing or not a CRL, or a list is not signed by a CA of
            ``server.tls.client_ca``.
        """
        stamp, source = self._current_stamp(), str(self.path)
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise ConfigError.single(source, f"cannot read the CRL: {exc}") from None
        revoked: set[CertificateId] = set()
        for crl in read_crls(data, source):
            self._check_signature(crl, source)
            issuer = crl.issuer.public_bytes()
            revoked.update(CertificateId(issuer, entry.serial_number) for entry in crl)
            _warn_if_stale(crl, source)
        self._revoked, self._stamp = frozenset(revoked), stamp

    def _check_signature(self, crl: x509.CertificateRevocationList, source: str) -> None:
        for ca in self._cas:
            key = ca.public_key()
            if (
                ca.subject == crl.issuer
                and isinstance(key, _ISSUER_KEYS)
                and crl.is_signature_valid(key)
            ):
                return
        raise ConfigError.single(
            source,
            f"the CRL of {crl.issuer.rfc4514_string()!r} is not signed by a CA of "
            "server.tls.client_ca",
            path="server.tls.crl",
        )

    def __len__(self) -> int:
        return len(self._revoked)

    def is_revoked(self, certificate: CertificateId) -> bool:
        return certificate in self._revoked

    def refresh(self, *, force: bool = False) -> bool:
        """Re-read the file if it changed (or ``force``); whether a new list took effect."""
        if not force and self._current_stamp() == self._stamp:
            return False
        try:
            self._load()
        except ConfigError as exc:
            self._stamp = self._current_stamp()  # do not retry every tick until it changes
            log.error("CRL not reloaded, the previous one stays in force: %s", exc)
            return False
        log.info("CRL reloaded: %d revoked certificates from %s", len(self), self.path)
        return True


def _warn_if_stale(crl: x509.CertificateRevocationList, source: str) -> None:
    """A list past its next update is still used (it revokes what it lists), with a warning."""
    due = crl.next_update_utc
    if due is not None and due < dt.datetime.now(dt.UTC):
        log.warning(
            "%s: the CRL of %s was due for renewal at %s; its entries still apply "
            "(renew it: geofl certs revoke --ca DIR)",
            source,
            crl.issuer.rfc4514_string(),
            due.isoformat(timespec="seconds"),
        )
