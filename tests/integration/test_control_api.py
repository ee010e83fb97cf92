"""``geofl runs list|show|stop|logs|pull|dashboard --server``: each command against a live
coordinator's control API over real gRPC on loopback, logged in with an admin key."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import safetensors.numpy
import torch

from geofl.protocols.identity import load_private_key, raw_public_key
from geofl.protocols.v1 import control_pb2 as cpb
from geofl.protocols.v1 import control_pb2_grpc as cpb_grpc
from geofl.server.cli.credentials import certs_ca, certs_leaf, keys_new, subject_name
from geofl.server.cli.exit_codes import ExitCode
from geofl.server.cli.main import main
from geofl.server.config import RunConfig
from geofl.server.config.errors import ConfigError
from geofl.server.control.admins import AdminKeys, AdminSessions, login_message
from geofl.server.control.client import ControlClient
from geofl.server.control.service import ControlParts, ControlServicer, start_control_server
from geofl.server.coordinator import Coordinator
from geofl.storage import CheckpointRecord, CheckpointStore, open_database, queries

from .conftest import ServerHandle, run_config
from .processes import free_port


@dataclass
class Live:
    """A live run with its control API, and an admin's key."""

    config: RunConfig
    handle: ServerHandle
    address: str
    key: Path
    stranger: Path

    @property
    def run_id(self) -> int:
        return self.handle.coordinator.run_id

    def args(self, action: str, *extra: str) -> list[str]:
        return ["runs", action, *extra, "--server", self.address, "--key", str(self.key)]


def _admin_config(tmp_path: Path, rounds: int = 200) -> tuple[RunConfig, Path, Path]:
    ops, _ = keys_new("ops", tmp_path / "keys", None, force=False)
    stranger, _ = keys_new("stranger", tmp_path / "keys", None, force=False)
    admins = tmp_path / "admins.yaml"
    admins.write_text((tmp_path / "keys" / "ops.node.yaml").read_text())
    control = {"address": "127.0.0.1:0", "admins": str(admins)}
    config = run_config(
        tmp_path,
        run={"rounds": rounds},
        evaluation={"every": 0},
        strategy={"clients_per_round": 2, "min_clients": 2},
        server={"address": "127.0.0.1:0", "heartbeat_interval_s": 0.5, "control": control},
    )
    return config, ops, stranger


def _wait_for_commit(config: RunConfig, run_id: int, rounds: int = 1) -> None:
    deadline = time.monotonic() + 60
    while True:
        with open_database(config.storage.url, migrate=False) as db, db.session() as session:
            if queries.get_run(session, run_id).last_committed_round >= rounds:
                return
        assert time.monotonic() < deadline, "no round committed"
        time.sleep(0.05)


@pytest.fixture
def live(tmp_path: Path, serve_coordinator: Any) -> Iterator[Live]:
    config, key, stranger = _admin_config(tmp_path)
    handle = serve_coordinator(lambda: Coordinator(config))
    for i in range(2):
        handle.add_client(i, behaviour="slow", delay_s=0.1)
    _wait_for_commit(config, handle.coordinator.run_id, rounds=2)
    address = f"127.0.0.1:{handle.coordinator.control_port}"
    yield Live(config, handle, address, key, stranger)
    if not handle.result.done():  # end the run cleanly: the clients are told
        with ControlClient(address, key) as client:
            client.stop_run(handle.coordinator.run_id)
        handle.wait()


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_list_and_show_a_live_run(live: Live, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run([*live.args("list"), "--json"], capsys)
    assert code == ExitCode.OK
    (run,) = json.loads(out)
    assert (run["id"], run["status"]) == (live.run_id, "running")
    assert run["last_committed_round"] >= 2

    code, out, _ = _run([*live.args("show", str(live.run_id)), "--json"], capsys)
    assert code == ExitCode.OK
    shown = json.loads(out)
    assert shown["run"]["name"] == "itest"
    assert [r["status"] for r in shown["rounds"][:2]] == ["committed", "committed"]
    assert {p["node_name"] for p in shown["participations"]} == {"node-0", "node-1"}
    assert shown["events"][0]["kind"] == "run.started"

    code, out, _ = _run(live.args("show", str(live.run_id)), capsys)  # the tables
    assert code == ExitCode.OK
    assert "participations" in out and "events" in out and "run.started" in out


def test_logs_follow_streams_until_stop_cancels_the_run(
    live: Live, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(live.args("logs", str(live.run_id)), capsys)
    assert code == ExitCode.OK
    assert "run.started" in out.splitlines()[0] and "round.committed round 1" in out

    followed: list[str] = []
    client = ControlClient(live.address, live.key)
    follower = threading.Thread(
        target=lambda: followed.extend(e.kind for e in client.events(live.run_id, follow=True)),
        daemon=True,
    )
    follower.start()
    code, out, _ = _run([*live.args("stop", str(live.run_id)), "--reason", "done"], capsys)
    assert code == ExitCode.OK
    assert f"run {live.run_id}: stop requested" in out
    result = live.handle.wait()  # the round ended, the clients were told and exited
    assert (result.status, result.error) == ("cancelled", "done (admin ops)")
    follower.join(timeout=30)
    assert not follower.is_alive(), "logs --follow did not end with the run"
    client.close()
    assert followed[0] == "run.started"
    assert followed[-1] == "run.cancelled"
    assert "run.stop_requested" in followed
    assert followed.count("round.committed") >= 2

    # The control API ends with its coordinator; the database keeps the whole log.
    code, _, err = _run(live.args("logs", str(live.run_id)), capsys)
    assert code == ExitCode.SERVER_UNREACHABLE and "unreachable" in err
    offline = ["runs", "logs", str(live.run_id), "--db", live.config.storage.url]
    code, out, _ = _run([*offline, "--follow", "--json"], capsys)
    assert code == ExitCode.OK  # the run is over: --follow prints it all and ends
    assert [json.loads(line)["kind"] for line in out.splitlines()] == followed


def test_pull_writes_safetensors_and_a_state_dict(
    live: Live, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stem = tmp_path / "out" / "model"
    code, out, _ = _run(
        [*live.args("pull", str(live.run_id)), "--round", "1", "--out", str(stem)], capsys
    )
    assert code == ExitCode.OK, out
    assert f"run {live.run_id} round 1: wrote" in out
    with open_database(live.config.storage.url, migrate=False) as db, db.session() as session:
        row = next(r for r in queries.checkpoints_of(session, live.run_id) if r.round == 1)
        record = CheckpointRecord.from_row(row)
    expected, _ = CheckpointStore(Path(live.config.storage.checkpoints)).load(record)
    pulled = safetensors.numpy.load_file(stem.with_suffix(".safetensors"))
    assert sorted(pulled) == sorted(expected)  # the model only: no __state__/ tensors
    for name, array in expected.items():
        np.testing.assert_array_equal(pulled[name], array)
    state_dict = torch.load(stem.with_suffix(".pt"), weights_only=True)
    assert list(state_dict) == list(expected)  # the model's own order
    for name, array in expected.items():
        np.testing.assert_array_equal(state_dict[name].numpy(), array)

    code, _, err = _run([*live.args("pull", str(live.run_id)), "--round", "999"], capsys)
    assert code == ExitCode.USAGE
    assert "no checkpoint of round 999; rounds with one: 1, 2" in err


def test_refusals_name_what_was_wrong(live: Live, capsys: pytest.CaptureFixture[str]) -> None:
    stranger = ["runs", "list", "--server", live.address, "--key", str(live.stranger)]
    code, _, err = _run(stranger, capsys)
    assert code == ExitCode.IDENTITY_REFUSED
    assert "admin login refused" in err and "is not an admin's" in err
    with open_database(live.config.storage.url, migrate=False) as db, db.session() as session:
        refused = queries.events_of(session, live.run_id, prefixes=("security.",))
    assert [e.kind for e in refused] == ["security.admin_refused"]

    code, _, err = _run(["runs", "list", "--server", live.address], capsys)
    assert (code, "--server needs --key" in err) == (ExitCode.USAGE, True)

    code, _, err = _run(live.args("stop", str(live.run_id + 1)), capsys)
    assert code == ExitCode.USAGE and f"run {live.run_id + 1}" in err

    code, _, err = _run(live.args("dashboard"), capsys)
    assert code == ExitCode.USAGE and "serves no dashboard" in err

    code, _, err = _run(live.args("show", "999"), capsys)
    assert code == ExitCode.USAGE and "999" in err


def test_a_token_is_required_on_every_call(live: Live) -> None:
    with grpc.insecure_channel(live.address) as channel:
        stub = cpb_grpc.ControlStub(channel)  # type: ignore[no-untyped-call]
        for metadata in ((), (("authorization", "Bearer forged"),), (("authorization", "x"),)):
            with pytest.raises(grpc.RpcError) as refused:
                stub.ListRuns(cpb.ListRunsRequest(), metadata=metadata, timeout=10)
            assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        # A signature made for another connection's nonce is refused too.
        challenge = stub.Challenge(cpb.AdminChallengeRequest(), timeout=10)
        key = load_private_key(live.key)
        forged = key.sign(login_message(challenge.nonce, "ipv4:10.0.0.1:1"))
        login = cpb.AdminLoginRequest(
            public_key=raw_public_key(key.public_key()),
            nonce=challenge.nonce,
            signature=forged,
        )
        with pytest.raises(grpc.RpcError) as refused:
            stub.Login(login, timeout=10)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED


def test_unreachable_server_and_bad_key_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key, _ = keys_new("ops", tmp_path, None, force=False)
    address = f"127.0.0.1:{free_port()}"
    code, _, err = _run(["runs", "list", "--server", address, "--key", str(key)], capsys)
    assert code == ExitCode.SERVER_UNREACHABLE and "unreachable" in err
    bad = tmp_path / "bad.key"
    bad.write_text("not a key")
    code, _, err = _run(["runs", "list", "--server", address, "--key", str(bad)], capsys)
    assert code == ExitCode.CREDENTIALS and "bad.key" in err


def test_offline_logs_and_pull_read_the_database(
    tmp_path: Path, serve_coordinator: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config, _, _ = _admin_config(tmp_path, rounds=2)
    handle = serve_coordinator(lambda: Coordinator(config))
    for i in range(2):
        handle.add_client(i)
    result = handle.wait()
    db = ["--db", config.storage.url]
    code, out, _ = _run(["runs", "logs", str(result.run_id), *db, "--follow"], capsys)
    assert code == ExitCode.OK
    kinds = [line.split()[1].rstrip(":") for line in out.splitlines()]
    assert kinds == ["run.started", "round.committed", "round.committed", "run.completed"]

    stem = tmp_path / "offline"
    pull = ["runs", "pull", str(result.run_id), *db, "--out", str(stem)]
    code, _, err = _run(pull, capsys)
    assert code == ExitCode.USAGE and "--checkpoints DIR" in err
    code, out, _ = _run([*pull, "--checkpoints", str(config.storage.checkpoints)], capsys)
    assert code == ExitCode.OK and "round 2" in out
    assert set(safetensors.numpy.load_file(stem.with_suffix(".safetensors"))) == {"w", "b", "steps"}


def test_control_config_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        run_config(tmp_path, server={"control": {"admins": str(tmp_path / "missing.yaml")}})
    _, key, _ = _admin_config(tmp_path)
    exposed = run_config(
        tmp_path,
        server={"control": {"address": "0.0.0.0:0", "admins": str(tmp_path / "admins.yaml")}},
    )
    coordinator = Coordinator(exposed)

    async def start_then_stop() -> None:
        try:
            await coordinator.start()
        finally:
            await coordinator.stop()

    with pytest.raises(ConfigError, match="beyond loopback without TLS"):
        asyncio.run(start_then_stop())
    assert key.exists()


def test_the_control_api_uses_server_tls(
    tmp_path: Path, serve_coordinator: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    pki = tmp_path / "pki"
    ca = certs_ca(pki, "test CA", days=1, force=False)
    cert, key = certs_leaf(
        pki, pki, "server", subject_name("localhost"), hosts=["localhost"], days=1, force=False
    )
    plain, admin, _ = _admin_config(tmp_path)
    server = plain.server.model_dump(mode="json")
    config = run_config(
        tmp_path,
        run={"rounds": 200},
        evaluation={"every": 0},
        strategy={"clients_per_round": 2, "min_clients": 2},
        server={**server, "tls": {"cert": str(cert), "key": str(key)}},
    )
    handle = serve_coordinator(lambda: Coordinator(config))
    address = f"localhost:{handle.coordinator.control_port}"
    base = ["runs", "list", "--server", address, "--key", str(admin), "--json"]
    code, out, err = _run([*base, "--ca", str(ca)], capsys)
    assert code == ExitCode.OK, err
    assert [r["status"] for r in json.loads(out)] == ["running"]
    code, _, err = _run(base, capsys)  # plaintext to a TLS port: no answer
    assert code == ExitCode.SERVER_UNREACHABLE
    with ControlClient(address, admin, ca=ca) as client:
        client.stop_run(handle.coordinator.run_id)
    # No client ever came: the first round stops waiting for them at once.
    result = handle.result.result(timeout=30)
    assert (result.status, result.error) == ("cancelled", "stopped (admin ops)")


class _FakeLive:
    run_id = 1

    def request_stop(self, reason: str) -> bool:
        return True


def test_dashboard_links_are_one_time_tokens_of_the_admin(tmp_path: Path) -> None:
    config, admin, _ = _admin_config(tmp_path)
    control = config.server.control
    assert control is not None
    sessions = AdminSessions()
    db = open_database(config.storage.url)
    parts = ControlParts(
        db=db,
        store=CheckpointStore(Path(config.storage.checkpoints)),
        admins=AdminKeys(Path(control.admins)),
        sessions=sessions,
        live=_FakeLive(),
        dashboard_url="http://127.0.0.1:8080/",
    )

    async def ask() -> tuple[str, float]:
        server, port = await start_control_server(
            lambda: ControlServicer(parts), control, config.server
        )
        try:
            with ControlClient(f"127.0.0.1:{port}", admin) as client:
                return await asyncio.to_thread(client.dashboard_link)
        finally:
            await server.stop(None)

    try:
        link, ttl_s = asyncio.run(ask())
    finally:
        db.close()
    prefix = "http://127.0.0.1:8080/login?token="
    assert link.startswith(prefix) and ttl_s == sessions.link_ttl_s
    token = link.removeprefix(prefix)
    assert sessions.verify(token) is None  # not a session: a link to redeem
    assert sessions.redeem(token) == "ops"
    assert sessions.redeem(token) is None
