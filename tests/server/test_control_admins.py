"""Admin credentials: keys from ``geofl keys new``, login signatures, session tokens."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from geofl.protocols.identity import join_message, load_private_key, raw_public_key
from geofl.server.cli.credentials import keys_new
from geofl.server.config.errors import ConfigError
from geofl.server.control.admins import AdminKeys, AdminSessions, login_message


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _admin(tmp_path: Path, name: str) -> tuple[bytes, Path]:
    """``geofl keys new NAME``: the raw public key and the private key file."""
    private, _ = keys_new(name, tmp_path / "keys", None, force=False)
    return raw_public_key(load_private_key(private).public_key()), private


def _admins_dir(tmp_path: Path, *names: str) -> Path:
    folder = tmp_path / "admins"
    folder.mkdir(exist_ok=True)
    for name in names:
        entry = tmp_path / "keys" / f"{name}.node.yaml"
        (folder / f"{name}.yaml").write_text(entry.read_text())
    return folder


def test_a_signed_login_names_the_admin(tmp_path: Path) -> None:
    raw, private = _admin(tmp_path, "alice")
    keys = AdminKeys(_admins_dir(tmp_path, "alice"))
    message = login_message(b"n" * 32, "ipv4:127.0.0.1:5000")
    signature = load_private_key(private).sign(message)
    assert keys.admin_for(raw, signature, message) == "alice"
    assert keys.is_admin("alice") and not keys.is_admin("bob")


def test_wrong_signatures_and_unknown_keys_name_nobody(tmp_path: Path) -> None:
    raw, private = _admin(tmp_path, "alice")
    stranger, stranger_private = _admin(tmp_path, "mallory")
    keys = AdminKeys(_admins_dir(tmp_path, "alice"))
    message = login_message(b"n" * 32, "ipv4:127.0.0.1:5000")
    key = load_private_key(private)
    other_channel = login_message(b"n" * 32, "ipv4:127.0.0.1:6000")
    assert keys.admin_for(raw, key.sign(other_channel), message) is None
    # A node's join signature is not an admin's login, even over the same nonce.
    join = join_message(1, "run", b"n" * 32, "ipv4:127.0.0.1:5000", "alice")
    assert keys.admin_for(raw, key.sign(join), message) is None
    forged = load_private_key(stranger_private).sign(message)
    assert keys.admin_for(stranger, forged, message) is None


def test_removing_an_admin_takes_effect_without_a_restart(tmp_path: Path) -> None:
    _admin(tmp_path, "alice")
    _admin(tmp_path, "bob")
    folder = _admins_dir(tmp_path, "alice", "bob")
    keys = AdminKeys(folder)
    sessions = AdminSessions(still_admin=keys.is_admin)
    token = sessions.issue("bob")
    assert sessions.verify(token) == "bob"
    (folder / "bob.yaml").unlink()
    assert sessions.verify(token) is None
    assert len(keys) == 1


def test_a_bad_admins_file_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "admins.yaml"
    bad.write_text("name: alice\npublic_key: not a key\n")
    with pytest.raises(ConfigError, match="alice"):
        AdminKeys(bad)


def test_session_tokens_verify_until_they_expire_or_are_revoked() -> None:
    clock = FakeClock()
    sessions = AdminSessions(ttl_s=60, clock=clock)
    token = sessions.issue("alice")
    assert sessions.verify(token) == sessions.verify(token) == "alice"  # reusable
    assert sessions.verify(token + "x") is None
    assert sessions.verify("") is None
    clock.now += 61
    assert sessions.verify(token) is None
    short = sessions.issue("alice", ttl_s=5)
    sessions.revoke(short)
    assert sessions.verify(short) is None


def test_login_links_are_redeemed_once_and_are_not_sessions() -> None:
    clock = FakeClock()
    sessions = AdminSessions(link_ttl_s=300, clock=clock)
    link = sessions.issue_link("alice")
    assert sessions.verify(link) is None  # a link is not a session
    assert sessions.redeem(link) == "alice"
    assert sessions.redeem(link) is None  # used up
    late = sessions.issue_link("alice")
    clock.now += 301
    assert sessions.redeem(late) is None
    assert sessions.redeem(sessions.issue("alice")) is None  # a session is not a link


def test_tokens_are_unguessable_text_and_distinct() -> None:
    sessions = AdminSessions()
    tokens = {sessions.issue("alice") for _ in range(100)}
    assert len(tokens) == 100
    assert all(len(t) >= 43 and t.replace("-", "").replace("_", "").isalnum() for t in tokens)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        AdminSessions(ttl_s=0)
    with pytest.raises(ValueError, match="admin name"):
        AdminSessions().issue("")


def test_sessions_are_shared_safely_between_threads() -> None:
    sessions = AdminSessions()
    found: list[str | None] = []

    def work() -> None:
        for _ in range(200):
            found.append(sessions.verify(sessions.issue("alice")))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert found == ["alice"] * 800
