"""Alembic environment for the scheduler's database.

Users never run this directly: :meth:`jupyter_gpusched.service.store.Store.upgrade` runs the
migrations programmatically and hands over its connection through
``config.attributes["connection"]``. For a developer writing a new migration::

    from alembic import command
    from jupyter_gpusched.service.database import alembic_config

    command.revision(alembic_config("sqlite:///dev.sqlite"), "add foo", autogenerate=True)

(upgrade ``dev.sqlite`` to head first, then edit the generated file in ``versions/``: spell the
operations out, and keep ``tests/test_store.py::test_models_match_migrations`` passing).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from jupyter_gpusched.service.database import make_engine
from jupyter_gpusched.service.models import Base

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    sqlite = connection.dialect.name == "sqlite"
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things: batch mode copies the table instead.
        render_as_batch=sqlite,
        # The store's engine makes SQLite transactions real (it emits BEGIN itself), so a
        # migration is all-or-nothing on SQLite too; PostgreSQL has transactional DDL anyway.
        transactional_ddl=True,
        compare_type=True,
    )


def run_migrations_offline() -> None:
    """``alembic upgrade --sql``: print the SQL instead of running it."""
    url = config.get_main_option("sqlalchemy.url")
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=bool(url and url.startswith("sqlite")),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run on the caller's connection (inside its transaction), or open one from the URL."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url"))
    try:
        with engine.begin() as connection:
            _configure(connection)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
