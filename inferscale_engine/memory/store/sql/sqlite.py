"""SqliteDatabase: the fact store in one SQLite file (or ':memory:'), used by one process.

WAL mode with synchronous=FULL by default: once a write call returns, its rows survive a kill
and a power loss. BEGIN IMMEDIATE takes the write lock at the start of every write transaction,
so two connections never deadlock upgrading a read lock. AUTOINCREMENT ids are never reused.
One connection serves every thread, one call at a time.

Facts are private: a new database file is created 0600 (SQLite gives its -wal and -shm files
the database file's mode) and private_folder() creates missing folders 0700. An existing file
or folder keeps its mode.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from inferscale_engine.checks import check_int
from inferscale_engine.errors import ConfigError, StoreError
from inferscale_engine.memory.store.sql.database import ColumnTypes, Cursor, Database

SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
"""SQLite's synchronous levels."""


class SqliteDatabase(Database):
    """A SQLite file (or ':memory:'); see the module docstring."""

    shared = False
    types = ColumnTypes(id="INTEGER PRIMARY KEY AUTOINCREMENT", integer="INTEGER", blob="BLOB",
                        real="REAL")
    _errors = (sqlite3.Error,)

    def __init__(self, path: str, *, synchronous: str = "FULL",
                 busy_timeout_ms: int = 5000) -> None:
        """Open the file at `path` (created if missing; its folder must exist).

        Args:
            path: database file, or ":memory:" (tests).
            synchronous: FULL (default) makes every commit survive a power loss; NORMAL only a
                crash of the process; EXTRA also syncs the folder.
            busy_timeout_ms: how long a write waits for another connection's lock.
        """
        if not isinstance(synchronous, str) or synchronous.upper() not in SYNCHRONOUS:
            raise ConfigError(f"synchronous={synchronous!r} is not a SQLite level; use one of "
                              f"{', '.join(SYNCHRONOUS)} (FULL keeps commits on power loss)")
        check_int(busy_timeout_ms, "busy_timeout_ms", 0, ConfigError)
        super().__init__(path)
        self._lock = threading.RLock()
        self._write_hint = f"check disk space and that no other process holds {path!r} locked"
        _create_private(path)
        try:
            self._conn = sqlite3.connect(path, timeout=busy_timeout_ms / 1000,
                                         check_same_thread=False,
                                         isolation_level=None)  # transactions: explicit BEGIN
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open fact database {path!r}: {exc}; check that its "
                             "folder exists and is writable") from exc
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
            self._conn.execute("PRAGMA journal_mode = WAL")  # ':memory:' stays 'memory'
            self._conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
            self._conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as exc:
            self._conn.close()
            raise StoreError(f"cannot open fact database {path!r}: {exc}; is it an InferScale "
                             "database (not another file)?") from exc

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        return self._conn.execute(sql, args)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self._conn.executemany(sql, rows)

    def insert(self, sql: str, rows: Sequence[Sequence[Any]], id_column: str) -> list[int]:
        # lastrowid is the INTEGER PRIMARY KEY (`id_column`) of the row just inserted.
        return [cast(int, self._conn.execute(sql, row).lastrowid) for row in rows]

    def lock_schema(self) -> None:
        """BEGIN IMMEDIATE already made this the only writer."""

    @contextmanager
    def _connection(self) -> Iterator[None]:
        with self._lock:
            yield

    def _begin(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")  # takes the write lock now: no upgrade deadlock

    def _commit(self) -> None:
        self._conn.execute("COMMIT")

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def _disconnect(self) -> None:
        with self._lock:
            self._conn.close()


def private_folder(folder: str | os.PathLike[str]) -> None:
    """Create `folder` and its missing parents, each 0700 (readable by this user only)."""
    missing = []
    path = Path(folder)
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile by another process: its mode is its own
            continue
        os.chmod(path, 0o700)  # mkdir's mode is narrowed by the umask, never widened: be exact


def _create_private(path: str) -> None:
    """Create the database file 0600 if it does not exist (SQLite would make it 0644)."""
    if path in ("", ":memory:") or path.startswith("file:"):
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return
    except OSError:
        return  # no folder, no permission: sqlite3.connect says so in its own words
    os.chmod(path, 0o600)
