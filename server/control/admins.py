"""Who may operate the coordinator: admin keys, their login, and session tokens.

An administrator holds an Ed25519 key made with ``geofl keys new NAME`` (the same command
as a node's); its ``NAME.node.yaml`` entry goes into ``server.control.admins`` (a file or
a directory of them, the format of ``server.auth.nodes``). To log in, the admin asks the
control API for a nonce, signs :func:`login_message` (the nonce, bound to the connection
it was issued on, as a node's join is) and gets a session token from
:class:`AdminSessions`; every other control call carries that token.

:class:`AdminSessions` is also what the dashboard uses: ``geofl runs dashboard`` asks the
control API for a one-time login link (:meth:`AdminSessions.issue_link`), the dashboard's
``/login`` redeems it (:meth:`AdminSessions.redeem`) and keeps a session token
(:meth:`AdminSessions.issue`) in a cookie that it checks on every request
(:meth:`AdminSessions.verify`). Every method is thread-safe: the dashboard serves from its
own thread.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from geofl.protocols.identity import fingerprint, verify
from geofl.server.nodes.identity import AuthorizedNodes

__all__ = ["AdminKeys", "AdminSessions", "login_message"]

_DOMAIN = b"geofl-admin-login-v1\x00"
#: A session token's life unless told otherwise (an operator's working day is longer:
#: the CLI logs in again by itself, the dashboard sends the admin back to the CLI).
DEFAULT_SESSION_TTL_S = 8 * 3600.0
#: A login link is for a browser opened now.
DEFAULT_LINK_TTL_S = 300.0
_MAX_TOKENS = 10_000


def _field(value: bytes) -> bytes:
    """Length-prefixed, so no two different field lists sign the same bytes."""
    return len(value).to_bytes(4, "big") + value


def login_message(nonce: bytes, channel: str) -> bytes:
    """The bytes an admin signs to log in with ``nonce`` on ``channel`` (its peer address).

    A domain of its own: a node's join signature can never pass for an admin's login.
    """
    return _DOMAIN + _field(nonce) + _field(channel.encode())


class AdminKeys:
    """The admins' public keys at ``server.control.admins`` (re-read when a file changes)."""

    def __init__(self, path: Path) -> None:
        """Read the keys.

        Raises
        ------
        ConfigError
            If the file or directory cannot be read or an entry is invalid.
        """
        self._keys = AuthorizedNodes(path)
        self._lock = threading.Lock()  # the dashboard's thread asks too

    def __len__(self) -> int:
        return len(self._keys)

    def admin_for(self, raw_key: bytes, signature: bytes, message: bytes) -> str | None:
        """The admin whose key ``raw_key`` is and whose signature of ``message`` this is."""
        with self._lock:
            self._keys.refresh()
            entry = self._keys.lookup(raw_key)
        if entry is None or not verify(raw_key, signature, message):
            return None
        return entry.name

    def is_admin(self, name: str) -> bool:
        """Whether ``name`` is still listed (a removed admin's sessions stop working)."""
        with self._lock:
            self._keys.refresh()
            return name in self._keys.names()

    @staticmethod
    def describe(raw_key: bytes) -> str:
        """``SHA256:...`` of a key, as refusals name it."""
        return fingerprint(raw_key)


@dataclass(frozen=True)
class _Grant:
    admin: str
    expires: float
    once: bool


class AdminSessions:
    """Opaque bearer tokens naming an admin: session tokens and one-time login links.

    Tokens are 32 random bytes (URL-safe text); only their SHA-256 is kept, so the table
    holds nothing a reader could present. They live in this process only: a restarted
    coordinator forgets them and admins log in again.
    """

    def __init__(
        self,
        *,
        ttl_s: float = DEFAULT_SESSION_TTL_S,
        link_ttl_s: float = DEFAULT_LINK_TTL_S,
        still_admin: Callable[[str], bool] = lambda name: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``still_admin(name)`` is asked on every check: False ends that admin's tokens."""
        if ttl_s <= 0 or link_ttl_s <= 0:
            raise ValueError("token lifetimes must be positive")
        self.ttl_s = ttl_s
        self.link_ttl_s = link_ttl_s
        self._still_admin = still_admin
        self._clock = clock
        self._lock = threading.Lock()
        self._grants: dict[bytes, _Grant] = {}

    @staticmethod
    def _digest(token: str) -> bytes:
        return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()

    def _grant(self, admin: str, ttl_s: float, once: bool) -> str:
        if not admin:
            raise ValueError("an admin name is required")
        token = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            self._forget_expired(now)
            if len(self._grants) >= _MAX_TOKENS:  # bounded: drop the oldest grant
                self._grants.pop(next(iter(self._grants)))
            self._grants[self._digest(token)] = _Grant(admin, now + ttl_s, once)
        return token

    def _forget_expired(self, now: float) -> None:
        for digest in [d for d, grant in self._grants.items() if grant.expires <= now]:
            del self._grants[digest]

    def issue(self, admin: str, ttl_s: float | None = None) -> str:
        """A session token for ``admin``, valid for ``ttl_s`` (default :attr:`ttl_s`)."""
        return self._grant(admin, self.ttl_s if ttl_s is None else ttl_s, once=False)

    def issue_link(self, admin: str) -> str:
        """A one-time token for a login link (valid :attr:`link_ttl_s`, redeemed once)."""
        return self._grant(admin, self.link_ttl_s, once=True)

    def verify(self, token: str) -> str | None:
        """The admin a session token names, or ``None`` (unknown, expired, revoked admin,
        or a login link: those are only :meth:`redeem`-ed)."""
        grant = self._lookup(token, once=False, consume=False)
        return None if grant is None else grant.admin

    def redeem(self, token: str) -> str | None:
        """The admin a one-time login token names, or ``None``; the token is used up."""
        grant = self._lookup(token, once=True, consume=True)
        return None if grant is None else grant.admin

    def revoke(self, token: str) -> None:
        """End a token now (logout)."""
        with self._lock:
            self._grants.pop(self._digest(token), None)

    def _lookup(self, token: str, *, once: bool, consume: bool) -> _Grant | None:
        digest = self._digest(token)
        now = self._clock()
        with self._lock:
            grant = self._grants.get(digest)
            if grant is None or grant.once != once:
                return None
            if grant.expires <= now:
                del self._grants[digest]
                return None
            if consume:
                del self._grants[digest]
        return grant if self._still_admin(grant.admin) else None
