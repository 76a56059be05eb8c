"""PostgresDatabase: the fact store in a PostgreSQL database that several processes share.

Selected by a postgresql:// (or postgres://) URL; needs the `postgres` extra (psycopg 3 and
psycopg_pool). Every write call is one transaction (READ COMMITTED); writers of one user queue
on that user's row of user_versions (schema.py), so concurrent calls of one user never
interleave, and calls of different users run in parallel. Ids come from identity columns
(sequences): never reused.

Calls take a connection from a pool (at most MAX_CONNECTIONS) for their duration, so calls of
several threads run at once. A connection lost before its call committed (a restart or
failover of the database, a network cut) fails the call with ConnectionLostError, which
FactStore runs again once: the next connection is checked first (a new one is opened; if the
server is still unreachable, the call fails at once with the reason), so the first call after
a restart succeeds. A scan (snapshot()) reads one REPEATABLE READ snapshot on a connection of
its own.

PostgreSQL text cannot hold NUL characters, which SQLite stores. So that both store the same
strings, every string parameter is escaped on the way in (U+FFFF -> U+FFFF U+FFFF,
NUL -> U+FFFF '0') and every string column unescaped on the way out; text without NUL or
U+FFFF (all real text) is stored as is.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote

from inferscale_engine.checks import check_int
from inferscale_engine.errors import ConfigError, StoreError
from inferscale_engine.memory.store.sql.database import ColumnTypes, Cursor, Database

if TYPE_CHECKING:
    import psycopg
    import psycopg_pool

CONNECT_TIMEOUT_S = 10
"""How long connecting may take, unless the URL sets connect_timeout."""
MAX_CONNECTIONS = 4
"""Connections one database object keeps at most (calls beyond them wait for one)."""
WAIT_S = 30.0
"""How long a call waits for a free connection when all MAX_CONNECTIONS are busy."""
_SCHEMA_LOCK = 0x696E666572736361  # pg_advisory_xact_lock key of schema migrations ("infersca")
_ESCAPE = "\uffff"
_UNESCAPE = re.compile("\uffff([\uffff0])")


class PostgresDatabase(Database):
    """A PostgreSQL database named by a URL; see the module docstring."""

    shared = True
    types = ColumnTypes(id="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", integer="BIGINT",
                        blob="BYTEA", real="DOUBLE PRECISION")

    def __init__(self, url: str, *, busy_timeout_ms: int = 5000) -> None:
        """Connect to the database at `url`.

        Args:
            url: postgresql://user:password@host:port/dbname?options (libpq's URL format).
            busy_timeout_ms: how long a write waits for another connection's lock
                (PostgreSQL's lock_timeout); 0 waits forever.

        Raises:
            ImportError: psycopg or psycopg_pool is not installed.
            StoreError: the URL is malformed or the server cannot be reached; the message
                names the host, never the password.
        """
        try:  # the optional `postgres` extra, imported only when a URL is used
            import psycopg
            import psycopg_pool  # noqa: F401 - the pool's, checked here: one message for both
            from psycopg.conninfo import conninfo_to_dict
        except ImportError as exc:
            raise ImportError("a postgresql:// fact store needs psycopg 3 and psycopg_pool: "
                              "pip install 'inferscale-kv[postgres]'") from exc
        check_int(busy_timeout_ms, "busy_timeout_ms", 0, ConfigError)
        super().__init__(redact(url))
        self._url = url
        self._secrets = _secrets(url)
        self._busy_timeout_ms = busy_timeout_ms
        self._errors = (psycopg.Error,)
        try:
            params = conninfo_to_dict(url)
        except psycopg.Error as exc:
            raise StoreError(f"{self.name!r} is not a valid PostgreSQL URL: "
                             f"{self._describe(exc)}; the form is "
                             "postgresql://user:password@host:port/dbname") from exc
        self._host = f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}"
        self._timeout: dict[str, Any] = (
            {} if "connect_timeout" in params else {"connect_timeout": CONNECT_TIMEOUT_S})
        self._write_hint = f"check that the PostgreSQL server at {self._host} is up and reachable"
        self._local = threading.local()
        """`conn`: the connection this thread's call holds (None between calls)."""
        self._pool_lock = threading.Lock()
        self._suspect = False
        """A connection was lost: check the server before the next call (and renew the pool)."""
        self._connect().close()  # an unreachable server or a bad database fails here, clearly
        self._pool: psycopg_pool.ConnectionPool[Any] = self._new_pool()

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        return _run(self._held(), sql, args)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self._held().cursor() as cursor:
            cursor.executemany(_placeholders(sql), [_escaped(row) for row in rows])

    def insert(self, sql: str, rows: Sequence[Sequence[Any]], id_column: str) -> list[int]:
        if not rows:
            return []
        ids = []
        with self._held().cursor() as cursor:  # one round trip for all rows (pipeline mode)
            cursor.executemany(_placeholders(f"{sql} RETURNING {id_column}"),
                               [_escaped(row) for row in rows], returning=True)
            while True:
                (new_id,) = cast(tuple[int], cursor.fetchone())
                ids.append(int(new_id))
                if not cursor.nextset():
                    return ids

    def lock_schema(self) -> None:
        # Replicas starting together queue here; the lock is released at commit. Waiting for
        # another process's migration is right however long it takes, hence no lock_timeout.
        self._held().execute("SET LOCAL lock_timeout = 0")
        self._held().execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))

    @contextmanager
    def snapshot(self, what: str) -> Iterator[Callable[[str, Sequence[Any]], list[Any]]]:
        """Reads that all see one snapshot (REPEATABLE READ), on a connection of their own.

        Writers commit concurrently here, not in id order, so a scan paging by id across
        separate reads could pass a fact that commits later with a smaller id, yet yield facts
        committed after it. Inside one snapshot every read sees exactly what was committed
        when the first one ran; what commits later moves its user's version (schema.py).
        """
        from psycopg.pq import TransactionStatus

        self._check_open()
        pool, conn = self._snapshot_connection(what)

        def query(sql: str, args: Sequence[Any] = ()) -> list[Any]:
            return _run(conn, sql, args).fetchall()

        try:
            yield query
        except self._errors as exc:
            self._suspect = self._suspect or _broken(conn)
            raise StoreError(f"{what} failed reading {self.name!r}: {self._describe(exc)}; "
                             f"{self._write_hint}, then start it again") from exc
        finally:  # done, failed or abandoned: end the read-only transaction (nothing to commit)
            if not _broken(conn) and conn.info.transaction_status != TransactionStatus.IDLE:
                try:
                    conn.execute("ROLLBACK")
                except self._errors:
                    pass  # lost meanwhile: the pool replaces it
            pool.putconn(conn)

    def _snapshot_connection(self, what: str) -> tuple[psycopg_pool.ConnectionPool[Any],
                                                       psycopg.Connection[tuple[Any, ...]]]:
        """A connection in a read-only REPEATABLE READ transaction (once more if it dropped)."""
        for attempt in range(2):
            pool, conn = self._checkout()
            try:
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                return pool, conn
            except self._errors as exc:
                pool.putconn(conn)
                if attempt or not _broken(conn):
                    raise StoreError(f"{what} failed reading {self.name!r}: "
                                     f"{self._describe(exc)}; {self._write_hint}") from exc
                self._suspect = True  # dropped (a restart): once more, on a checked connection
        raise AssertionError("the loop returns or raises")

    # ---- connections ---------------------------------------------------------------------
    @contextmanager
    def _connection(self) -> Iterator[None]:
        if getattr(self._local, "conn", None) is not None:
            yield  # a read inside this thread's transaction: the same connection
            return
        pool, conn = self._checkout()
        self._local.conn = conn
        try:
            yield
        finally:
            self._local.conn = None
            pool.putconn(conn)  # a broken one is replaced by the pool

    def _held(self) -> psycopg.Connection[tuple[Any, ...]]:
        conn = getattr(self._local, "conn", None)
        assert conn is not None, "statements run inside transaction() or reading()"
        return cast("psycopg.Connection[tuple[Any, ...]]", conn)

    def _checkout(self) -> tuple[psycopg_pool.ConnectionPool[Any],
                                 psycopg.Connection[tuple[Any, ...]]]:
        """A connection from the pool (after a lost one, from a new pool on a checked server).

        Raises:
            StoreError: the server cannot be reached (the message says why), or every
                connection stayed busy for WAIT_S.
        """
        import psycopg_pool

        with self._pool_lock:
            if self._suspect:  # the server may have restarted: every pooled connection is dead
                self._probe()  # still unreachable: StoreError now, with the reason
                old, self._pool = self._pool, self._new_pool()
                old.close(timeout=0)  # connections in use are closed when they come back
                self._suspect = False
            pool = self._pool
        try:
            return pool, pool.getconn(timeout=WAIT_S)
        except psycopg_pool.PoolClosed:  # renewed by another thread meanwhile
            self._check_open()
            return self._checkout()
        except psycopg_pool.PoolTimeout as exc:
            self._probe()  # the server went away: StoreError with the reason
            raise StoreError(f"no free connection to {self.name!r} for {WAIT_S:.0f} s: all "
                             f"{MAX_CONNECTIONS} are busy; retry later") from exc

    def _probe(self) -> None:
        """Connect once, to see that the server answers (StoreError with the reason if not)."""
        try:
            self._connect().close()
        except StoreError:
            self._suspect = True
            raise

    def _new_pool(self) -> psycopg_pool.ConnectionPool[Any]:
        import psycopg_pool

        pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
            self._url, min_size=1, max_size=MAX_CONNECTIONS, open=False, timeout=WAIT_S,
            kwargs={"autocommit": True, **self._timeout}, configure=self._configure,
            name=f"inferscale-facts-{self._host}")
        pool.open(wait=False)
        return pool

    def _begin(self) -> None:
        # Named, not the server's default: each statement sees what committed before it, so a
        # writer that waited for a user's version row goes on with that user's latest rows.
        self._held().execute("BEGIN ISOLATION LEVEL READ COMMITTED")

    def _commit(self) -> None:
        self._held().execute("COMMIT")

    def _rollback(self) -> None:
        conn = self._held()
        if _broken(conn):
            return  # the server rolls back a transaction whose connection died
        try:
            conn.execute("ROLLBACK")
        except self._errors:
            pass  # lost meanwhile: likewise rolled back by the server

    def _disconnect(self) -> None:
        self._pool.close()

    def _lost(self) -> bool:
        lost = _broken(self._held())
        self._suspect = self._suspect or lost
        return lost

    def _describe(self, exc: BaseException) -> str:
        text = " ".join(str(exc).split())
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        """A new connection, configured (checks that the server answers and suits us)."""
        import psycopg

        try:
            conn = psycopg.connect(self._url, autocommit=True, **self._timeout)
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to the fact database {self.name!r}: "
                             f"{self._describe(exc)}; check that the PostgreSQL server at "
                             f"{self._host} is running and reachable, and the user, password "
                             "and database name") from exc
        try:
            self._configure(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _configure(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        encoding = conn.info.parameter_status("server_encoding")
        if encoding != "UTF8":
            raise StoreError(f"the database {self.name!r} has encoding {encoding!r}; fact "
                             "text needs UTF8: CREATE DATABASE ... ENCODING 'UTF8'")
        conn.execute(f"SET lock_timeout = {int(self._busy_timeout_ms)}")
        conn.row_factory = _unescaped_rows


def _run(conn: psycopg.Connection[tuple[Any, ...]], sql: str, args: Sequence[Any]) -> Cursor:
    return conn.execute(_placeholders(sql), _escaped(args))


def _broken(conn: psycopg.Connection[tuple[Any, ...]]) -> bool:
    """True when the connection died (psycopg marks it so after the failed statement)."""
    return bool(conn.closed or conn.broken)


def is_postgres_url(target: str) -> bool:
    """True for a postgresql:// or postgres:// URL."""
    return target.lower().startswith(("postgresql://", "postgres://"))


def redact(url: str) -> str:
    """`url` with its password (in the user part or a password= parameter) shown as ***."""
    parts, last = [], 0
    for start, end in _password_spans(url):
        parts += [url[last:start], "***"]
        last = end
    return "".join(parts) + url[last:]


def _secrets(url: str) -> list[str]:
    """The passwords in `url`, as written and percent-decoded (to scrub from driver errors)."""
    found = {text for start, end in _password_spans(url)
             for text in (url[start:end], unquote(url[start:end])) if text}
    return sorted(found, key=len, reverse=True)


def _password_spans(url: str) -> list[tuple[int, int]]:
    """Where `url` holds a password: user:PASSWORD@host, and ?password=PASSWORD values."""
    begin = url.find("://") + 3
    query_at = url.find("?", begin)
    at = url.rfind("@", begin, query_at if query_at >= 0 else len(url))
    colon = url.find(":", begin, at) if at >= 0 else -1
    spans = [(colon + 1, at)] if colon >= 0 else []
    return spans + [m.span(1) for m in re.finditer(r"(?i)[?&]password=([^&]*)", url)]


@functools.lru_cache(maxsize=256)
def _placeholders(sql: str) -> str:
    """`?` placeholders as psycopg's `%s` (and a literal % doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


def _escape(text: str) -> str:
    if "\x00" not in text and _ESCAPE not in text:
        return text
    return text.replace(_ESCAPE, _ESCAPE * 2).replace("\x00", _ESCAPE + "0")


def _unescape(text: str) -> str:
    return _UNESCAPE.sub(lambda m: _ESCAPE if m.group(1) == _ESCAPE else "\x00", text)


def _escaped(args: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(_escape(a) if isinstance(a, str) else a for a in args)


def _unescaped_rows(cursor: Any) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """A psycopg row factory: rows as tuples, their strings unescaped."""
    def make_row(values: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(_unescape(v) if isinstance(v, str) and _ESCAPE in v else v
                     for v in values)
    return cast(Callable[[Sequence[Any]], tuple[Any, ...]], make_row)
