"""Opening the database: engines, sessions, and Alembic migrations run from code.

``open_database(url)`` is what the server calls on start: it checks that the database
is reachable (raising one clear :class:`StorageUnavailableError` if not), configures
SQLite for a long-lived coordinator (WAL, ``synchronous=NORMAL``, foreign keys, a busy
timeout, ``BEGIN IMMEDIATE`` transactions), and applies migrations up to head.

Once open, a database that goes away (PostgreSQL restarted, SQLite locked past its busy
timeout) is ridden out: :meth:`Database.session` retries starting its transaction, with
backoff, for up to ``retry_s`` seconds before it raises. The retry is at the start of a
unit of work, before anything was written, so a retried unit is never applied twice.
:meth:`Database.transact` also re-runs a unit whose connection dropped before its
``COMMIT``. A PostgreSQL connection lost *during* the ``COMMIT`` (the server stopped while
it was in flight) is settled by asking, once the database answers, whether the unit's
transaction id committed (``pg_xact_status``, PostgreSQL 13 or later).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import URL, Connection, Engine, create_engine, event, make_url, text
from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from geofl.storage.errors import DatabaseURLError, StorageError, StorageUnavailableError

__all__ = [
    "MIGRATIONS_DIR",
    "Database",
    "alembic_config",
    "current_revision",
    "downgrade",
    "head_revision",
    "open_database",
    "redact_url",
    "upgrade",
]

#: Folder of the Alembic environment shipped inside the package.
MIGRATIONS_DIR = Path(__file__).resolve().with_name("migrations")
#: How long a SQLite writer waits for another writer's lock before failing.
SQLITE_BUSY_TIMEOUT_MS = 30_000
#: How long a PostgreSQL connection attempt may take before it counts as unreachable.
POSTGRES_CONNECT_TIMEOUT_S = 10
#: Default of how long an open database that cannot start a transaction is retried.
DEFAULT_RETRY_S = 120.0
#: First and longest pause between two attempts.
_RETRY_FIRST_S, _RETRY_MAX_S = 0.1, 2.0

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class _Outcome(enum.Enum):
    """What became of a unit of work whose ``COMMIT`` was sent."""

    APPLIED = "applied"
    NOT_APPLIED = "not applied"


class Database:
    """An engine plus a session factory: the handle the server keeps for its lifetime.

    Parameters
    ----------
    engine:
        A configured engine, normally built by :func:`open_database`.
    retry_s:
        How long :meth:`session` keeps trying to start a transaction on a database that
        cannot be reached or is locked (0: fail at once).
    on_recovered:
        Called with the seconds waited after the database came back from an outage (the
        server forgives its clients the heartbeats it could not hear meanwhile).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        retry_s: float = DEFAULT_RETRY_S,
        on_recovered: Callable[[float], None] | None = None,
    ) -> None:
        self.engine = engine
        self.retry_s = retry_s
        self.on_recovered = on_recovered
        #: Outages ridden out so far, and seconds spent waiting in them.
        self.outages = 0
        self.outage_s = 0.0
        # Objects stay readable after commit: callers use returned rows (ids, numbers)
        # once the unit of work is over.
        self.sessionmaker = sessionmaker(engine, expire_on_commit=False)

    @property
    def url(self) -> str:
        """The database URL with the password replaced by ``***``."""
        return redact_url(self.engine.url)

    @property
    def dialect(self) -> str:
        """The backend name: ``"sqlite"`` or ``"postgresql"``."""
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        """Run one unit of work in one transaction: commit on success, roll back on error.

        Starting the transaction is retried for up to :attr:`retry_s` seconds (see the
        module docstring); a database still away then, or one lost in the middle of the
        unit of work, is raised as :class:`StorageUnavailableError`.
        """
        session = self._begin()
        try:
            yield session
            session.flush()
            transaction = self._transaction_id(session)
        except (OperationalError, InterfaceError) as exc:
            session.rollback()
            session.close()
            raise StorageUnavailableError(self.url, _one_line(exc, self.engine.url)) from exc
        except BaseException:
            session.rollback()
            session.close()
            raise
        if self._commit(session, transaction) is not _Outcome.APPLIED:
            raise StorageUnavailableError(
                self.url, "the connection was lost before the unit of work was committed"
            )

    def transact(self, work: Callable[[Session], _T]) -> _T:
        """Run ``work(session)`` as one unit of work; run it again if the connection drops.

        :meth:`session` can retry only the start of a transaction; a database that goes
        away *during* the unit (PostgreSQL stopped while a statement runs) fails it. Here
        the whole unit is re-run on a fresh transaction, within :attr:`retry_s`, as long
        as the failure came before ``COMMIT`` was sent (``work`` has run and been
        flushed): the rolled-back attempt left nothing behind, so nothing is doubled. A
        connection lost during the ``COMMIT`` itself is raised, since the database may or
        may not have applied it.
        """
        started = time.monotonic()
        while True:
            session = self._begin()
            try:
                result = work(session)
                session.flush()
                transaction = self._transaction_id(session)
            except (OperationalError, InterfaceError) as exc:
                session.rollback()
                session.close()
                waited = time.monotonic() - started
                if not exc.connection_invalidated or waited >= self.retry_s:
                    raise StorageUnavailableError(
                        self.url, _one_line(exc, self.engine.url)
                    ) from exc
                log.warning("database %s dropped the connection; running the unit again", self.url)
                continue
            except BaseException:
                session.rollback()
                session.close()
                raise
            if self._commit(session, transaction) is _Outcome.APPLIED:
                return result
            if time.monotonic() - started >= self.retry_s:
                raise StorageUnavailableError(
                    self.url, "the connection was lost before the unit of work was committed"
                )
            log.warning("database %s lost the unit before its COMMIT; running it again", self.url)

    def _transaction_id(self, session: Session) -> str | None:
        """PostgreSQL's id of the session's transaction once it has written; else ``None``.

        Read before ``COMMIT`` so that a connection lost during the ``COMMIT`` can be
        settled afterwards (:meth:`_commit`): the id's status says whether it was applied.
        A transaction that wrote nothing has no id, and SQLite needs none (its ``COMMIT``
        is local: an error means nothing was applied).
        """
        if self.dialect != "postgresql":
            return None
        statement = text("SELECT pg_current_xact_id_if_assigned()::text")
        value = session.execute(statement).scalar_one()
        return None if value is None else str(value)

    def _commit(self, session: Session, transaction: str | None) -> _Outcome:
        """Commit; when the connection drops during the ``COMMIT``, find out what happened.

        A read-only unit lost at its ``COMMIT`` has nothing to apply. A writing one on
        PostgreSQL is looked up by id once the database answers again
        (``pg_xact_status``): committed, or not (rolled back, or lost in the shutdown), in
        which case it can be run again without doubling anything.

        Raises
        ------
        StorageUnavailableError
            If the outcome cannot be told (the database stays away past ``retry_s``, or
            the id is no longer known), or SQLite failed its ``COMMIT``.
        """
        try:
            session.commit()
            return _Outcome.APPLIED
        except (OperationalError, InterfaceError) as exc:
            session.rollback()
            lost = exc
        finally:
            session.close()
        if self.dialect != "postgresql":
            raise StorageUnavailableError(self.url, _one_line(lost, self.engine.url)) from lost
        if transaction is None:
            return _Outcome.APPLIED  # nothing was written, so nothing was lost
        log.warning(
            "database %s dropped the connection during COMMIT; asking whether it was applied",
            self.url,
        )
        status = self._transaction_status(transaction, lost)
        if status == "committed":
            return _Outcome.APPLIED
        if status == "aborted":
            return _Outcome.NOT_APPLIED
        raise StorageUnavailableError(
            self.url,
            f"the connection dropped during COMMIT and transaction {transaction}'s outcome is "
            f"unknown ({status}): {_one_line(lost, self.engine.url)}",
        ) from lost

    def _transaction_status(self, transaction: str, lost: DBAPIError) -> str | None:
        try:
            checker = self._begin()  # retried while the database is away
        except StorageUnavailableError as exc:
            raise StorageUnavailableError(
                self.url, f"lost during COMMIT, and then: {exc.reason}"
            ) from lost
        try:
            status = checker.execute(
                text("SELECT pg_xact_status(CAST(:transaction AS xid8))"),
                {"transaction": transaction},
            ).scalar_one()
        finally:
            checker.close()
        return None if status is None else str(status)

    def _begin(self) -> Session:
        """A session whose transaction has started (connection checked out, BEGIN run)."""
        started = time.monotonic()
        pause = _RETRY_FIRST_S
        attempt = 0
        while True:
            session = self.sessionmaker()
            try:
                session.connection()  # checkout (pre-ping on PostgreSQL), then BEGIN
            except (OperationalError, InterfaceError) as exc:
                session.close()
                waited = time.monotonic() - started
                if waited + pause > self.retry_s:
                    reason = _one_line(exc, self.engine.url)
                    if attempt:
                        reason += f" (retried for {waited:.0f} s)"
                    raise StorageUnavailableError(self.url, reason) from exc
                if attempt == 0:
                    log.warning(
                        "database %s unavailable, retrying for up to %.0f s: %s",
                        self.url,
                        self.retry_s,
                        _one_line(exc, self.engine.url),
                    )
                attempt += 1
                time.sleep(pause)
                pause = min(pause * 2, _RETRY_MAX_S)
                continue
            if attempt:
                self._recovered(time.monotonic() - started)
            return session

    def _recovered(self, waited: float) -> None:
        self.outages += 1
        self.outage_s += waited
        log.warning("database %s is back after %.1f s", self.url, waited)
        if self.on_recovered is not None:
            self.on_recovered(waited)

    def close(self) -> None:
        """Close all pooled connections."""
        self.engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def redact_url(url: str | URL) -> str:
    """Render a database URL with its password hidden, for messages and logs."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return "<unparseable database URL>"
    return parsed.render_as_string(hide_password=True)


def open_database(
    url: str, *, migrate: bool = True, echo: bool = False, retry_s: float = DEFAULT_RETRY_S
) -> Database:
    """Connect to ``url``, check it is reachable, and (by default) migrate it to head.

    Parameters
    ----------
    url:
        A SQLAlchemy URL, e.g. ``sqlite:///runs/geofl.db`` (relative to the working
        directory; its folder is created) or ``postgresql+psycopg://user:pw@host/db``.
    migrate:
        Apply pending Alembic migrations. The server does; read-only tools may not.
    echo:
        Log every SQL statement (debugging).
    retry_s:
        How long the open database rides out an outage (:class:`Database`); opening
        itself is not retried, so a wrong URL fails at once.

    Raises
    ------
    DatabaseURLError
        The URL is malformed or its driver is unknown or not installed.
    StorageUnavailableError
        The database cannot be reached, authenticated to, or created.
    """
    parsed = _parse_url(url)
    engine = _create_engine(parsed, echo=echo)
    database = Database(engine, retry_s=retry_s)
    try:
        with engine.connect() as connection:
            connection.rollback()
    except DBAPIError as exc:
        engine.dispose()
        raise StorageUnavailableError(database.url, _one_line(exc, parsed)) from exc
    if migrate:
        upgrade(database)
    return database


def _parse_url(url: str) -> URL:
    try:
        parsed = make_url(url)
    except ArgumentError:
        # The message would echo the URL, password included: say what is expected instead.
        raise DatabaseURLError(
            "not a database URL; expected e.g. sqlite:///runs/geofl.db or "
            "postgresql+psycopg://user:password@host:5432/geofl"
        ) from None
    if parsed.get_backend_name() == "sqlite":
        _ensure_sqlite_directory(parsed)
    return parsed


def _ensure_sqlite_directory(url: URL) -> None:
    database = url.database or ""
    if database in ("", ":memory:") or url.query.get("uri") == "true":
        return
    parent = Path(database).expanduser().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = f"cannot create directory {parent}: {exc.strerror or exc}"
        raise StorageUnavailableError(redact_url(url), reason) from exc


def _create_engine(url: URL, *, echo: bool) -> Engine:
    kwargs: dict[str, Any] = {"echo": echo}
    backend = url.get_backend_name()
    if backend == "sqlite" and (url.database or ":memory:") == ":memory:":
        # One shared connection, or each pooled connection would see its own empty database.
        kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
    elif backend == "postgresql":
        kwargs["pool_pre_ping"] = True
        if "connect_timeout" not in url.query:
            kwargs["connect_args"] = {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S}
    try:
        engine = create_engine(url, **kwargs)
    except ImportError as exc:
        raise DatabaseURLError(
            f"the driver for {redact_url(url)} is not installed ({exc.name or exc}); "
            "geofl supports sqlite:/// and postgresql+psycopg:// (pip install 'geofl[postgres]')"
        ) from exc
    except ArgumentError as exc:
        raise DatabaseURLError(
            f"unsupported database URL {redact_url(url)}: {_first_line(str(exc))}"
        ) from exc
    if backend == "sqlite":
        event.listen(engine, "connect", _configure_sqlite_connection)
        event.listen(engine, "begin", _begin_immediate)
    return engine


def _configure_sqlite_connection(dbapi_connection: Any, connection_record: Any) -> None:
    # Take over transaction control from the sqlite3 module so that BEGIN (below) covers
    # reads and DDL too, and SAVEPOINT works.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def _begin_immediate(connection: Connection) -> None:
    # IMMEDIATE takes the write lock up front (waiting up to the busy timeout), so a
    # transaction that reads then writes never fails on a stale WAL snapshot.
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _one_line(exc: DBAPIError, url: URL) -> str:
    """The driver's own message on one line, with any password scrubbed."""
    message = " ".join(str(exc.orig if exc.orig is not None else exc).split())
    if url.password:
        message = message.replace(str(url.password), "***")
    return message or type(exc).__name__


def alembic_config(connection: Connection | None = None) -> Config:
    """Build the Alembic configuration in code; no ``alembic.ini`` is needed.

    Parameters
    ----------
    connection:
        Run migrations on this connection (inside its transaction) instead of opening
        one from ``sqlalchemy.url``.
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    config.set_main_option("path_separator", "os")
    config.set_main_option("file_template", "%%(rev)s_%%(slug)s")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def _on_connection(target: str | Database, action: Callable[[Connection], _T]) -> _T:
    database = target if isinstance(target, Database) else open_database(target, migrate=False)
    try:
        with database.engine.begin() as connection:
            return action(connection)
    finally:
        if database is not target:
            database.close()


def _migrating(target: str | Database, action: Callable[[Connection], None]) -> None:
    """Run a migration in one transaction; on SQLite with foreign keys off meanwhile.

    SQLite alters a constraint by rebuilding the table (Alembic's batch mode): the old
    table is dropped, and with foreign keys on, dropping ``runs`` would cascade to every
    row that refers to it. SQLite's own procedure for such changes turns them off
    outside the transaction (inside it the pragma is a no-op), checks the references
    before committing, and turns them on again.
    """
    database = target if isinstance(target, Database) else open_database(target, migrate=False)
    try:
        with database.engine.connect() as connection:
            sqlite = connection.dialect.name == "sqlite"
            raw = connection.connection.dbapi_connection
            if sqlite and raw is not None:
                raw.execute("PRAGMA foreign_keys = OFF")  # before BEGIN: not yet begun
            try:
                with connection.begin():
                    action(connection)
                    if sqlite:
                        broken = connection.exec_driver_sql("PRAGMA foreign_key_check").first()
                        if broken is not None:
                            raise StorageError(f"migration broke a reference: {tuple(broken)}")
            finally:
                if sqlite and raw is not None:
                    raw.execute("PRAGMA foreign_keys = ON")
    finally:
        if database is not target:
            database.close()


def upgrade(target: str | Database, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` (default: the newest) in one transaction.

    Raises
    ------
    StorageError
        The database was migrated by a newer geofl (its revision is unknown here).
    """
    _migrating(target, lambda conn: _migrate(conn, command.upgrade, revision))


def downgrade(target: str | Database, revision: str) -> None:
    """Revert migrations down to ``revision`` (``"base"`` removes every table)."""
    _migrating(target, lambda conn: _migrate(conn, command.downgrade, revision))


def _migrate(connection: Connection, step: Callable[[Config, str], None], revision: str) -> None:
    config = alembic_config(connection)
    known = {script.revision for script in ScriptDirectory.from_config(config).walk_revisions()}
    current = MigrationContext.configure(connection).get_current_revision()
    if current is not None and current not in known:
        raise StorageError(
            f"database {redact_url(connection.engine.url)} is at schema revision {current}, "
            f"which this geofl does not know (newest here: {head_revision()}); "
            "upgrade geofl or use another database"
        )
    step(config, revision)


def current_revision(target: str | Database) -> str | None:
    """The revision the database is at, or ``None`` if it was never migrated."""
    return _on_connection(
        target, lambda conn: MigrationContext.configure(conn).get_current_revision()
    )


def head_revision() -> str:
    """The newest revision shipped with this version of geofl."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError(f"no migrations found under {MIGRATIONS_DIR}")
    return head
