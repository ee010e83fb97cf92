"""TLS with a server certificate: clients that trust the CA train; others cannot connect."""

from __future__ import annotations

import datetime as dt
import ipaddress
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from geofl.client.app import load_client_app
from geofl.client.runtime import ClientOptions, ClientRuntime, GaveUpError

from .conftest import run_config


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost, minted per run."""
    folder = tmp_path_factory.mktemp("pki")
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("geofl test CA"))
        .issuer_name(_name("geofl test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName(
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(san, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {"ca": folder / "ca.pem", "cert": folder / "server.pem", "key": folder / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


def _client(port: int, partition: int, ca: Path | None, reconnect_for: float) -> ClientRuntime:
    options = ClientOptions(
        server=f"localhost:{port}",
        node_name=f"tls-{partition}",
        node_config={"partition-id": partition},
        root_certificates=ca,
        reconnect_for_s=reconnect_for,
    )
    return ClientRuntime(options, load_client_app("geofl_testapp:client_app"))


def test_run_over_tls(tmp_path: Path, serve: Any, pki: dict[str, Path]) -> None:
    config = run_config(
        tmp_path,
        evaluation={"every": 0},
        strategy={"clients_per_round": 2, "min_clients": 2},
        server={"tls": {"cert": str(pki["cert"]), "key": str(pki["key"])}},
    )
    server = serve(config)
    plain = _client(server.port, 9, None, reconnect_for=1.0)
    with pytest.raises(GaveUpError):
        plain.run()  # no TLS: the handshake fails, the client gives up
    runtimes = [_client(server.port, i, pki["ca"], 10.0) for i in range(2)]
    threads = [threading.Thread(target=r.run, daemon=True) for r in runtimes]
    for thread in threads:
        thread.start()
    assert server.result.result(timeout=60).status == "completed"
    for thread in threads:
        thread.join(15)
    assert all(r.tasks_done == 2 for r in runtimes)
