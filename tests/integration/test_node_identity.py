"""Node identity over real gRPC on loopback: keys, mutual TLS, authorization, replays.

Every server here is a real coordinator on 127.0.0.1 port 0; clients are the real runtime,
the real ``geofl client`` command line, or raw gRPC stubs where a test plays an attacker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import select

from geofl.client import cli as client_cli
from geofl.client.app import load_client_app
from geofl.client.connection import Connection
from geofl.client.runtime import ClientOptions, ClientRuntime
from geofl.protocols.errors import (
    ErrorCode,
    ForbiddenError,
    IdentityRefusedError,
    SessionError,
    TaskError,
)
from geofl.protocols.identity import join_message, load_private_key, raw_public_key
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.protocols.v1 import geofl_pb2_grpc as pb_grpc
from geofl.server.cli.credentials import certs_ca, certs_leaf, certs_revoke, keys_new
from geofl.server.config import RunConfig
from geofl.server.relay import Relay, RelayConfig
from geofl.storage import open_database
from geofl.storage.models import Event, Node

from .conftest import run_config
from .processes import start_geofl, write_config

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    """Keys of node-0 and node-1 (authorized, in ``authorized/``) and of an intruder."""
    made: dict[str, Path] = {}
    for name in ("node-0", "node-1", "intruder"):
        private, _ = keys_new(name, tmp_path / "keys", None, force=False)
        made[name] = private
    authorized = tmp_path / "authorized"
    authorized.mkdir()
    for name in ("node-0", "node-1"):
        entry = tmp_path / "keys" / f"{name}.node.yaml"
        (authorized / entry.name).write_text(entry.read_text())
    made["authorized"] = authorized
    return made


def _keyed_config(tmp_path: Path, keys: dict[str, Path], **sections: Any) -> RunConfig:
    server = {"auth": {"nodes": str(keys["authorized"])}, **sections.pop("server", {})}
    return run_config(
        tmp_path,
        run={"rounds": 1},
        evaluation={"every": 0},
        strategy={"clients_per_round": 2, "min_clients": 2},
        server=server,
        **sections,
    )


def _events(config: RunConfig, prefix: str) -> list[Event]:
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        rows = list(session.scalars(select(Event).where(Event.kind.startswith(prefix))))
        session.expunge_all()
    return rows


def _client_cli(
    port: int, *extra: str, capsys: pytest.CaptureFixture[str], host: str = "127.0.0.1"
) -> tuple[int, str]:
    """``geofl client`` in this process: its exit code and what it printed."""
    argv = ["--server", f"{host}:{port}", "--app", "geofl_testapp:client_app"]
    code = client_cli.main([*argv, "--reconnect-for", "60", *extra])
    return code, capsys.readouterr().err


def test_keyed_nodes_train_and_unknown_key_exits_with_its_code(
    tmp_path: Path, serve: Any, keys: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config = _keyed_config(tmp_path, keys)
    server = serve(config)
    # A client that retried would give up after --reconnect-for 60 with exit code 6.
    code, err = _client_cli(server.port, "--node-key", str(keys["intruder"]), capsys=capsys)
    assert code == client_cli.EXIT_IDENTITY == 8
    assert "GEOFL-E113" not in err and "not authorized (unknown or revoked)" in err
    assert "hint:" in err and "server.auth.nodes" in err
    code, err = _client_cli(server.port, capsys=capsys)  # no key at all
    assert code == 8 and "--node-key" in err
    refused = _events(config, "security.identity")
    assert len(refused) == 2 and {e.data["rpc"] for e in refused} == {"Join"}


def test_keyed_clients_train(tmp_path: Path, serve: Any, keys: dict[str, Path]) -> None:
    config = _keyed_config(tmp_path, keys)
    server = serve(config)
    runtimes = [
        ClientRuntime(
            ClientOptions(
                server=f"127.0.0.1:{server.port}",
                node_name=name,
                node_key=keys[name],
                node_config={"partition-id": i},
                reconnect_for_s=10,
            ),
            load_client_app("geofl_testapp:client_app"),
        )
        for i, name in enumerate(("node-0", "node-1"))
    ]
    threads = [threading.Thread(target=r.run, daemon=True) for r in runtimes]
    for thread in threads:
        thread.start()
    assert server.result.result(timeout=60).status == "completed"
    for thread in threads:
        thread.join(15)
    assert all(r.tasks_done == 1 for r in runtimes)
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        names = sorted(n.name for n in session.scalars(select(Node)))
    assert names == ["node-0", "node-1"]


def _wait_for(condition: Any, what: str, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_revoking_a_key_ends_the_session_and_refuses_the_next_join(
    tmp_path: Path, serve: Any, keys: dict[str, Path]
) -> None:
    config = _keyed_config(tmp_path, keys, schedule={"wait_for_clients_s": 60})
    server = serve(config)
    conn = Connection(f"127.0.0.1:{server.port}", node_key=keys["node-0"])
    session = conn.join("node-0", None, {}, timeout=5)
    assert session.node_name == "node-0"
    conn.heartbeat(timeout=5)
    (keys["authorized"] / "node-0.node.yaml").unlink()  # revoked: the watcher sees it

    def ended() -> bool:
        try:
            conn.heartbeat(timeout=5)
        except SessionError:
            return True
        return False

    _wait_for(ended, "the revoked node's session did not end")
    with pytest.raises(IdentityRefusedError, match="unknown or revoked"):
        conn.join("node-0", None, {}, timeout=5)
    conn.close()
    assert [e.data["node"] for e in _events(config, "security.identity")] == ["node-0"]


def _signed_join(channel: grpc.Channel, key_path: Path, name: str) -> pb.JoinRequest:
    """A JoinRequest carrying a proof over a challenge asked on ``channel``."""
    stub = pb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call]
    challenge: pb.ChallengeReply = stub.Challenge(pb.ChallengeRequest(), timeout=5)
    key = load_private_key(key_path)
    message = join_message(
        challenge.run_id, challenge.run_name, challenge.nonce, challenge.channel, name
    )
    request = pb.JoinRequest(protocol_versions=[1], node_name=name)
    request.proof.public_key = raw_public_key(key.public_key())
    request.proof.nonce = challenge.nonce
    request.proof.signature = key.sign(message)
    return request


def _own_channel(port: int) -> grpc.Channel:
    return grpc.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
    )


def test_a_signature_is_refused_on_another_connection_and_when_reused(
    tmp_path: Path, serve: Any, keys: dict[str, Path]
) -> None:
    config = _keyed_config(tmp_path, keys, schedule={"wait_for_clients_s": 60})
    server = serve(config)
    victim, attacker = _own_channel(server.port), _own_channel(server.port)
    captured = _signed_join(victim, keys["node-0"], "node-0")
    attacker_stub = pb_grpc.CoordinatorStub(attacker)  # type: ignore[no-untyped-call]
    with pytest.raises(grpc.RpcError) as replayed:
        attacker_stub.Join(captured, timeout=5)
    assert replayed.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "GEOFL-E113" in replayed.value.details()
    # The replay consumed nothing the victim can use again either: a nonce is single-use.
    victim_stub = pb_grpc.CoordinatorStub(victim)  # type: ignore[no-untyped-call]
    fresh = _signed_join(victim, keys["node-0"], "node-0")
    reply = victim_stub.Join(fresh, timeout=5)
    assert reply.node_name == "node-0"
    with pytest.raises(grpc.RpcError, match="already used"):
        victim_stub.Join(fresh, timeout=5)
    # Claiming another node's name with one's own valid key is refused too.
    claim = _signed_join(attacker, keys["node-1"], "node-0")
    with pytest.raises(grpc.RpcError, match="node-1"):
        attacker_stub.Join(claim, timeout=5)
    # The victim's session token does not work from the attacker's connection.
    with pytest.raises(grpc.RpcError) as stolen:
        attacker_stub.Heartbeat(
            pb.HeartbeatRequest(), metadata=(("geofl-session", reply.session_token),), timeout=5
        )
    assert "GEOFL-E101" in stolen.value.details()
    victim_stub.Heartbeat(
        pb.HeartbeatRequest(), metadata=(("geofl-session", reply.session_token),), timeout=5
    )
    kinds = [(e.kind, e.data["rpc"]) for e in _events(config, "security.")]
    assert ("security.identity", "Join") in kinds and ("security.forbidden", "Heartbeat") in kinds
    assert len(kinds) == 4, kinds
    victim.close()
    attacker.close()


def test_a_node_may_use_only_its_own_task_and_version(tmp_path: Path, serve: Any) -> None:
    config = run_config(
        tmp_path,
        run={"rounds": 1},
        evaluation={"every": 0},
        strategy={"clients_per_round": 2, "min_clients": 2},
    )
    server = serve(config)
    a, b = (Connection(f"127.0.0.1:{server.port}") for _ in range(2))
    a.join("a", None, {}, timeout=5)
    b.join("b", None, {}, timeout=5)
    task_a, task_b = a.get_task(10.0), b.get_task(10.0)
    assert task_a.kind == task_b.kind == pb.TASK_KIND_FIT
    other_version = pb.Task()
    other_version.CopyFrom(task_a)
    other_version.model_version = task_a.model_version + 1
    with pytest.raises(ForbiddenError, match="was not given to this node"):
        a.download(other_version, timeout=5)
    a.download(task_a, timeout=5)  # its own version downloads
    failure = pb.UploadHeader(
        task_id=task_b.task_id,
        attempt=1,
        status=pb.RESULT_STATUS_CLIENT_ERROR,
        update_kind=pb.UPDATE_KIND_NONE,
        error="x",
    )
    with pytest.raises(ForbiddenError, match="another node"):
        a.submit(failure, None, 1 << 16, 5)  # b's task
    failure.task_id = task_a.task_id
    a.submit(failure, None, 1 << 16, 5)  # its own: accepted (as a failure)
    with pytest.raises(TaskError) as again:
        a.submit(failure, None, 1 << 16, 5)
    assert again.value.code is ErrorCode.DUPLICATE_RESULT
    kinds = sorted(e.kind for e in _events(config, "security."))
    assert kinds == ["security.forbidden", "security.forbidden", "security.replay"]
    a.close()
    b.close()


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    """A CA with a server certificate and node-0/node-1 certificates, and a stranger's CA
    with its own node certificate, all made by ``geofl certs``' functions."""
    ca, other = tmp_path / "ca", tmp_path / "other-ca"
    certs_ca(ca, "geofl test CA", 1, force=False)
    certs_ca(other, "stranger CA", 1, force=False)
    made = {"ca": ca / "ca.pem", "other_ca": other / "ca.pem"}
    made["cert"], made["key"] = certs_leaf(
        ca,
        tmp_path,
        "server",
        _x509_name("localhost"),
        hosts=["localhost", "127.0.0.1"],
        days=1,
        force=False,
    )
    for name, region in (("node-0", "eu"), ("node-1", "eu")):
        made[f"{name}.pem"], made[f"{name}.key"] = certs_leaf(
            ca, tmp_path / "nodes", name, _x509_name(name, region), days=1, force=False
        )
    made["stranger.pem"], made["stranger.key"] = certs_leaf(
        other, tmp_path / "strangers", "node-0", _x509_name("node-0"), days=1, force=False
    )
    return made


def _x509_name(common: str, unit: str | None = None) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    if unit:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit))
    return x509.Name(attributes)


def test_mutual_tls_names_nodes_after_their_certificates(
    tmp_path: Path, serve: Any, pki: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    tls = {"cert": str(pki["cert"]), "key": str(pki["key"]), "client_ca": str(pki["ca"])}
    config = run_config(
        tmp_path,
        run={"rounds": 1},
        evaluation={"every": 0},
        strategy={"clients_per_round": 2, "min_clients": 2},
        server={"tls": tls},
    )
    server = serve(config)
    trust = ("--root-certificates", str(pki["ca"]))
    # A certificate from another CA: the server's TLS refuses it; the client stops at once.
    stranger = ("--tls-cert", str(pki["stranger.pem"]), "--tls-key", str(pki["stranger.key"]))
    code, err = _client_cli(server.port, *trust, *stranger, capsys=capsys, host="localhost")
    assert code == client_cli.EXIT_TLS == 9 and "client certificate" in err and "hint:" in err
    # A client that does not trust the server's CA stops at once too.
    mine = ("--tls-cert", str(pki["node-0.pem"]), "--tls-key", str(pki["node-0.key"]))
    wrong_root = ("--root-certificates", str(pki["other_ca"]))
    code, err = _client_cli(server.port, *wrong_root, *mine, capsys=capsys, host="localhost")
    assert code == 9 and "CERTIFICATE_VERIFY_FAILED" in err
    missing = ("--tls-cert", str(tmp_path / "nope.pem"), "--tls-key", str(pki["node-0.key"]))
    code, err = _client_cli(server.port, *trust, *missing, capsys=capsys, host="localhost")
    assert code == client_cli.EXIT_CREDENTIALS == 10 and "nope.pem" in err
    runtimes = [
        ClientRuntime(
            ClientOptions(
                server=f"localhost:{server.port}",
                node_name="",  # named by the certificate
                root_certificates=pki["ca"],
                tls_cert=pki[f"node-{i}.pem"],
                tls_key=pki[f"node-{i}.key"],
                node_config={"partition-id": i},
                reconnect_for_s=10,
            ),
            load_client_app("geofl_testapp:client_app"),
        )
        for i in range(2)
    ]
    threads = [threading.Thread(target=r.run, daemon=True) for r in runtimes]
    for thread in threads:
        thread.start()
    assert server.result.result(timeout=60).status == "completed"
    for thread in threads:
        thread.join(15)
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        nodes = sorted((n.name, n.region) for n in session.scalars(select(Node)))
    assert nodes == [("node-0", "eu"), ("node-1", "eu")]


def test_a_revoked_certificate_loses_its_session_and_cannot_join(
    tmp_path: Path, serve: Any, pki: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    ca_dir = pki["ca"].parent
    crl = certs_revoke(ca_dir, [], None, days=1)  # a CRL that revokes nobody yet
    tls = {"cert": str(pki["cert"]), "key": str(pki["key"]), "client_ca": str(pki["ca"])}
    config = run_config(
        tmp_path,
        run={"rounds": 1},
        evaluation={"every": 0},
        strategy={"clients_per_round": 2, "min_clients": 2},
        schedule={"wait_for_clients_s": 60},
        server={"tls": {**tls, "crl": str(crl)}},
    )
    server = serve(config)
    address = f"localhost:{server.port}"
    conn = Connection(address, pki["ca"], client_certificate=(pki["node-0.pem"], pki["node-0.key"]))
    assert conn.join("", None, {}, timeout=5).node_name == "node-0"
    conn.heartbeat(timeout=5)
    certs_revoke(ca_dir, [pki["node-0.pem"]], None, days=1)  # the watcher re-reads it

    def ended() -> bool:
        try:
            conn.heartbeat(timeout=5)
        except SessionError:
            return True
        return False

    _wait_for(ended, "the revoked certificate's session did not end")
    with pytest.raises(IdentityRefusedError, match=r"revoked \(server\.tls\.crl\)"):
        conn.join("", None, {}, timeout=5)
    conn.close()
    # The command line stops at once with the identity exit code, not after retrying.
    trust = ("--root-certificates", str(pki["ca"]))
    mine = ("--tls-cert", str(pki["node-0.pem"]), "--tls-key", str(pki["node-0.key"]))
    code, err = _client_cli(server.port, *trust, *mine, capsys=capsys, host="localhost")
    assert code == client_cli.EXIT_IDENTITY == 8 and "revoked" in err and "hint:" in err
    # node-1's certificate is not revoked: it joins.
    other = Connection(
        address, pki["ca"], client_certificate=(pki["node-1.pem"], pki["node-1.key"])
    )
    assert other.join("", None, {}, timeout=5).node_name == "node-1"
    other.close()
    refused = _events(config, "security.identity")
    reasons = [str(e.data["reason"]) for e in refused]
    assert len(reasons) == 2 and all("'node-0'" in r and "revoked" in r for r in reasons)


def test_a_relay_authenticates_upstream_and_downstream(
    tmp_path: Path, serve: Any, keys: dict[str, Path]
) -> None:
    relay_key, relay_entry = keys_new("relay-a", tmp_path / "relay-keys", "a", force=False)
    upstream_nodes = tmp_path / "coordinator-nodes"
    upstream_nodes.mkdir()
    (upstream_nodes / relay_entry.name).write_text(relay_entry.read_text())
    config = run_config(
        tmp_path,
        run={"rounds": 1},
        evaluation={"every": 0},
        strategy={"clients_per_round": 1, "min_clients": 1},
        server={"auth": {"nodes": str(upstream_nodes)}},
    )
    server = serve(config)
    relay = Relay(
        RelayConfig.model_validate(
            {
                "relay": {"region": "a"},
                "upstream": {
                    "address": f"127.0.0.1:{server.port}",
                    "reconnect_for_s": 10,
                    "node_key": str(relay_key),
                },
                "server": {
                    "address": "127.0.0.1:0",
                    "heartbeat_interval_s": 0.5,
                    "auth": {"nodes": str(keys["authorized"])},  # node-0 and node-1
                },
                "schedule": {"deadline_s": 20, "wait_for_clients_s": 5},
            }
        )
    )
    port = relay.start()
    intruder = Connection(f"127.0.0.1:{port}", node_key=keys["intruder"])
    with pytest.raises(IdentityRefusedError, match="not authorized"):
        intruder.join("intruder", None, {}, timeout=5)
    intruder.close()
    local = ClientRuntime(
        ClientOptions(
            server=f"127.0.0.1:{port}",
            node_name="node-0",
            node_key=keys["node-0"],
            node_config={"partition-id": 0},
            reconnect_for_s=10,
        ),
        load_client_app("geofl_testapp:client_app"),
    )
    threads = [threading.Thread(target=local.run, daemon=True)]
    threads[0].start()
    _wait_for(lambda: relay.local_clients() == 1, "the relay's client did not join")
    threads.append(threading.Thread(target=relay.run, daemon=True))
    threads[1].start()
    assert server.result.result(timeout=60).status == "completed"
    for thread in threads:
        thread.join(20)
    assert local.tasks_done == 1
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        assert [(n.name, n.region) for n in session.scalars(select(Node))] == [("relay-a", "a")]


def test_sighup_rereads_the_authorized_nodes(tmp_path: Path, keys: dict[str, Path]) -> None:
    """An edit the change check cannot see (same size, same mtime) takes effect on SIGHUP."""
    authorized = keys["authorized"]
    (authorized / "node-1.node.yaml").unlink()
    config = write_config(
        tmp_path, schedule={"wait_for_clients_s": 60}, server={"auth": {"nodes": str(authorized)}}
    )
    server = start_geofl(tmp_path, "server", "-c", str(config))
    try:
        port = _port_of(server)
        conn = Connection(f"127.0.0.1:{port}", node_key=keys["node-1"])
        with pytest.raises(IdentityRefusedError):
            conn.join("node-1", None, {}, timeout=5)
        entry = authorized / "node-0.node.yaml"
        before = entry.stat()
        replacement = (tmp_path / "keys" / "node-1.node.yaml").read_text()
        assert len(replacement) == before.st_size
        entry.write_text(replacement)
        os.utime(entry, ns=(before.st_atime_ns, before.st_mtime_ns))
        server.send_signal(signal.SIGHUP)

        def joined() -> bool:
            try:
                conn.join("node-1", None, {}, timeout=5)
            except IdentityRefusedError:
                return False
            return True

        _wait_for(joined, "node-1 could not join after SIGHUP")
        conn.close()
    finally:
        server.terminate()
        try:
            output, _ = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            output, _ = server.communicate(timeout=30)
            raise AssertionError(f"the server did not stop on SIGTERM:\n{output}") from None
    assert server.returncode == 130, output


def _port_of(process: subprocess.Popen[str]) -> int:
    assert process.stdout is not None
    for line in process.stdout:
        if "listening on port" in line:
            return int(line.rsplit("port", 1)[1].split()[0].strip(","))
    raise AssertionError("the server never said where it listens")
