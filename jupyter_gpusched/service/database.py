"""Opening the scheduler's database: the engine, SQLite's settings, the file's privacy, and
the Alembic configuration of the shipped migrations.

Apart from :mod:`.store` (the rows the service reads and writes) because everything here is
about the connection, not the data: the migrations' environment (``migrations/env.py``) opens
its engine with :func:`make_engine` without a :class:`~.store.Store`, and a developer writing a
migration takes :func:`alembic_config` from here.

SQLite runs in WAL mode with ``synchronous=NORMAL`` (why: :func:`_sqlite_on_connect`); a SQLite
file is the service's alone, 0600 (:func:`make_sqlite_file_private`, docs/security.md).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic.config import Config
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import StaticPool

MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config(url: str | None = None) -> Config:
    """An Alembic configuration for the migrations shipped in this package (no alembic.ini)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))  # configparser syntax
    return cfg


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy emit BEGIN itself (see _sqlite_on_begin): the sqlite3 module's own
    # transaction handling would commit before DDL, so migrations would not be atomic.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    # WAL + synchronous=NORMAL: COMMIT returns once the transaction is in the WAL file (in the
    # OS page cache); the WAL is fsync'ed at checkpoints. A committed transaction therefore
    # survives a crash of *this process* (kill -9: the kernel still writes the file out), which
    # is the failure the service must survive. Only an OS crash or power cut can lose the last
    # few commits, and the database stays consistent even then. synchronous=FULL would fsync on
    # every commit: milliseconds each, too slow for 500 submissions/s.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=5000")  # wait, not fail, if another process writes
    cursor.close()


def _sqlite_on_begin(connection: Connection) -> None:
    connection.exec_driver_sql("BEGIN")


#: Files SQLite keeps next to a database file (WAL, shared memory, rollback journal).
SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")


def make_sqlite_file_private(path: str) -> None:
    """Create the database file 0600 if missing (SQLite takes an empty file as an empty
    database), else make it and its companion files 0600: other users of the host must not read
    the jobs' commands and environments in it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for suffix in SQLITE_COMPANIONS:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(path + suffix, 0o600)


def sqlite_file(url: str) -> str | None:
    """The database file of a SQLite URL; None for another backend or an in-memory database."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    if parsed.database.startswith("file:"):  # a URI filename: leave it to its author
        return None
    return os.path.abspath(parsed.database)


def make_engine(url: str, echo: bool = False) -> Engine:
    """An engine for ``url``, with the SQLite settings above when it is SQLite."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return sa.create_engine(parsed, echo=echo, pool_pre_ping=True)
    kwargs: dict[str, Any] = {}
    if parsed.database in (None, "", ":memory:"):  # one shared connection, or each has its own DB
        kwargs = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
    engine = sa.create_engine(parsed, echo=echo, **kwargs)
    sa.event.listen(engine, "connect", _sqlite_on_connect)
    sa.event.listen(engine, "begin", _sqlite_on_begin)
    return engine
