"""Database: the contract FactStore runs its SQL through, whatever the database is.

Thread-safe. SQL is written once, with `?` placeholders and portable syntax; each kind
(sqlite.py, postgres.py) translates what differs: placeholders, how a write transaction starts,
ids returned by inserts, column types in DDL, and how a call gets its connection (SQLite: its
one connection, under a lock; PostgreSQL: one from a pool, for the call). Every database error
becomes a StoreError that names the call that failed and the database (never its password); a
connection lost before the call did anything is a ConnectionLostError, which FactStore retries
once.
"""

from __future__ import annotations

import functools
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar

from inferscale_engine.errors import StoreError

P = ParamSpec("P")
R = TypeVar("R")


class ConnectionLostError(StoreError):
    """The connection dropped before the call committed anything: running it again is safe.

    A restart or failover of the database, or a network cut; nothing of the call was written.
    """


def retried(call: Callable[P, R]) -> Callable[P, R]:
    """The call, run once more if its connection was lost before it did anything.

    A restart or failover of PostgreSQL drops every open connection; the call that finds its
    connection dead wrote nothing (ConnectionLostError), so it runs again, once, on a checked
    connection. A second loss, or one while committing, reaches the caller as a StoreError.
    """
    @functools.wraps(call)
    def once_more(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return call(*args, **kwargs)
        except ConnectionLostError:
            return call(*args, **kwargs)
    return once_more


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
    """The fact database; see the module docstring.

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
        self._closed = False
        self._close_lock = threading.Lock()

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
    def _connection(self) -> AbstractContextManager[None]:
        """While open, this thread's statements run on one connection (re-entrant)."""

    @abstractmethod
    def _begin(self) -> None:
        """Start a write transaction that holds the write lock it needs."""

    @abstractmethod
    def _commit(self) -> None: ...

    @abstractmethod
    def _rollback(self) -> None:
        """Roll back the open transaction, if any; never raises on a lost connection."""

    @abstractmethod
    def _disconnect(self) -> None: ...

    def _lost(self) -> bool:
        """True when this thread's connection died (the database rolls its transaction back)."""
        return False

    def _describe(self, exc: BaseException) -> str:
        """The driver's error as text for a StoreError (a kind may hide secrets here)."""
        return str(exc).strip()

    # ---- shared --------------------------------------------------------------------------
    @contextmanager
    def transaction(self, what: str) -> Iterator[Database]:
        """One write transaction: all of the block's writes or none.

        Raises:
            ConnectionLostError: the connection dropped before the commit; nothing was written.
            StoreError: the database failed; nothing was written (or, if the connection was
                lost while committing, the message says the outcome is unknown).
        """
        self._check_open()
        with self._connection():
            committing = False
            try:
                self._begin()
                try:
                    yield self
                    committing = True
                    self._commit()
                except BaseException:
                    self._rollback()
                    raise
            except self._errors as exc:
                lost = self._lost()
                if committing and lost:
                    raise StoreError(
                        f"{what} on {self.name!r}: the connection was lost while committing "
                        f"({self._describe(exc)}), so the write may or may not be stored; read "
                        "it back before retrying") from exc
                error = ConnectionLostError if lost else StoreError
                raise error(f"{what} failed, nothing was written: {self._describe(exc)}; "
                            f"{self._write_hint}") from exc

    @contextmanager
    def reading(self, what: str) -> Iterator[Database]:
        """Reads on one connection; a database error becomes a StoreError.

        Raises:
            ConnectionLostError: the connection dropped (reading again is safe).
            StoreError: the database failed.
        """
        self._check_open()
        with self._connection():
            try:
                yield self
            except self._errors as exc:
                error = ConnectionLostError if self._lost() else StoreError
                raise error(f"{what} failed reading {self.name!r}: "
                            f"{self._describe(exc)}") from exc

    @contextmanager
    def snapshot(self, what: str) -> Iterator[Callable[[str, Sequence[Any]], list[Any]]]:
        """A query function whose reads together see one committed state of the database.

        The caller may run other calls between two reads (a scan that yields as it goes).
        Here each read runs alone (reading()): right for a database whose writers commit one
        at a time in id order (SQLite), where a scan paging by id misses nothing; a kind whose
        writers commit concurrently (PostgreSQL) reads one snapshot instead.
        """
        def query(sql: str, args: Sequence[Any] = ()) -> list[Any]:
            with self.reading(what) as db:
                return db.execute(sql, args).fetchall()
        yield query

    def close(self) -> None:
        """Close the database's connections (idempotent); later calls raise StoreError."""
        with self._close_lock:
            if not self._closed:
                self._closed = True
                self._disconnect()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the FactStore of {self.name!r} is closed; open a new FactStore")
