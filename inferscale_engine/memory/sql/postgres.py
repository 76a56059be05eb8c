"""PostgresDatabase: the fact store in a PostgreSQL database that several processes share.

Selected by a postgresql:// (or postgres://) URL; needs the `postgres` extra (psycopg 3).
Every write call is one transaction (READ COMMITTED); writers of one user queue on that user's
row of user_versions (schema.py), so concurrent calls of one user never interleave, and calls
of different users run in parallel. Ids come from identity columns (sequences): never reused.
A lost connection fails the call that was using it (StoreError) and is reopened by the next.

PostgreSQL text cannot hold NUL characters, which SQLite stores. So that both store the same
strings, every string parameter is escaped on the way in (U+FFFF -> U+FFFF U+FFFF,
NUL -> U+FFFF '0') and every string column unescaped on the way out; text without NUL or
U+FFFF (all real text) is stored as is.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote

from inferscale_engine.checks import check_int
from inferscale_engine.errors import ConfigError, StoreError
from inferscale_engine.memory.sql.database import ColumnTypes, Cursor, Database

if TYPE_CHECKING:
    import psycopg

CONNECT_TIMEOUT_S = 10
"""How long connecting may take, unless the URL sets connect_timeout."""
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
            ImportError: psycopg is not installed.
            StoreError: the URL is malformed or the server cannot be reached; the message
                names the host, never the password.
        """
        try:  # the optional `postgres` extra, imported only when a URL is used
            import psycopg
            from psycopg.conninfo import conninfo_to_dict
        except ImportError as exc:
            raise ImportError("a postgresql:// fact store needs psycopg 3: pip install "
                              "'inferscale-kv[postgres]'") from exc
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
        self._conn = self._connect()

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        return self._conn.execute(_placeholders(sql), _escaped(args))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self._conn.cursor() as cursor:
            cursor.executemany(_placeholders(sql), [_escaped(row) for row in rows])

    def insert(self, sql: str, rows: Sequence[Sequence[Any]], id_column: str) -> list[int]:
        if not rows:
            return []
        ids = []
        with self._conn.cursor() as cursor:  # one round trip for all rows (pipeline mode)
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
        self._conn.execute("SET LOCAL lock_timeout = 0")
        self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))

    def _begin(self) -> None:
        # Named, not the server's default: each statement sees what committed before it, so a
        # writer that waited for a user's version row goes on with that user's latest rows.
        self._conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")

    def _commit(self) -> None:
        self._conn.execute("COMMIT")

    def _rollback(self) -> None:
        if self._conn.closed:
            return  # the server rolls back a transaction whose connection died
        try:
            self._conn.execute("ROLLBACK")
        except self._errors:
            pass  # lost meanwhile: likewise rolled back by the server

    def _ready(self) -> None:
        if self._conn.closed:  # lost (server restart, network): open a new one
            self._conn = self._connect()

    def _disconnect(self) -> None:
        self._conn.close()

    def _lost(self) -> bool:
        return bool(self._conn.closed)

    def _describe(self, exc: BaseException) -> str:
        text = " ".join(str(exc).split())
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        import psycopg

        try:
            conn = psycopg.connect(self._url, autocommit=True, **self._timeout)
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to the fact database {self.name!r}: "
                             f"{self._describe(exc)}; check that the PostgreSQL server at "
                             f"{self._host} is running and reachable, and the user, password "
                             "and database name") from exc
        try:
            encoding = conn.info.parameter_status("server_encoding")
            if encoding != "UTF8":
                raise StoreError(f"the database {self.name!r} has encoding {encoding!r}; fact "
                                 "text needs UTF8: CREATE DATABASE ... ENCODING 'UTF8'")
            conn.execute(f"SET lock_timeout = {int(self._busy_timeout_ms)}")
            conn.row_factory = _unescaped_rows
        except BaseException:
            conn.close()
            raise
        return conn


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
