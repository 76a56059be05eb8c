"""The databases under FactStore: one small object per kind, behind one contract.

fact_store.py chooses one by its target (open_database) and runs the same SQL on either.

  database.py  Database: what FactStore runs SQL through (a lock, transactions, StoreError)
  sqlite.py    SqliteDatabase: a file or ':memory:', one process (the default)
  postgres.py  PostgresDatabase: a postgresql:// URL, shared by several processes
"""

from __future__ import annotations

import re

from inferscale_engine.errors import ConfigError
from inferscale_engine.memory.store.sql.database import Database
from inferscale_engine.memory.store.sql.postgres import PostgresDatabase, is_postgres_url, redact
from inferscale_engine.memory.store.sql.sqlite import SqliteDatabase

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(target: str) -> bool:
    """True if `target` is a database URL (scheme://...), not a file path."""
    return bool(_URL.match(target))


def open_database(target: str, *, synchronous: str | None = None,
                  busy_timeout_ms: int = 5000) -> Database:
    """The database at `target`: a postgresql:// URL, or a SQLite file path or ':memory:'.

    Raises:
        ConfigError: an unsupported URL scheme, or a SQLite-only option with a URL.
        StoreError: the database cannot be opened.
    """
    if is_postgres_url(target):
        if synchronous is not None:
            raise ConfigError(f"synchronous={synchronous!r} sets SQLite's sync level; for "
                              "PostgreSQL it is the server's synchronous_commit setting")
        return PostgresDatabase(target, busy_timeout_ms=busy_timeout_ms)
    if is_url(target):
        raise ConfigError(f"{redact(target)!r} is not a supported database URL; pass a file "
                          "path, ':memory:' or a postgresql://user:password@host/dbname URL")
    return SqliteDatabase(target, synchronous="FULL" if synchronous is None else synchronous,
                          busy_timeout_ms=busy_timeout_ms)


__all__ = ["Database", "PostgresDatabase", "SqliteDatabase", "is_url", "open_database"]
