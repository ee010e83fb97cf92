"""Certificate revocation for mutual TLS: ``geofl certs revoke`` and ``server.tls.crl``."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from geofl.server.cli.credentials import (
    CredentialFileError,
    certs_ca,
    certs_leaf,
    certs_revoke,
    subject_name,
)
from geofl.server.cli.main import main
from geofl.server.config import parse_config
from geofl.server.config.errors import ConfigError
from geofl.server.nodes.identity import JoinCheck, NodeIdentity
from geofl.server.nodes.revocation import CertificateId, RevokedCertificates


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    """A CA with node-0 and node-1 certificates, and a stranger CA with one of its own."""
    made = {"ca": certs_ca(tmp_path / "ca", "test CA", 1, force=False)}
    made["other_ca"] = certs_ca(tmp_path / "other", "stranger CA", 1, force=False)
    for name in ("node-0", "node-1"):
        made[name], _ = certs_leaf(
            tmp_path / "ca", tmp_path / "nodes", name, subject_name(name), days=1, force=False
        )
    made["stranger"], _ = certs_leaf(
        tmp_path / "other", tmp_path / "x", "node-0", subject_name("node-0"), days=1, force=False
    )
    return made


def _id(path: Path) -> CertificateId:
    return CertificateId.of(x509.load_pem_x509_certificate(path.read_bytes()))


def _identity(path: Path) -> NodeIdentity:
    return NodeIdentity("node", None, "certificate", _id(path))


def test_a_revoked_certificate_is_listed_and_the_others_are_not(pki: dict[str, Path]) -> None:
    crl = certs_revoke(pki["ca"].parent, [pki["node-0"]], None, days=30)
    assert crl == pki["ca"].parent / "crl.pem"
    revoked = RevokedCertificates(crl, pki["ca"])
    assert len(revoked) == 1
    assert revoked.is_revoked(_id(pki["node-0"]))
    assert not revoked.is_revoked(_id(pki["node-1"]))
    # The stranger's serial is not ours to match: a CRL entry names issuer and serial.
    assert not revoked.is_revoked(CertificateId(_id(pki["stranger"]).issuer, _id(pki["node-0"])[1]))


def test_revoking_again_keeps_the_entries_and_renewing_keeps_them_too(
    pki: dict[str, Path],
) -> None:
    ca_dir = pki["ca"].parent
    certs_revoke(ca_dir, [pki["node-0"]], None, days=30)
    certs_revoke(ca_dir, [pki["node-1"], pki["node-0"]], None, days=30)  # node-0 once only
    certs_revoke(ca_dir, [], None, days=30)  # renewal
    crl = x509.load_pem_x509_crl((ca_dir / "crl.pem").read_bytes())
    assert sorted(e.serial_number for e in crl) == sorted(
        [_id(pki["node-0"]).serial, _id(pki["node-1"]).serial]
    )


def test_revoke_refuses_a_certificate_of_another_ca(pki: dict[str, Path]) -> None:
    with pytest.raises(CredentialFileError, match="issued by CN=stranger CA, not by this CA"):
        certs_revoke(pki["ca"].parent, [pki["stranger"]], None, days=30)


def test_a_crl_not_signed_by_the_client_ca_is_a_config_error(pki: dict[str, Path]) -> None:
    foreign = certs_revoke(pki["other_ca"].parent, [pki["stranger"]], None, days=30)
    with pytest.raises(ConfigError, match=r"not signed by a CA of server\.tls\.client_ca"):
        RevokedCertificates(foreign, pki["ca"])


def test_a_file_that_is_no_crl_is_a_config_error(pki: dict[str, Path], tmp_path: Path) -> None:
    garbage = tmp_path / "crl.pem"
    garbage.write_bytes(b"not a list")
    with pytest.raises(ConfigError, match="not a certificate revocation list"):
        RevokedCertificates(garbage, pki["ca"])


def test_a_der_crl_is_read_too(pki: dict[str, Path], tmp_path: Path) -> None:
    pem = certs_revoke(pki["ca"].parent, [pki["node-1"]], None, days=30)
    der = tmp_path / "crl.der"
    crl = x509.load_pem_x509_crl(pem.read_bytes())
    der.write_bytes(crl.public_bytes(serialization.Encoding.DER))
    assert RevokedCertificates(der, pki["ca"]).is_revoked(_id(pki["node-1"]))


def test_refresh_takes_a_new_list_and_keeps_the_old_one_if_the_new_is_broken(
    pki: dict[str, Path],
) -> None:
    ca_dir = pki["ca"].parent
    path = certs_revoke(ca_dir, [], None, days=30)
    revoked = RevokedCertificates(path, pki["ca"])
    assert len(revoked) == 0 and revoked.refresh() is False  # unchanged
    certs_revoke(ca_dir, [pki["node-0"]], None, days=30)
    assert revoked.refresh(force=True) is True and revoked.is_revoked(_id(pki["node-0"]))
    path.write_bytes(b"half written")
    assert revoked.refresh(force=True) is False
    assert revoked.is_revoked(_id(pki["node-0"])), "a broken list must not un-revoke"


def test_join_check_ends_only_revoked_certificates(pki: dict[str, Path]) -> None:
    path = certs_revoke(pki["ca"].parent, [], None, days=30)
    check = JoinCheck(certificates=True, revoked=RevokedCertificates(path, pki["ca"]))
    assert check.still_valid(_identity(pki["node-0"]))
    certs_revoke(pki["ca"].parent, [pki["node-0"]], None, days=30)
    assert check.refresh(force=True) is True
    assert not check.still_valid(_identity(pki["node-0"]))
    assert check.still_valid(_identity(pki["node-1"]))
    assert check.still_valid(NodeIdentity("keyed", None, "key SHA256:x"))  # no certificate


def test_a_crl_without_a_client_ca_is_a_config_error(pki: dict[str, Path], tmp_path: Path) -> None:
    crl = certs_revoke(pki["ca"].parent, [], None, days=30)
    tls = {"cert": str(pki["node-0"]), "key": str(pki["node-0"].with_suffix(".key"))}
    data = {
        "run": {"name": "x"},
        "model": "m:f",
        "server": {"tls": {**tls, "crl": str(crl)}},
    }
    with pytest.raises(ConfigError, match="set client_ca too"):
        parse_config(data, source="test")


def test_a_crl_past_its_next_update_still_revokes_and_warns(
    pki: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    path = certs_revoke(pki["ca"].parent, [pki["node-0"]], None, days=0)  # due at once
    revoked = RevokedCertificates(path, pki["ca"])
    assert revoked.is_revoked(_id(pki["node-0"]))
    assert "was due for renewal" in caplog.text and "geofl certs revoke" in caplog.text


def test_one_file_may_hold_the_lists_of_several_cas(pki: dict[str, Path], tmp_path: Path) -> None:
    ours = certs_revoke(pki["ca"].parent, [pki["node-0"]], None, days=30)
    theirs = certs_revoke(pki["other_ca"].parent, [pki["stranger"]], None, days=30)
    bundle, both = tmp_path / "cas.pem", tmp_path / "crls.pem"
    bundle.write_bytes(pki["ca"].read_bytes() + pki["other_ca"].read_bytes())
    both.write_bytes(ours.read_bytes() + theirs.read_bytes())
    revoked = RevokedCertificates(both, bundle)
    assert len(revoked) == 2
    assert revoked.is_revoked(_id(pki["node-0"])) and revoked.is_revoked(_id(pki["stranger"]))
    assert not revoked.is_revoked(_id(pki["node-1"]))


def test_geofl_certs_revoke_on_the_command_line(
    pki: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    ca = ["--ca", str(pki["ca"].parent)]
    assert main(["certs", "revoke", *ca, str(pki["node-1"]), "--days", "7"]) == 0
    assert "crl.pem" in capsys.readouterr().out
    revoked = RevokedCertificates(pki["ca"].parent / "crl.pem", pki["ca"])
    assert revoked.is_revoked(_id(pki["node-1"]))
    assert main(["certs", "revoke", *ca, str(pki["stranger"])]) == 2
    assert "not by this CA" in capsys.readouterr().err
