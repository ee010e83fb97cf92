"""The pieces of node identity without a network: key files, the authorized list, the
challenges, and what ``geofl keys`` / ``geofl certs`` write."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509

from geofl.protocols.errors import IdentityRefusedError
from geofl.protocols.identity import (
    KeyFileError,
    fingerprint,
    join_message,
    load_private_key,
    raw_public_key,
)
from geofl.server.cli.main import main
from geofl.server.config import ConfigError
from geofl.server.nodes.identity import AuthorizedNodes, ChallengeBook, NodeIdentity


def test_keys_new_writes_a_private_key_only_its_owner_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "new", "edge-1", "--out", str(tmp_path), "--region", "eu"]) == 0
    private = tmp_path / "edge-1.key"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    entry = (tmp_path / "edge-1.node.yaml").read_text()
    assert entry.startswith("name: edge-1\nregion: eu\npublic_key: |\n")
    nodes = AuthorizedNodes(tmp_path / "edge-1.node.yaml")
    key = nodes.lookup(raw_public_key(load_private_key(private).public_key()))
    assert key is not None and (key.name, key.region) == ("edge-1", "eu")
    assert "wrote" in capsys.readouterr().out
    assert main(["keys", "new", "edge-1", "--out", str(tmp_path)]) == 2  # no overwrite
    assert "--force" in capsys.readouterr().err
    assert main(["keys", "new", "two words", "--out", str(tmp_path)]) == 2


def test_certs_make_a_ca_a_server_and_a_node_certificate(tmp_path: Path) -> None:
    assert main(["certs", "ca", "--out", str(tmp_path / "ca")]) == 0
    ca = ["--ca", str(tmp_path / "ca")]
    assert main(["certs", "server", *ca, "--host", "coord.example.org", "--host", "10.0.0.1",
                 "--out", str(tmp_path)]) == 0  # fmt: skip
    assert main(["certs", "node", "edge-1", *ca, "--region", "eu", "--out", str(tmp_path)]) == 0
    node = x509.load_pem_x509_certificate((tmp_path / "edge-1.pem").read_bytes())
    assert node.subject.rfc4514_string() == "OU=eu,CN=edge-1"
    server = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(n.value) for n in names] == ["coord.example.org", "10.0.0.1"]
    authority = x509.load_pem_x509_certificate((tmp_path / "ca" / "ca.pem").read_bytes())
    node.verify_directly_issued_by(authority)
    assert stat.S_IMODE((tmp_path / "ca" / "ca.key").stat().st_mode) == 0o600
    assert main(["certs", "node", "x", "--ca", str(tmp_path / "none")]) == 2


def test_a_private_key_file_that_is_missing_or_not_ed25519_is_named(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="cannot read"):
        load_private_key(tmp_path / "absent.key")
    (tmp_path / "bad.key").write_text("not a key")
    with pytest.raises(KeyFileError, match="not a PEM private key"):
        load_private_key(tmp_path / "bad.key")


def test_the_signed_message_covers_every_field_unambiguously() -> None:
    base = join_message(1, "run", b"n" * 32, "ipv4:1.2.3.4:5", "node")
    others = [
        join_message(2, "run", b"n" * 32, "ipv4:1.2.3.4:5", "node"),
        join_message(1, "ru", b"n" * 32, "ipv4:1.2.3.4:5", "node"),
        join_message(1, "run", b"m" * 32, "ipv4:1.2.3.4:5", "node"),
        join_message(1, "run", b"n" * 32, "ipv4:1.2.3.4:6", "node"),
        join_message(1, "run", b"n" * 32, "ipv4:1.2.3.4:5", "nodf"),
        join_message(1, "runn", b"n" * 32, "ipv4:1.2.3.4:5", "ode"),
    ]
    assert base not in others and len(set(others)) == len(others)


def test_a_challenge_is_single_use_bound_to_its_connection_and_short_lived() -> None:
    now = [0.0]
    book = ChallengeBook(ttl_s=10, capacity=3, clock=lambda: now[0])
    nonce = book.issue("ipv4:127.0.0.1:1000")
    with pytest.raises(IdentityRefusedError, match="another connection"):
        book.redeem(nonce, "ipv4:127.0.0.1:2000")
    with pytest.raises(IdentityRefusedError, match="already used"):
        book.redeem(nonce, "ipv4:127.0.0.1:1000")  # the failed replay spent it
    late = book.issue("c")
    now[0] = 11.0
    with pytest.raises(IdentityRefusedError, match="expired"):
        book.redeem(late, "c")
    first = book.issue("c")
    for _ in range(3):
        book.issue("c")
    with pytest.raises(IdentityRefusedError):
        book.redeem(first, "c")  # forgotten: the book holds at most `capacity`


def _entry(tmp_path: Path, name: str) -> str:
    assert main(["keys", "new", name, "--out", str(tmp_path / "made")]) == 0
    return (tmp_path / "made" / f"{name}.node.yaml").read_text()


def test_the_authorized_list_reloads_on_change_and_keeps_a_valid_list(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "nodes"
    folder.mkdir()
    (folder / "a.yaml").write_text(_entry(tmp_path, "a"))
    nodes = AuthorizedNodes(folder)
    assert len(nodes) == 1 and not nodes.refresh()
    raw = raw_public_key(load_private_key(tmp_path / "made" / "a.key").public_key())
    a = NodeIdentity("a", None, f"key {fingerprint(raw)}")
    (folder / "b.yaml").write_text(_entry(tmp_path, "b"))
    assert nodes.refresh() and len(nodes) == 2 and nodes.still_valid(a)
    (folder / "c.yaml").write_text("name: c\npublic_key: nonsense\n")
    assert not nodes.refresh() and len(nodes) == 2  # an invalid edit keeps the old list
    (folder / "c.yaml").unlink()
    (folder / "a.yaml").unlink()
    assert nodes.refresh() and len(nodes) == 1 and not nodes.still_valid(a)


def test_a_list_naming_a_node_twice_is_refused(tmp_path: Path) -> None:
    entry = _entry(tmp_path, "a")
    listed = "nodes:\n" + "".join(
        "  - " + text.replace("\n", "\n    ").rstrip() + "\n" for text in (entry, entry)
    )
    (tmp_path / "nodes.yaml").write_text(listed)
    with pytest.raises(ConfigError, match="listed twice"):
        AuthorizedNodes(tmp_path / "nodes.yaml")
