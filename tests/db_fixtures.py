"""Database fixtures for tests of the service's store, on real databases (no mocks).

``db_url`` runs a test twice: on a fresh SQLite file, and on a fresh database in a private
PostgreSQL server (``scripts/postgres.sh``), started once per test session on a free port and
stopped at its end. Without PostgreSQL on the machine (and no root/apt-get to install it) the
PostgreSQL half is skipped with the reason; set ``GPUSCHED_REQUIRE_POSTGRES=1`` (as CI should)
to make that a failure instead.

Import the fixtures in ``tests/conftest.py`` so that every test module can use them.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import make_url

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "postgres.sh"
UNAVAILABLE = 3  # postgres.sh's exit status when PostgreSQL cannot be had here

_databases = itertools.count(1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The URL of the session's PostgreSQL server (its ``gpusched`` database)."""
    # Not under pytest's tmp_path: its parents are private to root, and the server runs as
    # the postgres user.
    directory = tempfile.mkdtemp(prefix="gpusched-pg-")
    try:
        proc = subprocess.run(
            ["bash", str(SCRIPT), "start", directory, str(_free_port())],
            capture_output=True,
            text=True,
            timeout=600,  # a first run may install the package
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        shutil.rmtree(directory, ignore_errors=True)
        pytest.fail(f"scripts/postgres.sh start: {exc}")
    if proc.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        why = f"no PostgreSQL test server: {proc.stderr.strip()[-3000:]}"
        if proc.returncode == UNAVAILABLE and not os.environ.get("GPUSCHED_REQUIRE_POSTGRES"):
            pytest.skip(why)
        pytest.fail(why)
    try:
        yield proc.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run(
            ["bash", str(SCRIPT), "stop", directory], capture_output=True, timeout=60, check=False
        )
        shutil.rmtree(directory, ignore_errors=True)


def _create_database(server_url: str) -> str:
    """A new, empty database on the server; its URL."""
    import psycopg

    url = make_url(server_url)
    name = f"gpusched_{next(_databases)}"
    with psycopg.connect(
        host=url.host, port=url.port, user=url.username, dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.set(database=name).render_as_string(hide_password=False)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A URL for a new SQLite database file."""
    return f"sqlite:///{tmp_path / 'gpusched.sqlite'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL for a new, empty database: SQLite, then PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gpusched.sqlite'}"
    # looked up here, not as an argument, so that `-k sqlite` never starts a server
    return _create_database(request.getfixturevalue("postgres_server"))
