"""FactStore: facts and conversation turns, durable in SQLite.

Facts (text, token ids, embedding, metadata) are the source of truth; fact KV and the retrieval
index are caches rebuilt from them (DESIGN.md invariant 8). Each write call is ONE transaction
(all or nothing), committed in WAL mode with synchronous=FULL by default: once a call returns,
its rows survive a kill of the process and, with FULL, a power loss.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from inferscale_engine.checks import check_user_id
from inferscale_engine.errors import (
    ConfigError,
    FactNotFoundError,
    InvalidFactError,
    InvalidTurnError,
    StoreError,
)
from inferscale_engine.facts import Fact, FactId

_TOKEN_DTYPE = np.dtype("<i4")
_EMBEDDING_DTYPE = np.dtype("<f4")
_MAX_TOKEN_ID = 2**31 - 1
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_IDS_PER_QUERY = 500  # stays under SQLITE_MAX_VARIABLE_NUMBER of every SQLite build (999)
_FACT_COLUMNS = ("fact_id, user_id, session_id, text, token_ids, embedding, metadata, "
                 "created_at, updated_at")
_TURN_COLUMNS = "turn_id, user_id, session_id, role, content, created_at"
_FINGERPRINT_KEY = "fingerprint"
_VERSION_KEY = "schema_version"


@dataclass(frozen=True, slots=True)
class StoredFact:
    """One fact as stored: everything needed to rebuild its KV and its index entry."""

    fact_id: FactId
    user_id: str
    session_id: str | None
    text: str
    token_ids: tuple[int, ...]
    embedding: bytes
    """Little-endian float32 bytes (immutable, so the record compares with ==); see
    embedding_array()."""
    metadata: dict[str, Any]
    created_at: float
    """Seconds since the epoch (time.time())."""
    updated_at: float

    def embedding_array(self) -> np.ndarray:
        """The embedding as a read-only float32 vector [dim] (a view, no copy)."""
        return np.frombuffer(self.embedding, dtype=_EMBEDDING_DTYPE)

    def to_fact(self) -> Fact:
        """The app-facing Fact (id, user, text, token ids)."""
        return Fact(self.fact_id, self.user_id, self.text, self.token_ids)


@dataclass(frozen=True, slots=True)
class Turn:
    """One stored conversation message."""

    turn_id: int
    user_id: str
    session_id: str | None
    role: str
    content: str
    created_at: float


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
_MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_create_v1, _nfc_user_ids_v2]


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
        _check_int(busy_timeout_ms, "busy_timeout_ms", 0, ConfigError)
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
        texts = _check_list(texts, "texts", InvalidFactError)
        num_facts = len(texts)
        texts = [_check_str(t, f"texts[{i}]", InvalidFactError) for i, t in enumerate(texts)]
        token_blobs = [_token_blob(t, f"token_ids[{i}]") for i, t in
                       enumerate(_check_list(token_ids, "token_ids", InvalidFactError, num_facts))]
        embedding_blobs = [_embedding_blob(e, f"embeddings[{i}]") for i, e in
                           enumerate(_check_list(embeddings, "embeddings", InvalidFactError,
                                                 num_facts))]
        if len({len(b) for b in embedding_blobs}) > 1:
            dims = sorted({len(b) // 4 for b in embedding_blobs})
            raise InvalidFactError(f"embeddings have different dimensions {dims}; encode every "
                                   "fact with the same embedder")
        metadata_json = _metadata_json(metadata, num_facts)
        if session_id is not None:
            session_id = _check_str(session_id, "session_id", InvalidFactError)
        turn_rows = _turn_rows(turns)
        now = time.time()
        with self._transaction("add_facts") as conn:
            _insert_turns(conn, user_id, session_id, turn_rows, now)
            return [FactId(cast(int, conn.execute(
                "INSERT INTO facts (user_id, session_id, text, token_ids, embedding, metadata, "
                "created_at, updated_at, content_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (user_id, session_id, text, tokens, embedding, meta, now, now, _hash(text)),
            ).lastrowid)) for text, tokens, embedding, meta in
                zip(texts, token_blobs, embedding_blobs, metadata_json, strict=True)]

    def get(self, *, user_id: str, fact_ids: Sequence[int]) -> list[StoredFact]:
        """The user's facts with these ids, in the order asked.

        Raises:
            FactNotFoundError: an id is unknown, deleted, or another user's.
        """
        user_id = check_user_id(user_id)
        ids = _check_fact_ids(fact_ids)
        with self._reading("get") as conn:
            found = {row[0]: _fact_from_row(row)
                     for row in _select_facts(conn, _FACT_COLUMNS, user_id, ids)}
        _raise_missing(user_id, [i for i in ids if i not in found])
        return [found[i] for i in ids]

    def get_all(self, *, user_id: str) -> list[StoredFact]:
        """All facts of a user, oldest first (by fact id, which only grows)."""
        user_id = check_user_id(user_id)
        with self._reading("get_all") as conn:
            return [_fact_from_row(row) for row in conn.execute(
                f"SELECT {_FACT_COLUMNS} FROM facts WHERE user_id = ? ORDER BY fact_id",
                (user_id,))]

    def update(self, *, user_id: str, fact_id: int, text: str, token_ids: Sequence[int],
               embedding: Any, metadata: Mapping[str, Any] | None = None) -> StoredFact:
        """Replace a fact's text, token ids and embedding; metadata=None keeps the old one.

        Raises:
            FactNotFoundError: the id is unknown or another user's; nothing changes.
        """
        user_id = check_user_id(user_id)
        (fact_id,) = _check_fact_ids([fact_id])
        text = _check_str(text, "text", InvalidFactError)
        tokens = _token_blob(token_ids, "token_ids")
        vector = _embedding_blob(embedding, "embedding")
        meta = None if metadata is None else _metadata_json(metadata, 1)[0]
        with self._transaction("update") as conn:
            cursor = conn.execute(
                "UPDATE facts SET text = ?, token_ids = ?, embedding = ?, content_hash = ?, "
                "metadata = COALESCE(?, metadata), updated_at = ? WHERE fact_id = ? AND "
                "user_id = ?", (text, tokens, vector, _hash(text), meta, time.time(), fact_id,
                                user_id))
            if cursor.rowcount == 0:
                _raise_missing(user_id, [fact_id])
            row = conn.execute(f"SELECT {_FACT_COLUMNS} FROM facts WHERE fact_id = ?",
                               (fact_id,)).fetchone()
        return _fact_from_row(row)

    def delete(self, *, user_id: str, fact_ids: Sequence[int]) -> None:
        """Delete the user's facts in one transaction.

        Raises:
            FactNotFoundError: an id is unknown or another user's; nothing is deleted.
        """
        user_id = check_user_id(user_id)
        ids = list(dict.fromkeys(_check_fact_ids(fact_ids)))
        with self._transaction("delete") as conn:
            existing = {row[0] for row in _select_facts(conn, "fact_id", user_id, ids)}
            _raise_missing(user_id, [i for i in ids if i not in existing])
            conn.executemany("DELETE FROM facts WHERE fact_id = ?", [(i,) for i in ids])

    def reset(self, *, user_id: str) -> list[FactId]:
        """Delete all facts and turns of a user; returns the deleted fact ids."""
        user_id = check_user_id(user_id)
        with self._transaction("reset") as conn:
            fact_ids = [FactId(r[0]) for r in conn.execute(
                "SELECT fact_id FROM facts WHERE user_id = ? ORDER BY fact_id", (user_id,))]
            conn.execute("DELETE FROM facts WHERE user_id = ?", (user_id,))
            conn.execute("DELETE FROM turns WHERE user_id = ?", (user_id,))
        return fact_ids

    # ---- turns -------------------------------------------------------------------------
    def add_turns(self, *, user_id: str, session_id: str | None,
                  turns: Sequence[tuple[str, str]]) -> list[int]:
        """Append (role, content) messages to a session in one transaction; returns turn ids."""
        user_id = check_user_id(user_id)
        if session_id is not None:
            session_id = _check_str(session_id, "session_id", InvalidTurnError)
        rows = _turn_rows(turns)
        now = time.time()
        with self._transaction("add_turns") as conn:
            return _insert_turns(conn, user_id, session_id, rows, now)

    def recent_turns(self, *, user_id: str, session_id: str | None,
                     limit: int = 20) -> list[Turn]:
        """The last `limit` turns of a session, oldest first."""
        user_id = check_user_id(user_id)
        _check_int(limit, "limit", 0, InvalidTurnError)
        with self._reading("recent_turns") as conn:
            rows = conn.execute(f"SELECT {_TURN_COLUMNS} FROM turns WHERE user_id = ? AND "
                                "session_id IS ? ORDER BY turn_id DESC LIMIT ?",
                                (user_id, session_id, limit)).fetchall()
        return [Turn(*row) for row in reversed(rows)]

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
        _check_int(batch_size, "batch_size", 1, ConfigError)
        last_id = 0
        while True:
            with self._reading("iter_all") as conn:
                batch = [_fact_from_row(row) for row in conn.execute(
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
        value = _check_str(value, "fingerprint", ConfigError)
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


# ---- validation and encoding -------------------------------------------------------------
def _check_str(value: object, what: str, error: type[Exception], *,
               allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise error(f"{what} must be a string, got {type(value).__name__} {value!r:.80}")
    if not allow_empty and not value.strip():
        raise error(f"{what} is empty or blank ({value!r}); pass some text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(f"{what} is not valid Unicode: {value[exc.start:exc.end]!r} at index "
                    f"{exc.start} is a lone surrogate (bytes decoded with 'surrogateescape'?); "
                    "decode the source with its real encoding or errors='replace'") from None
    return value


def _check_int(value: object, what: str, minimum: int, error: type[Exception]) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise error(f"{what}={value!r} must be an int >= {minimum}")
    return value


def _check_list(values: object, what: str, error: type[Exception],
                num_expected: int | None = None) -> Sequence[Any]:
    if isinstance(values, str | bytes) or not hasattr(values, "__len__") or not hasattr(
            values, "__getitem__"):
        raise error(f"{what} must be a list, got {type(values).__name__} {values!r:.80}; wrap "
                    f"a single item: {what}=[...]")
    if num_expected is not None and len(values) != num_expected:
        raise error(f"{len(values)} {what} for {num_expected} texts; pass one per text")
    return values  # type: ignore[return-value]


def _check_fact_ids(fact_ids: object) -> list[int]:
    if isinstance(fact_ids, str | bytes) or not isinstance(fact_ids, Iterable):
        raise InvalidFactError(f"fact_ids must be a list of ints, got {type(fact_ids).__name__} "
                               f"{fact_ids!r:.80}; wrap a single id: fact_ids=[...]")
    ids = list(fact_ids)
    for i, fact_id in enumerate(ids):
        if isinstance(fact_id, bool) or not isinstance(fact_id, int | np.integer):
            raise InvalidFactError(f"fact_ids[{i}] is {fact_id!r:.80}, not an int; pass the ids "
                                   "add_facts returned")
    return [int(fact_id) for fact_id in ids]


def _token_blob(value: Any, what: str) -> bytes:
    if hasattr(value, "tolist"):  # numpy array or torch tensor
        value = value.tolist()
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise InvalidFactError(f"{what} must be a list of ints, got {type(value).__name__}")
    if not value:
        raise InvalidFactError(f"{what} is empty; pass the fact text's token ids")
    for token in value:
        if isinstance(token, bool) or not isinstance(token, int | np.integer) or not (
                0 <= token <= _MAX_TOKEN_ID):
            raise InvalidFactError(f"{what} holds {token!r:.40}; token ids are ints in "
                                   f"[0, {_MAX_TOKEN_ID}]")
    return np.asarray(value, dtype=_TOKEN_DTYPE).tobytes()


def _embedding_blob(value: Any, what: str) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        if len(value) % 4:
            raise InvalidFactError(f"{what} has {len(value)} bytes, not a whole number of "
                                   "float32 values")
        value = np.frombuffer(value, dtype=_EMBEDDING_DTYPE)
    elif hasattr(value, "detach"):  # torch tensor, on any device and dtype
        value = value.detach().float().cpu().numpy()
    try:
        vector = np.asarray(value, dtype=_EMBEDDING_DTYPE)
    except (TypeError, ValueError):
        raise InvalidFactError(f"{what} is {value!r:.80}, not a vector of floats") from None
    if vector.ndim != 1 or vector.size == 0:
        raise InvalidFactError(f"{what} has shape {vector.shape}; pass one vector [dim] per fact")
    if not np.isfinite(vector).all():
        raise InvalidFactError(f"{what} contains NaN or inf; check the embedder's output")
    return vector.tobytes()


def _metadata_json(metadata: object, num_facts: int) -> list[str]:
    if metadata is None or isinstance(metadata, Mapping):
        items: Sequence[Any] = [metadata] * num_facts
    else:
        items = _check_list(metadata, "metadata", InvalidFactError, num_facts)
    out = []
    for i, item in enumerate(items):
        if item is None:
            out.append("{}")
            continue
        if not isinstance(item, Mapping) or not all(isinstance(k, str) for k in item):
            raise InvalidFactError(f"metadata[{i}] is {item!r:.80}; pass a dict with string keys")
        try:
            out.append(json.dumps(dict(item), allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise InvalidFactError(f"metadata[{i}] is not JSON-serializable ({exc}); use str, "
                                   "int, finite float, bool, None, lists and dicts") from None
    return out


def _turn_rows(turns: object) -> list[tuple[str, str]]:
    rows = []
    for i, turn in enumerate(_check_list(turns, "turns", InvalidTurnError)):
        if isinstance(turn, str) or not isinstance(turn, Sequence) or len(turn) != 2:
            raise InvalidTurnError(f"turns[{i}] is {turn!r:.80}; pass (role, content) pairs")
        rows.append((_check_str(turn[0], f"turns[{i}] role", InvalidTurnError),
                     _check_str(turn[1], f"turns[{i}] content", InvalidTurnError,
                                allow_empty=True)))
    return rows


def _insert_turns(conn: sqlite3.Connection, user_id: str, session_id: str | None,
                  rows: list[tuple[str, str]], now: float) -> list[int]:
    return [cast(int, conn.execute(
        "INSERT INTO turns (user_id, session_id, role, content, created_at) VALUES "
        "(?, ?, ?, ?, ?)", (user_id, session_id, role, content, now)).lastrowid)
        for role, content in rows]


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _select_facts(conn: sqlite3.Connection, columns: str, user_id: str,
                  fact_ids: list[int]) -> Iterator[tuple[Any, ...]]:
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


def _fact_from_row(row: tuple[Any, ...]) -> StoredFact:
    fact_id, user_id, session_id, text, tokens, embedding, metadata, created, updated = row
    return StoredFact(FactId(fact_id), user_id, session_id, text,
                      tuple(np.frombuffer(tokens, dtype=_TOKEN_DTYPE).tolist()), bytes(embedding),
                      json.loads(metadata), created, updated)
