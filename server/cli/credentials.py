"""``geofl keys`` and ``geofl certs``: the files node identity needs, made in one command.

``geofl keys new NAME`` writes ``NAME.key`` (the node's Ed25519 private key, mode 0600)
and ``NAME.node.yaml`` (its entry for the server's ``server.auth.nodes``). ``geofl certs``
makes a private CA, a server certificate and node certificates for mutual TLS
(``server.tls.client_ca``), and revokes node certificates in the CA's CRL
(``server.tls.crl``), with ``cryptography.x509``. See docs/security.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import re
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from geofl.protocols.errors import GeoflError
from geofl.protocols.identity import generate_key, private_pem, public_pem

__all__ = [
    "add_arguments",
    "certs_ca",
    "certs_leaf",
    "certs_revoke",
    "keys_new",
    "node_entry",
    "run_credentials",
    "subject_name",
]

_EXIT_OK, _EXIT_USAGE = 0, 2
_CA_FILES = ("ca.pem", "ca.key")
_SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


class CredentialFileError(GeoflError):
    """A file the command would write exists already, or a CA file is missing."""


def _write(path: Path, data: bytes, *, secret: bool, force: bool) -> None:
    """Write ``data``; a secret is created 0600 (never readable by others, even briefly)."""
    if path.exists() and not force:
        raise CredentialFileError(f"{path} exists; pass --force to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    descriptor = os.open(path, flags, 0o600 if secret else 0o644)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)


def node_entry(name: str, region: str | None, public_key_pem: str) -> str:
    """The YAML entry of one authorized node (what ``server.auth.nodes`` reads)."""
    lines = [f"name: {name}"]
    if region:
        lines.append(f"region: {region}")
    lines.append("public_key: |")
    lines += [f"  {line}" for line in public_key_pem.strip().splitlines()]
    return "\n".join(lines) + "\n"


def keys_new(name: str, out: Path, region: str | None, force: bool) -> tuple[Path, Path]:
    """Write ``NAME.key`` and ``NAME.node.yaml`` under ``out``; their paths."""
    for what, value in (("NAME", name), ("--region", region or "x")):
        if not _SAFE_NAME.fullmatch(value):
            raise ValueError(f"{what} {value!r}: use letters, digits, '_', '.' and '-'")
    key = generate_key()
    private, entry = out / f"{name}.key", out / f"{name}.node.yaml"
    _write(private, private_pem(key), secret=True, force=force)
    _write(
        entry,
        node_entry(name, region, public_pem(key.public_key())).encode(),
        secret=False,
        force=force,
    )
    return private, entry


def subject_name(common: str, unit: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    if unit:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit))
    return x509.Name(attributes)


def _builder(subject: x509.Name, issuer: x509.Name, days: int) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
    )


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def certs_ca(out: Path, name: str, days: int, force: bool) -> Path:
    """A new CA (``ca.pem``, ``ca.key``) under ``out``."""
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (
        _builder(subject_name(name), subject_name(name), days)
        .public_key(key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write(out / "ca.pem", _pem(certificate), secret=False, force=force)
    _write(out / "ca.key", _key_pem(key), secret=True, force=force)
    return out / "ca.pem"


def _load_ca(ca_dir: Path) -> tuple[x509.Certificate, CertificateIssuerPrivateKeyTypes]:
    missing = [f for f in _CA_FILES if not (ca_dir / f).is_file()]
    if missing:
        raise CredentialFileError(
            f"{ca_dir} has no {' or '.join(missing)}; make a CA first: "
            f"geofl certs ca --out {ca_dir}"
        )
    certificate = x509.load_pem_x509_certificate((ca_dir / "ca.pem").read_bytes())
    key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CredentialFileError(f"{ca_dir / 'ca.key'} is not the EC key geofl certs ca writes")
    return certificate, key


def _alt_names(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def certs_leaf(
    ca_dir: Path,
    out: Path,
    stem: str,
    subject: x509.Name,
    *,
    hosts: list[str] | None = None,
    days: int,
    force: bool,
) -> tuple[Path, Path]:
    """A certificate signed by the CA in ``ca_dir``: a server's (``hosts``) or a node's."""
    ca, ca_key = _load_ca(ca_dir)
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if hosts else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        _builder(subject, ca.subject, days)
        .public_key(key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if hosts:
        builder = builder.add_extension(_alt_names(hosts), critical=False)
    certificate = builder.sign(ca_key, hashes.SHA256())
    cert_path, key_path = out / f"{stem}.pem", out / f"{stem}.key"
    _write(cert_path, _pem(certificate), secret=False, force=force)
    _write(key_path, _key_pem(key), secret=True, force=force)
    return cert_path, key_path


def _revoked_so_far(crl_path: Path, ca: x509.Certificate) -> list[x509.RevokedCertificate]:
    """The entries of the CRL at ``crl_path`` (none if there is none yet), which ``ca`` signed."""
    if not crl_path.exists():
        return []
    crl = x509.load_pem_x509_crl(crl_path.read_bytes())
    key = ca.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not crl.is_signature_valid(key):
        raise CredentialFileError(
            f"{crl_path} is not a CRL of the CA {ca.subject.rfc4514_string()}"
        )
    return list(crl)


def certs_revoke(ca_dir: Path, certificates: list[Path], crl_path: Path | None, days: int) -> Path:
    """Add ``certificates`` to the CA's CRL (``<ca_dir>/crl.pem`` unless ``crl_path``) and
    sign it again, valid ``days``; with no certificates, only renew it.

    The entries already listed stay. The server (``server.tls.crl``) reads the new list
    within a second and ends the revoked nodes' sessions.
    """
    ca, ca_key = _load_ca(ca_dir)
    path = crl_path if crl_path is not None else ca_dir / "crl.pem"
    entries = _revoked_so_far(path, ca)
    listed = {entry.serial_number for entry in entries}
    now = dt.datetime.now(dt.UTC)
    for cert_path in certificates:
        certificate = x509.load_pem_x509_certificate(cert_path.read_bytes())
        if certificate.issuer != ca.subject:
            raise CredentialFileError(
                f"{cert_path} was issued by {certificate.issuer.rfc4514_string()}, "
                f"not by this CA ({ca.subject.rfc4514_string()})"
            )
        if certificate.serial_number in listed:
            continue
        listed.add(certificate.serial_number)
        entries.append(
            x509.RevokedCertificateBuilder()
            .serial_number(certificate.serial_number)
            .revocation_date(now)
            .build()
        )
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca.subject)
        .last_update(now - dt.timedelta(minutes=5))
        .next_update(now + dt.timedelta(days=days))
    )
    for entry in entries:
        builder = builder.add_revoked_certificate(entry)
    crl = builder.sign(ca_key, hashes.SHA256())
    _write(path, crl.public_bytes(serialization.Encoding.PEM), secret=False, force=True)
    return path


def add_arguments(keys: argparse.ArgumentParser, certs: argparse.ArgumentParser) -> None:
    """``geofl keys new`` and ``geofl certs ca|server|node``."""
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    new = keys_sub.add_parser(
        "new",
        help="a node's Ed25519 key pair",
        description="Write NAME.key (keep it on the node) and NAME.node.yaml (give it to the "
        "server's operator, for server.auth.nodes).",
    )
    new.add_argument("name", metavar="NAME", help="the node's name (letters, digits, _ . -)")
    new.add_argument("--region", help="the region the node is authorized for (optional)")
    certs_sub = certs.add_subparsers(dest="certs_command", required=True, metavar="ACTION")
    ca = certs_sub.add_parser("ca", help="a private CA (ca.pem, ca.key)", description="Make a CA.")
    ca.add_argument("--name", default="geofl CA", help="the CA's common name")
    server = certs_sub.add_parser(
        "server",
        help="the server's certificate (server.pem, server.key)",
        description="A server certificate signed by the CA in --ca.",
    )
    server.add_argument(
        "--host",
        action="append",
        required=True,
        metavar="HOST",
        help="a name or address clients connect to (repeatable), e.g. --host coord.example.org",
    )
    node = certs_sub.add_parser(
        "node",
        help="a node's client certificate (NAME.pem, NAME.key)",
        description="A client certificate whose common name is the node's name.",
    )
    node.add_argument("name", metavar="NAME", help="the node's name")
    node.add_argument("--region", help="the node's region (the certificate's OU)")
    revoke = certs_sub.add_parser(
        "revoke",
        help="revoke node certificates: add them to the CA's CRL (server.tls.crl)",
        description="Add each CERT.pem to the CRL (default <ca>/crl.pem; entries already "
        "there stay) and sign it again. With no CERT, only renew the CRL before its next "
        "update.",
    )
    revoke.add_argument("certificates", nargs="*", type=Path, metavar="CERT.pem")
    revoke.add_argument("--crl", type=Path, metavar="FILE", help="the CRL (default <ca>/crl.pem)")
    revoke.add_argument("--days", type=int, default=30, help="until the next update (default 30)")
    for parser in (server, node, revoke):
        parser.add_argument("--ca", type=Path, required=True, metavar="DIR", help="the CA folder")
    for parser in (new, ca, server, node):
        parser.add_argument("--out", type=Path, default=Path("."), metavar="DIR", help="folder")
        parser.add_argument("--force", action="store_true", help="replace existing files")
    for parser in (ca, server, node):
        parser.add_argument("--days", type=int, default=365, help="validity (default 365)")


def _run(args: argparse.Namespace) -> list[Path]:
    if args.command == "keys":
        return list(keys_new(args.name, args.out, args.region, args.force))
    if args.certs_command == "revoke":
        return [certs_revoke(args.ca, args.certificates, args.crl, args.days)]
    if args.certs_command == "ca":
        return [certs_ca(args.out, args.name, args.days, args.force)]
    if args.certs_command == "server":
        subject = subject_name(args.host[0])
        return list(
            certs_leaf(
                args.ca,
                args.out,
                "server",
                subject,
                hosts=args.host,
                days=args.days,
                force=args.force,
            )
        )
    subject = subject_name(args.name, args.region)
    return list(certs_leaf(args.ca, args.out, args.name, subject, days=args.days, force=args.force))


def run_credentials(args: argparse.Namespace) -> int:
    """Run ``geofl keys`` or ``geofl certs``; the exit code."""
    try:
        written = _run(args)
    except (CredentialFileError, OSError, ValueError) as exc:
        print(f"geofl {args.command}: error: {exc}", file=sys.stderr)
        return _EXIT_USAGE
    for path in written:
        print(f"wrote {path}")
    return _EXIT_OK
