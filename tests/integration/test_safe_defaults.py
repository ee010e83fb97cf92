"""Safe defaults of ``geofl server``: an exclusive port, no exposure without TLS and
authentication, and no secret in any line a real run logs or prints."""

from __future__ import annotations

import logging
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import make_url

from geofl.client.app import load_client_app
from geofl.client.runtime import ClientOptions, ClientRuntime
from geofl.server.cli.credentials import certs_ca, certs_leaf, keys_new
from geofl.server.cli.exit_codes import ExitCode
from geofl.server.config import ConfigError, ServerConfig
from geofl.server.coordinator import check_exposure

from .conftest import run_config
from .processes import run_geofl, start_geofl, write_config

pytestmark = pytest.mark.timeout(180)


def test_a_second_server_on_the_same_port_exits_4(tmp_path: Path, serve: Any) -> None:
    first = serve(run_config(tmp_path, schedule={"wait_for_clients_s": 60}))
    second = tmp_path / "second"
    second.mkdir()
    config = write_config(second)
    address = f"server.address=127.0.0.1:{first.port}"
    result = run_geofl(second, "server", "-c", str(config), "--set", address)
    assert result.returncode == ExitCode.ADDRESS_IN_USE == 4, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("geofl:")]
    assert f"127.0.0.1:{first.port}" in line and "already in use" in line


def test_listening_beyond_loopback_without_tls_and_auth_refuses_to_start(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, server={"address": "0.0.0.0:0"})
    result = run_geofl(tmp_path, "server", "-c", str(config))
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert "listens beyond loopback without TLS (server.tls) and node authentication" in (
        result.stderr
    )
    assert "server.insecure: true" in result.stderr


def _server(tmp_path: Path, **values: Any) -> ServerConfig:
    return ServerConfig.model_validate(values)


def test_exposure_needs_tls_and_authentication_or_insecure(tmp_path: Path) -> None:
    certs_ca(tmp_path, "ca", 1, force=False)
    cert, key = certs_leaf(
        tmp_path, tmp_path, "server", _name("h"), hosts=["h"], days=1, force=False
    )
    keys_new("n", tmp_path / "keys", None, force=False)
    tls = {"cert": cert, "key": key}
    auth = {"nodes": tmp_path / "keys"}
    for ok in (
        {"address": "127.0.0.1:1"},
        {"address": "[::1]:1"},
        {"address": "localhost:1"},
        {"address": "0.0.0.0:1", "insecure": True},
        {"address": "0.0.0.0:1", "tls": tls, "auth": auth},
        {"address": "0.0.0.0:1", "tls": {**tls, "client_ca": tmp_path / "ca.pem"}},
    ):
        check_exposure(_server(tmp_path, **ok))
    for bad, missing in (
        ({"address": "0.0.0.0:1", "tls": tls}, "without node authentication"),
        ({"address": "coord.example.org:1", "auth": auth}, "without TLS (server.tls):"),
    ):
        with pytest.raises(ConfigError, match=missing.replace("(", r"\(").replace(")", r"\)")):
            check_exposure(_server(tmp_path, **bad))


def _name(common: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


@pytest.mark.postgres
def test_no_secret_in_any_log_line_of_a_real_run(
    tmp_path: Path, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A keyed run on a password-bearing database URL, every logger at DEBUG, the server's
    own output too: no password, session token or private key shows anywhere."""
    url = make_url(postgres_url)  # an SQLite URL carries no password
    password = "pw-s3cr3t-9f2c"  # the fixture's server trusts local connections: any password
    secret_url = url.set(password=password).render_as_string(hide_password=False)
    private, _ = keys_new("node-0", tmp_path / "keys", None, force=False)
    keys_new("node-1", tmp_path / "keys", None, force=False)
    config = write_config(
        tmp_path,
        run={"name": "secrets", "rounds": 1, "seed": 1},
        evaluation={"every": 0},
        storage={"url": secret_url, "checkpoints": "ckpt"},
        server={"address": "127.0.0.1:0", "heartbeat_interval_s": 0.5, "auth": {"nodes": "keys"}},
    )
    server = start_geofl(tmp_path, "server", "-vv", "-c", str(config))
    assert server.stdout is not None
    port, before = _listening_port(server)
    caplog.set_level(logging.DEBUG)
    runtimes = [
        ClientRuntime(
            ClientOptions(
                server=f"127.0.0.1:{port}",
                node_name=f"node-{i}",
                node_key=tmp_path / "keys" / f"node-{i}.key",
                node_config={"partition-id": i},
                reconnect_for_s=20,
            ),
            load_client_app("geofl_testapp:client_app"),
        )
        for i in range(2)
    ]
    threads = [threading.Thread(target=r.run, daemon=True) for r in runtimes]
    for thread in threads:
        thread.start()
    output, _ = server.communicate(timeout=120)
    for thread in threads:
        thread.join(15)
    assert server.returncode == 0, output
    tokens = [r.session.token for r in runtimes if r.session is not None]
    assert len(tokens) == 2
    key_lines = [line for line in private.read_text().splitlines() if "PRIVATE" not in line]
    logged = before + output + "\n".join(record.getMessage() for record in caplog.records)
    assert "joined as" in output  # the server did log at -vv
    assert ":***@" in output  # and printed the database URL, redacted
    for secret in [password, *tokens, *key_lines]:
        assert secret not in logged


def _listening_port(process: subprocess.Popen[str]) -> tuple[int, str]:
    """The port ``geofl server`` prints once it listens, and its output up to there."""
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if "listening on port" in line:
            port = int(line.rsplit("port", 1)[1].split()[0].strip(","))
            return port, "".join(seen)
    raise AssertionError("the server never said where it listens: " + "".join(seen))
