"""FactStore: facts, conversation turns (turns.py) and fact history (history.py), in SQLite.

Facts (text, token ids, embedding, metadata) are the source of truth; fact KV and the retrieval
index are caches rebuilt from them. Each write call is ONE transaction (all or nothing), in WAL
mode with synchronous=FULL by default: once a call returns, its rows survive a kill.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, cast

from inferscale_engine.checks import (
    check_fact_ids,
    check_int,
    check_list,
    check_text,
    check_user_id,
)
from inferscale_engine.errors import (
    ConfigError,
    FactNotFoundError,
    InvalidFactError,
    InvalidTurnError,
    StoreError,
)
from inferscale_engine.facts import FactId
from inferscale_engine.memory import history
from inferscale_engine.memory import turns as turn_log
from inferscale_engine.memory.records import (
    StoredFact,
    Turn,
    embedding_blob,
    fact_from_row,
    metadata_json,
    token_blob,
    turn_rows,
)

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_IDS_PER_QUERY = 500  # stays under SQLITE_MAX_VARIABLE_NUMBER of every SQLite build (999)
_FACT_COLUMNS = ("fact_id, user_id, session_id, text, token_ids, embedding, metadata, "
                 "created_at, updated_at")
_FINGERPRINT_KEY = "fingerprint"
_VERSION_KEY = "schema_version"


def _create_v1(conn: sqlite3.Connection) -> None:
    conn.execute("""CREATE TABLE facts (
        fact_id INTEGER PRIMARY KEY AUTOINCREMENT, user_id TEXT NOT NULL, session_id TEXT,
        text TEXT NOT NULL, token_ids BLOB NOT NULL, embedding BLOB NOT NULL,
        metadata TEXT NOT NULL DEFAULT '{}', created_at REAL NOT NULL, updated_at REAL NOT NULL,
        content_hash TEXT NOT NULL)""")
    conn.execute("CREATE INDEX facts_user_id ON facts (user_id)")
    conn.execute("""CREATE TABLE turns (
        turn_id INTEGER PRIMARY KEY AUTOINCREMENT, user_id TEXT NOT NULL, session_id TEXT,
        role TEXT NOT NULL, content TEXT NOT NULL, created_at REAL NOT NULL)""")
    conn.execute("CREATE INDEX turns_session ON turns (user_id, session_id, turn_id)")


def _nfc_user_ids_v2(conn: sqlite3.Connection) -> None:
    """User ids are NFC from this version on: two spellings of one name become one user."""
    conn.create_function("inferscale_nfc", 1, lambda v: unicodedata.normalize("NFC", v),
                         deterministic=True)
    for table in ("facts", "turns"):
        conn.execute(f"UPDATE {table} SET user_id = inferscale_nfc(user_id) "
                     "WHERE user_id != inferscale_nfc(user_id)")


# Migration hook: _MIGRATIONS[v] upgrades schema version v to v + 1 inside the opening
# transaction; version 0 is an empty file. Append a step to change the schema, never edit one.
_MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_create_v1, _nfc_user_ids_v2,
                                                           history.create_v3]


class FactStore:
    """Durable facts and turns of every user in one SQLite file. Thread-safe.

    AUTOINCREMENT keeps fact ids unique forever: a deleted id is never reused, so a stale
    handle or KV entry can never name a newer fact.
    """

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "FULL",
                 busy_timeout_ms: int = 5000) -> None:
        """Open (creating and migrating if needed) the database at `path`.

        Args:
            path: database file, or ":memory:" (tests).
            synchronous: SQLite synchronous level. FULL (default) makes every commit survive a
                power loss; NORMAL only a crash of the process; EXTRA also syncs the folder.
            busy_timeout_ms: how long a write waits for another connection's lock.
        """
        if not isinstance(synchronous, str) or synchronous.upper() not in _SYNCHRONOUS:
            raise ConfigError(f"synchronous={synchronous!r} is not a SQLite level; use one of "
                              f"{', '.join(_SYNCHRONOUS)} (FULL keeps commits on power loss)")
        check_int(busy_timeout_ms, "busy_timeout_ms", 0, ConfigError)
        self.path = os.fspath(path)
        self._lock = threading.RLock()
        try:
            self._conn: sqlite3.Connection | None = sqlite3.connect(
                self.path, timeout=busy_timeout_ms / 1000, check_same_thread=False,
                isolation_level=None)  # autocommit: transactions are explicit BEGIN/COMMIT
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open fact database {self.path!r}: {exc}; check that its "
                             "folder exists and is writable") from exc
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
            self._conn.execute("PRAGMA journal_mode = WAL")  # ':memory:' stays 'memory'
            self._conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
            self._conn.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except BaseException as exc:
            self._conn.close()
            self._conn = None
            if isinstance(exc, sqlite3.Error):
                raise StoreError(f"cannot open fact database {self.path!r}: {exc}; is it an "
                                 "InferScale database (not another file)?") from exc
            raise

    # ---- facts -------------------------------------------------------------------------
    def add_facts(self, *, user_id: str, texts: Sequence[str],
                  token_ids: Sequence[Sequence[int]], embeddings: Sequence[Any],
                  metadata: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
                  session_id: str | None = None,
                  turns: Sequence[tuple[str, str]] = ()) -> list[FactId]:
        """Store facts (and the turns they came from) in one transaction; returns fact ids.

        Args:
            user_id: owner of the facts.
            texts: fact texts (non-empty strings).
            token_ids: per fact, its token ids (ints in [0, 2**31)).
            embeddings: per fact, a float vector [dim] (list, numpy, torch or float32 bytes);
                or one [num_facts, dim] matrix.
            metadata: None, one JSON-serializable dict for every fact, or one dict per fact.
            session_id: conversation the facts came from, if any.
            turns: (role, content) messages appended to the session in the same transaction
                (see add_turns).

        Raises:
            InvalidUserIdError / InvalidFactError / InvalidTurnError: an argument is invalid;
                nothing is stored.
            StoreError: the database write failed; nothing is stored.
        """
        user_id = check_user_id(user_id)
        texts = check_list(texts, "texts", InvalidFactError)
        num_facts = len(texts)
        texts = [check_text(t, f"texts[{i}]", InvalidFactError, strip=False)
                 for i, t in enumerate(texts)]
        token_blobs = [token_blob(t, f"token_ids[{i}]") for i, t in
                       enumerate(check_list(token_ids, "token_ids", InvalidFactError, num_facts))]
        embedding_blobs = [embedding_blob(e, f"embeddings[{i}]") for i, e in
                           enumerate(check_list(embeddings, "embeddings", InvalidFactError,
                                                 num_facts))]
        if len({len(b) for b in embedding_blobs}) > 1:
            dims = sorted({len(b) // 4 for b in embedding_blobs})
            raise InvalidFactError(f"embeddings have different dimensions {dims}; encode every "
                                   "fact with the same embedder")
        metadata_rows = metadata_json(metadata, num_facts)
        if session_id is not None:
            session_id = check_text(session_id, "session_id", InvalidFactError, strip=False)
        turn_list = turn_rows(turns)
        now = time.time()
        with self._transaction("add_facts") as conn:
            turn_log.insert(conn, user_id, session_id, turn_list, now)
            ids = [FactId(cast(int, conn.execute(
                "INSERT INTO facts (user_id, session_id, text, token_ids, embedding, metadata, "
                "created_at, updated_at, content_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (user_id, session_id, text, tokens, embedding, meta, now, now, _hash(text)),
            ).lastrowid)) for text, tokens, embedding, meta in
                zip(texts, token_blobs, embedding_blobs, metadata_rows, strict=True)]
            history.record(conn, user_id, ((i, "ADD", None, t) for i, t in zip(ids, texts)), now)
            return ids

    def get(self, *, user_id: str, fact_ids: Sequence[int]) -> list[StoredFact]:
        """The user's facts with these ids, in the order asked.

        Raises:
            FactNotFoundError: an id is unknown, deleted, or another user's.
        """
        user_id = check_user_id(user_id)
        ids = check_fact_ids(fact_ids)
        with self._reading("get") as conn:
            found = {row[0]: fact_from_row(row)
                     for row in _select_facts(conn, _FACT_COLUMNS, user_id, ids)}
        _raise_missing(user_id, [i for i in ids if i not in found])
        return [found[i] for i in ids]

    def get_all(self, *, user_id: str) -> list[StoredFact]:
        """All facts of a user, oldest first (by fact id, which only grows)."""
        user_id = check_user_id(user_id)
        with self._reading("get_all") as conn:
            return [fact_from_row(row) for row in conn.execute(
                f"SELECT {_FACT_COLUMNS} FROM facts WHERE user_id = ? ORDER BY fact_id",
                (user_id,))]

    def update(self, *, user_id: str, fact_id: int, text: str, token_ids: Sequence[int],
               embedding: Any, metadata: Mapping[str, Any] | None = None) -> StoredFact:
        """Replace a fact's text, token ids and embedding; metadata=None keeps the old one.

        Raises:
            FactNotFoundError: the id is unknown or another user's; nothing changes.
        """
        user_id = check_user_id(user_id)
        (fact_id,) = check_fact_ids([fact_id])
        text = check_text(text, "text", InvalidFactError, strip=False)
        tokens = token_blob(token_ids, "token_ids")
        vector = embedding_blob(embedding, "embedding")
        meta = None if metadata is None else metadata_json(metadata, 1)[0]
        with self._transaction("update") as conn:
            before = conn.execute("SELECT text FROM facts WHERE fact_id = ? AND user_id = ?",
                                  (fact_id, user_id)).fetchone()
            cursor = conn.execute(
                "UPDATE facts SET text = ?, token_ids = ?, embedding = ?, content_hash = ?, "
                "metadata = COALESCE(?, metadata), updated_at = ? WHERE fact_id = ? AND "
                "user_id = ?", (text, tokens, vector, _hash(text), meta, time.time(), fact_id,
                                user_id))
            if cursor.rowcount == 0:
                _raise_missing(user_id, [fact_id])
            row = conn.execute(f"SELECT {_FACT_COLUMNS} FROM facts WHERE fact_id = ?",
                               (fact_id,)).fetchone()
            history.record(conn, user_id, [(fact_id, "UPDATE", before[0], text)], row[8])
        return fact_from_row(row)

    def delete(self, *, user_id: str, fact_ids: Sequence[int]) -> None:
        """Delete the user's facts, all or none (FactNotFoundError: an unknown or foreign id)."""
        user_id = check_user_id(user_id)
        ids = list(dict.fromkeys(check_fact_ids(fact_ids)))
        now = time.time()
        with self._transaction("delete") as conn:
            existing = dict(_select_facts(conn, "fact_id, text", user_id, ids))
            _raise_missing(user_id, [i for i in ids if i not in existing])
            conn.executemany("DELETE FROM facts WHERE fact_id = ?", [(i,) for i in ids])
            history.record(conn, user_id, [(i, "DELETE", existing[i], None) for i in ids], now)

    def reset(self, *, user_id: str) -> list[FactId]:
        """Delete all facts, turns and history of a user; returns the deleted fact ids."""
        user_id = check_user_id(user_id)
        with self._transaction("reset") as conn:
            fact_ids = [FactId(r[0]) for r in conn.execute(
                "SELECT fact_id FROM facts WHERE user_id = ? ORDER BY fact_id", (user_id,))]
            conn.execute("DELETE FROM facts WHERE user_id = ?", (user_id,))
            conn.execute("DELETE FROM turns WHERE user_id = ?", (user_id,))
            history.erase_user(conn, user_id)
        return fact_ids

    def history(self, *, user_id: str, fact_id: int) -> list[history.HistoryEvent]:
        """A fact's ADD / UPDATE / DELETE events, oldest first ([] if the user never had it)."""
        user_id = check_user_id(user_id)
        (fact_id,) = check_fact_ids([fact_id])
        with self._reading("history") as conn:
            return history.read(conn, user_id, fact_id)

    # ---- turns -------------------------------------------------------------------------
    def add_turns(self, *, user_id: str, session_id: str | None,
                  turns: Sequence[tuple[str, str]]) -> list[int]:
        """Append (role, content) messages to a session in one transaction; returns turn ids."""
        user_id = check_user_id(user_id)
        if session_id is not None:
            session_id = check_text(session_id, "session_id", InvalidTurnError, strip=False)
        rows = turn_rows(turns)
        now = time.time()
        with self._transaction("add_turns") as conn:
            return turn_log.insert(conn, user_id, session_id, rows, now)

    def recent_turns(self, *, user_id: str, session_id: str | None,
                     limit: int = 20) -> list[Turn]:
        """The last `limit` turns of a session, oldest first."""
        user_id = check_user_id(user_id)
        check_int(limit, "limit", 0, InvalidTurnError)
        with self._reading("recent_turns") as conn:
            return turn_log.recent(conn, user_id, session_id, limit)

    def sessions(self, *, user_id: str) -> list[turn_log.Session]:
        """Every session of a user with turns (None: turns without one), latest first."""
        user_id = check_user_id(user_id)
        with self._reading("sessions") as conn:
            return turn_log.sessions(conn, user_id)

    def recent_facts(self, *, user_id: str, limit: int = 20,
                     session_id: str | None = None) -> list[StoredFact]:
        """The user's last `limit` facts (of one session, if given), oldest first."""
        user_id = check_user_id(user_id)
        check_int(limit, "limit", 0, InvalidFactError)
        where, args = ("AND session_id = ?", (session_id,)) if session_id is not None else ("", ())
        with self._reading("recent_facts") as conn:
            rows = conn.execute(f"SELECT {_FACT_COLUMNS} FROM facts WHERE user_id = ? {where} "
                                "ORDER BY fact_id DESC LIMIT ?",
                                (user_id, *args, limit)).fetchall()
        return [fact_from_row(row) for row in reversed(rows)]

    def owner(self, fact_id: int) -> str | None:
        """The user a fact id belongs (or, deleted, belonged) to, or None (no such fact)."""
        (fact_id,) = check_fact_ids([fact_id], "fact_id")
        with self._reading("owner") as conn:
            row = conn.execute("SELECT user_id FROM facts WHERE fact_id = ? UNION ALL SELECT "
                               "user_id FROM history WHERE fact_id = ?", (fact_id, fact_id)
                               ).fetchone()
        return None if row is None else str(row[0])

    # ---- whole store -------------------------------------------------------------------
    def users(self) -> list[str]:
        """Every user with facts or turns, sorted."""
        with self._reading("users") as conn:
            return [r[0] for r in conn.execute(
                "SELECT user_id FROM facts UNION SELECT user_id FROM turns ORDER BY 1")]

    def count(self, *, user_id: str | None = None) -> int:
        """Number of facts of one user, or of all users when user_id is None."""
        with self._reading("count") as conn:
            if user_id is None:
                return conn.execute("SELECT COUNT(*) FROM facts").fetchone()[0]
            return conn.execute("SELECT COUNT(*) FROM facts WHERE user_id = ?",
                                (check_user_id(user_id),)).fetchone()[0]

    def iter_all(self, batch_size: int = 256) -> Iterator[list[StoredFact]]:
        """Every fact of every user in id order, in batches (to rebuild KV and the index).

        The lock is held per batch only, so writes from other threads may interleave; facts
        added meanwhile with larger ids are yielded too.
        """
        check_int(batch_size, "batch_size", 1, ConfigError)
        last_id = 0
        while True:
            with self._reading("iter_all") as conn:
                batch = [fact_from_row(row) for row in conn.execute(
                    f"SELECT {_FACT_COLUMNS} FROM facts WHERE fact_id > ? ORDER BY fact_id "
                    "LIMIT ?", (last_id, batch_size))]
            if not batch:
                return
            last_id = batch[-1].fact_id
            yield batch

    def fingerprint(self) -> str | None:
        """The stored model fingerprint (model + tokenizer identity), or None if never set."""
        with self._reading("fingerprint") as conn:
            return _meta(conn, _FINGERPRINT_KEY)

    def set_fingerprint(self, value: str) -> None:
        """Record the fingerprint of the model and tokenizer the stored facts were made with."""
        value = check_text(value, "fingerprint", ConfigError, strip=False)
        with self._transaction("set_fingerprint") as conn:
            _set_meta(conn, _FINGERPRINT_KEY, value)

    @property
    def schema_version(self) -> int:
        """Schema version of the open database."""
        with self._reading("schema_version") as conn:
            return int(_meta(conn, _VERSION_KEY) or 0)

    def close(self) -> None:
        """Close the database (idempotent); later calls raise StoreError."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> FactStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- internals ---------------------------------------------------------------------
    def _migrate(self) -> None:
        with self._transaction("schema migration") as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, "
                         "value TEXT NOT NULL)")
            version = int(_meta(conn, _VERSION_KEY) or 0)
            if version > len(_MIGRATIONS):
                raise StoreError(f"{self.path!r} has schema version {version}, newer than this "
                                 f"InferScale supports ({len(_MIGRATIONS)}); upgrade inferscale")
            for step in _MIGRATIONS[version:]:
                step(conn)
            _set_meta(conn, _VERSION_KEY, str(len(_MIGRATIONS)))

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"the FactStore of {self.path!r} is closed; open a new FactStore")
        return self._conn

    @contextmanager
    def _transaction(self, what: str) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction under the lock: all of the block's writes or none."""
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE")  # takes the write lock now: no upgrade deadlock
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise StoreError(f"{what} failed, nothing was written: {exc}; check disk space "
                                 f"and that no other process holds {self.path!r} locked") from exc

    @contextmanager
    def _reading(self, what: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._connection()
            try:
                yield conn
            except sqlite3.Error as exc:
                raise StoreError(f"{what} failed reading {self.path!r}: {exc}") from exc


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _select_facts(conn: sqlite3.Connection, columns: str, user_id: str,
                  fact_ids: Sequence[int]) -> Iterator[tuple[Any, ...]]:
    for start in range(0, len(fact_ids), _IDS_PER_QUERY):
        chunk = fact_ids[start:start + _IDS_PER_QUERY]
        yield from conn.execute(f"SELECT {columns} FROM facts WHERE user_id = ? AND fact_id IN "
                                f"({','.join('?' * len(chunk))})", (user_id, *chunk))


def _meta(conn: sqlite3.Connection, key: str) -> str | None:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else row[0]


def _set_meta(conn: sqlite3.Connection, key: str, value: str) -> None:
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))


def _raise_missing(user_id: str, missing: list[int]) -> None:
    if missing:
        raise FactNotFoundError(f"user {user_id!r} has no fact with id(s) "
                                f"{list(dict.fromkeys(missing))}: deleted, never added, or "
                                "another user's; list the user's facts with get_all()")


