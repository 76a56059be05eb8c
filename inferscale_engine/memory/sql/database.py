"""Database: the contract FactStore runs its SQL through, whatever the database is.

One connection, used under a lock (thread-safe). SQL is written once, with `?` placeholders and
portable syntax; each kind (sqlite.py, postgres.py) translates what differs: placeholders, how a
write transaction starts, ids returned by inserts, column types in DDL. Every database error
becomes a StoreError that names the call that failed and the database (never its password).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from inferscale_engine.errors import StoreError


class Cursor(Protocol):
    """What a query returns (sqlite3's and psycopg's cursors both are one)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


@dataclass(frozen=True, slots=True)
class ColumnTypes:
    """Column types of one kind of database, for the schema's DDL."""

    id: str
    """An integer primary key whose values only grow and are never reused."""
    integer: str
    """A 64-bit integer."""
    blob: str
    """Bytes (token ids, embeddings)."""
    real: str
    """A double-precision float (timestamps)."""


class Database(ABC):
    """One connection to the fact database; see the module docstring.

    Reads run one statement each (autocommit); writes run inside transaction(), all or nothing.
    """

    name: str
    """The database for messages: a path, ':memory:', or a URL without its password."""
    shared: bool
    """True when other processes may write to the same database (a server database)."""
    types: ColumnTypes
    """Column types for DDL."""
    _errors: tuple[type[Exception], ...]
    """The driver's exceptions, turned into StoreError."""
    _write_hint: str
    """What to check when a write fails."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.RLock()
        self._closed = False

    # ---- what each kind implements -------------------------------------------------------
    @abstractmethod
    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        """Run one statement (`?` placeholders) and return its cursor."""

    @abstractmethod
    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per row of arguments."""

    @abstractmethod
    def insert(self, sql: str, rows: Sequence[Sequence[Any]], id_column: str) -> list[int]:
        """Run an INSERT once per row; returns the generated `id_column` values in row order."""

    @abstractmethod
    def lock_schema(self) -> None:
        """Inside the migration's transaction: keep other processes from migrating at once."""

    @abstractmethod
    def _begin(self) -> None:
        """Start a write transaction that holds the write lock it needs."""

    @abstractmethod
    def _commit(self) -> None: ...

    @abstractmethod
    def _rollback(self) -> None:
        """Roll back the open transaction, if any; never raises on a lost connection."""

    @abstractmethod
    def _ready(self) -> None:
        """Make sure the connection is usable (reconnect if the kind can)."""

    @abstractmethod
    def _disconnect(self) -> None: ...

    def _lost(self) -> bool:
        """True when the connection died, so a failed commit may have been applied."""
        return False

    def _describe(self, exc: BaseException) -> str:
        """The driver's error as text for a StoreError (a kind may hide secrets here)."""
        return str(exc).strip()

    # ---- shared --------------------------------------------------------------------------
    @contextmanager
    def transaction(self, what: str) -> Iterator[Database]:
        """One write transaction under the lock: all of the block's writes or none.

        Raises:
            StoreError: the database failed; nothing was written (or, if the connection was
                lost while committing, the message says the outcome is unknown).
        """
        with self._lock:
            self._check_open()
            committing = False
            try:
                self._ready()
                self._begin()
                try:
                    yield self
                    committing = True
                    self._commit()
                except BaseException:
                    self._rollback()
                    raise
            except self._errors as exc:
                if committing and self._lost():
                    raise StoreError(
                        f"{what} on {self.name!r}: the connection was lost while committing "
                        f"({self._describe(exc)}), so the write may or may not be stored; read "
                        "it back before retrying") from exc
                raise StoreError(f"{what} failed, nothing was written: {self._describe(exc)}; "
                                 f"{self._write_hint}") from exc

    @contextmanager
    def reading(self, what: str) -> Iterator[Database]:
        """Reads under the lock; a database error becomes a StoreError."""
        with self._lock:
            self._check_open()
            try:
                self._ready()
                yield self
            except self._errors as exc:
                raise StoreError(f"{what} failed reading {self.name!r}: "
                                 f"{self._describe(exc)}") from exc

    def close(self) -> None:
        """Close the connection (idempotent); later calls raise StoreError."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._disconnect()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the FactStore of {self.name!r} is closed; open a new FactStore")
