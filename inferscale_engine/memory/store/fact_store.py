"""FactStore: facts, conversation turns and fact history (history.py), durable in a database.

Facts (text, token ids, embedding, metadata) are the source of truth; fact KV and the retrieval
index are caches rebuilt from them. Each write call is ONE transaction (all or nothing): once a
call returns, its rows survive a kill. The database is a SQLite file (the default; WAL,
synchronous=FULL) or a PostgreSQL database that several processes share (a postgresql:// URL);
sql/ holds what differs between them, so this module is the same for both.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from inferscale_engine.checks import check_fact_ids, check_int, check_list, check_text
from inferscale_engine.errors import (
    ConfigError,
    InvalidFactError,
    InvalidRequestError,
    InvalidTurnError,
)
from inferscale_engine.facts import FactId
from inferscale_engine.memory.store import history, pinning, schema, transfer, validity
from inferscale_engine.memory.store import sessions as turn_log
from inferscale_engine.memory.store.lookup import raise_missing, select_facts
from inferscale_engine.memory.store.pending import finish_rows, pending_rows
from inferscale_engine.memory.store.records import (
    StoredFact,
    Turn,
    content_hash,
    embedding_blob,
    fact_from_row,
    metadata_json,
    token_blob,
    turn_rows,
)
from inferscale_engine.memory.store.sql import Database, open_database
from inferscale_engine.memory.store.sql.database import retried
from inferscale_engine.memory.store.verbs import store_verb

_FACT_COLUMNS = ("fact_id, user_id, session_id, text, token_ids, embedding, metadata, "
                 "created_at, updated_at, valid_from, valid_to, superseded_by, expires_at, "
                 "pending, pinned")
_FINGERPRINT_KEY = "fingerprint"


class FactStore:
    """Durable facts and turns of every user, in SQLite or PostgreSQL. Thread-safe.

    Fact ids are unique forever (AUTOINCREMENT, identity columns): a deleted id is never
    reused, so a stale handle or KV entry can never name a newer fact. Processes may share a
    PostgreSQL database (`shared`; user_version() says a user changed): open_store opens one.
    """

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str | None = None,
                 busy_timeout_ms: int = 5000) -> None:
        """Open (creating and migrating if needed) the database at `path`.

        Args:
            path: a SQLite file, ":memory:" (tests), or a postgresql:// (postgres://) URL such
                as postgresql://user:password@host:5432/dbname (needs the `postgres` extra).
            synchronous: SQLite only: its synchronous level. FULL (the default) makes every
                commit survive a power loss; NORMAL only a crash of the process; EXTRA also
                syncs the folder.
            busy_timeout_ms: how long a write waits for another connection's lock.

        Raises:
            ConfigError: a bad option, or a URL of another database.
            StoreError: the database cannot be opened or migrated (the message never holds a
                password).
        """
        self._db: Database = open_database(os.fspath(path), synchronous=synchronous,
                                           busy_timeout_ms=busy_timeout_ms)
        try:
            retried(schema.migrate)(self._db)
        except BaseException:
            self._db.close()
            raise

    @property
    def path(self) -> str:
        """The database: its file path, ':memory:', or its URL with the password as ***."""
        return self._db.name

    @property
    def shared(self) -> bool:
        """True if other processes may write this database too (PostgreSQL; user_version())."""
        return self._db.shared

    # ---- facts -------------------------------------------------------------------------
    @store_verb
    def add_facts(self, *, user_id: str, texts: Sequence[str],
                  token_ids: Sequence[Sequence[int]], embeddings: Sequence[Any],
                  metadata: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
                  session_id: str | None = None, turns: Sequence[tuple[str, str]] = (),
                  valid_from: float | Sequence[float | None] | None = None,
                  expires_at: float | Sequence[float | None] | None = None,
                  pending: bool = False, pinned: bool = False) -> list[FactId]:
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
            valid_from: when each fact became true (seconds since the epoch; one value for all,
                or one per fact; None: when added).
            expires_at: when each fact expires (likewise; None: never).
            pending: their embeddings and KV are still to be made (an asynchronous add; the
                embeddings given stand in until set_embedding).
            pinned: the facts are pinned (in every prompt of the user; pinning.py).

        Raises:
            InvalidUserIdError / InvalidFactError / InvalidTurnError: an argument is invalid;
                nothing is stored.
            StoreError: the database write failed; nothing is stored.
        """
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
        starts = validity.times(valid_from, "valid_from", num_facts)
        ends = validity.times(expires_at, "expires_at", num_facts)
        now = time.time()
        with self._db.transaction("add_facts") as db:
            if texts:
                schema.bump_user_version(db, user_id)
            turn_log.insert(db, user_id, session_id, turn_list, now)
            ids = [FactId(i) for i in db.insert(
                "INSERT INTO facts (user_id, session_id, text, token_ids, embedding, metadata, "
                "created_at, updated_at, content_hash, valid_from, expires_at, pending, pinned) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(user_id, session_id, text, tokens, embedding, meta, now, now, content_hash(text),
                  start, end, int(pending), int(bool(pinned)))
                 for text, tokens, embedding, meta, start, end in
                 zip(texts, token_blobs, embedding_blobs, metadata_rows, starts, ends,
                     strict=True)],
                "fact_id")]
            history.record(db, user_id, ((i, "ADD", None, t) for i, t in zip(ids, texts)), now)
            return ids

    @store_verb
    def get(self, *, user_id: str, fact_ids: Sequence[int]) -> list[StoredFact]:
        """The user's facts with these ids, in the order asked.

        Raises:
            FactNotFoundError: an id is unknown, deleted, or another user's.
        """
        ids = check_fact_ids(fact_ids)
        with self._db.reading("get") as db:
            found = {row[0]: fact_from_row(row)
                     for row in select_facts(db, _FACT_COLUMNS, user_id, ids)}
        raise_missing(user_id, [i for i in ids if i not in found])
        return [found[i] for i in ids]

    @store_verb
    def get_all(self, *, user_id: str) -> list[StoredFact]:
        """All facts of a user, oldest first (by fact id, which only grows)."""
        with self._db.reading("get_all") as db:
            return [fact_from_row(row) for row in db.execute(
                f"SELECT {_FACT_COLUMNS} FROM facts WHERE user_id = ? ORDER BY fact_id",
                (user_id,))]

    @store_verb
    def update(self, *, user_id: str, fact_id: int, text: str, token_ids: Sequence[int],
               embedding: Any, metadata: Mapping[str, Any] | None = None) -> StoredFact:
        """Replace a fact's text, token ids and embedding; metadata=None keeps the old one.

        Raises:
            FactNotFoundError: the id is unknown or another user's; nothing changes.
        """
        (fact_id,) = check_fact_ids([fact_id])
        text = check_text(text, "text", InvalidFactError, strip=False)
        tokens = token_blob(token_ids, "token_ids")
        vector = embedding_blob(embedding, "embedding")
        meta = None if metadata is None else metadata_json(metadata, 1)[0]
        with self._db.transaction("update") as db:
            schema.bump_user_version(db, user_id)
            before = db.execute("SELECT text FROM facts WHERE fact_id = ? AND user_id = ?",
                                (fact_id, user_id)).fetchone()
            cursor = db.execute(
                "UPDATE facts SET text = ?, token_ids = ?, embedding = ?, content_hash = ?, "
                "metadata = COALESCE(?, metadata), updated_at = ? WHERE fact_id = ? AND "
                "user_id = ?", (text, tokens, vector, content_hash(text), meta, time.time(),
                                fact_id, user_id))
            if cursor.rowcount == 0:
                raise_missing(user_id, [fact_id])
            row = db.execute(f"SELECT {_FACT_COLUMNS} FROM facts WHERE fact_id = ?",
                             (fact_id,)).fetchone()
            history.record(db, user_id, [(fact_id, "UPDATE", before[0], text)], row[8])
        return fact_from_row(row)

    @store_verb
    def delete(self, *, user_id: str, fact_ids: Sequence[int], event: str = "DELETE") -> None:
        """Delete the user's facts, all or none (FactNotFoundError: an unknown or foreign id).

        event: what history records, DELETE (a user's erase) or EXPIRE (a sweep of expired
        facts).
        """
        ids = list(dict.fromkeys(check_fact_ids(fact_ids)))
        if event not in ("DELETE", "EXPIRE"):
            raise InvalidRequestError(f"event={event!r}: a deletion is DELETE or EXPIRE")
        if not ids:
            return
        now = time.time()
        with self._db.transaction("delete") as db:
            schema.bump_user_version(db, user_id)
            existing = dict(select_facts(db, "fact_id, text", user_id, ids))
            raise_missing(user_id, [i for i in ids if i not in existing])
            db.executemany("DELETE FROM facts WHERE fact_id = ?", [(i,) for i in ids])
            history.record(db, user_id, [(i, event, existing[i], None) for i in ids], now)

    @store_verb
    def supersede(self, *, user_id: str, fact_ids: Sequence[int], by: int | None,
                  at: float | None = None) -> list[FactId]:
        """Mark current facts of the user superseded by fact `by`; returns those marked.

        They stay, for history and as-of reads; facts already superseded are left as they are.

        Args:
            by: the newer fact; None: they just stopped being true.
            at: when (seconds since the epoch; None: `by`'s valid_from, else now).

        Raises:
            FactNotFoundError: `by` or an id is unknown or another user's; nothing changes.
            InvalidRequestError: a fact would supersede itself.
        """
        ids = list(dict.fromkeys(check_fact_ids(fact_ids)))
        newer = None if by is None else FactId(check_fact_ids([by], "by")[0])
        with self._db.transaction("supersede") as db:
            schema.bump_user_version(db, user_id)
            return validity.supersede(db, user_id, ids, newer, at)

    @store_verb
    def set_pinned(self, *, user_id: str, fact_ids: Sequence[int], pinned: bool
                   ) -> list[FactId]:
        """Pin or unpin the user's current facts; returns those changed (pinning.py)."""
        with self._db.transaction("set_pinned") as db:
            schema.bump_user_version(db, user_id)
            return pinning.set_pinned(db, user_id, check_fact_ids(fact_ids), bool(pinned))

    @retried
    def expired(self, now: float | None = None, limit: int = 1000,
                user_prefix: str = "") -> list[tuple[str, FactId]]:
        """(user, fact id) of expired facts (of users named user_prefix...), oldest first."""
        check_int(limit, "limit", 1, InvalidRequestError)
        with self._db.reading("expired") as db:
            return validity.expired(db, time.time() if now is None else now, limit, user_prefix)

    @store_verb
    def set_expiry(self, *, user_id: str, fact_ids: Sequence[int],
                   expires_at: float | None) -> list[FactId]:
        """Set when the user's unexpired facts expire (None: never); returns those set."""
        with self._db.transaction("set_expiry") as db:
            schema.bump_user_version(db, user_id)
            return validity.set_expiry(db, user_id, check_fact_ids(fact_ids), expires_at)

    @store_verb
    def finish_pending(self, *, user_id: str,
                       done: Mapping[int, tuple[Any, Mapping[str, Any]]]) -> list[FactId]:
        """Pending facts made, per id (embedding, metadata); returns those written (pending.py)."""
        with self._db.transaction("finish_pending") as db:
            schema.bump_user_version(db, user_id)
            return finish_rows(db, user_id, done, time.time())

    @retried
    def pending_facts(self, limit: int = 100_000) -> list[StoredFact]:
        """Facts of every user an asynchronous add left pending, oldest first."""
        with self._db.reading("pending_facts") as db:
            return [fact_from_row(r) for r in pending_rows(db, _FACT_COLUMNS, limit)]

    @store_verb
    def reset(self, *, user_id: str) -> list[FactId]:
        """Delete all facts, turns and history of a user; returns the deleted fact ids."""
        with self._db.transaction("reset") as db:
            schema.bump_user_version(db, user_id)
            fact_ids = [FactId(r[0]) for r in db.execute(
                "SELECT fact_id FROM facts WHERE user_id = ? ORDER BY fact_id", (user_id,))]
            db.execute("DELETE FROM facts WHERE user_id = ?", (user_id,))
            db.execute("DELETE FROM turns WHERE user_id = ?", (user_id,))
            history.erase_user(db, user_id)
        return fact_ids

    @store_verb
    def user_history(self, *, user_id: str) -> list[history.HistoryEvent]:
        """Every event of a user's facts (deleted ones' too), oldest first (an export)."""
        with self._db.reading("user_history") as db:
            return history.read_user(db, user_id)

    @store_verb
    def history(self, *, user_id: str, fact_id: int) -> list[history.HistoryEvent]:
        """A fact's ADD / UPDATE / DELETE events, oldest first ([] if the user never had it)."""
        (fact_id,) = check_fact_ids([fact_id])
        with self._db.reading("history") as db:
            return history.read(db, user_id, fact_id)

    @store_verb
    def import_facts(self, *, user_id: str, facts: Sequence[transfer.ImportedFact]
                     ) -> list[FactId]:
        """Store imported facts as they were, skipping those the user has (transfer.py)."""
        with self._db.transaction("import_facts") as db:
            schema.bump_user_version(db, user_id)
            return transfer.write_user(db, user_id, facts)

    # ---- turns -------------------------------------------------------------------------
    @store_verb
    def add_turns(self, *, user_id: str, session_id: str | None,
                  turns: Sequence[tuple[str, str]]) -> list[int]:
        """Append (role, content) messages to a session in one transaction; returns turn ids."""
        if session_id is not None:
            session_id = check_text(session_id, "session_id", InvalidTurnError, strip=False)
        rows = turn_rows(turns)
        now = time.time()
        with self._db.transaction("add_turns") as db:
            return turn_log.insert(db, user_id, session_id, rows, now)

    @store_verb
    def recent_turns(self, *, user_id: str, session_id: str | None,
                     limit: int = 20) -> list[Turn]:
        """The last `limit` turns of a session, oldest first."""
        check_int(limit, "limit", 0, InvalidTurnError)
        with self._db.reading("recent_turns") as db:
            return turn_log.recent(db, user_id, session_id, limit)

    @store_verb
    def sessions(self, *, user_id: str) -> list[turn_log.Session]:
        """Every session of a user with turns (None: turns without one), latest first."""
        with self._db.reading("sessions") as db:
            return turn_log.sessions(db, user_id)

    @store_verb
    def recent_facts(self, *, user_id: str, limit: int = 20,
                     session_id: str | None = None) -> list[StoredFact]:
        """The user's last `limit` facts (of one session, if given), oldest first."""
        check_int(limit, "limit", 0, InvalidFactError)
        where, args = ("AND session_id = ?", (session_id,)) if session_id is not None else ("", ())
        with self._db.reading("recent_facts") as db:
            rows = db.execute(f"SELECT {_FACT_COLUMNS} FROM facts WHERE user_id = ? {where} "
                              "ORDER BY fact_id DESC LIMIT ?", (user_id, *args, limit)).fetchall()
        return [fact_from_row(row) for row in reversed(rows)]

    @retried
    def owner(self, fact_id: int) -> str | None:
        """The user a fact id belongs (or, deleted, belonged) to, or None (no such fact)."""
        (fact_id,) = check_fact_ids([fact_id], "fact_id")
        with self._db.reading("owner") as db:
            row = db.execute("SELECT user_id FROM facts WHERE fact_id = ? UNION ALL SELECT "
                             "user_id FROM history WHERE fact_id = ?", (fact_id, fact_id)
                             ).fetchone()
        return None if row is None else str(row[0])

    # ---- whole store -------------------------------------------------------------------
    @retried
    def users(self) -> list[str]:
        """Every user with facts or turns, sorted."""
        with self._db.reading("users") as db:  # sorted here: the same order in every database
            return sorted(r[0] for r in db.execute(
                "SELECT user_id FROM facts UNION SELECT user_id FROM turns"))

    @store_verb
    def count(self, *, user_id: str | None = None) -> int:
        """Number of facts of one user, or of all users when user_id is None."""
        with self._db.reading("count") as db:
            if user_id is None:
                return int(db.execute("SELECT COUNT(*) FROM facts").fetchone()[0])
            return int(db.execute("SELECT COUNT(*) FROM facts WHERE user_id = ?",
                                  (user_id,)).fetchone()[0])

    def iter_all(self, batch_size: int = 256) -> Iterator[list[StoredFact]]:
        """Every fact of every user in id order, in batches (to rebuild KV and the index).

        Other calls may run between batches. On PostgreSQL, whose writers commit in any order,
        the batches come from one snapshot (REPEATABLE READ): paging by id alone could pass a
        fact committed late with a smaller id yet yield facts committed after it. What commits
        after the first batch is not yielded then; it moves its user's version (user_version).
        On SQLite ids are given in commit order, so paging by id passes nothing; facts
        committed meanwhile with larger ids are yielded too.
        """
        check_int(batch_size, "batch_size", 1, ConfigError)
        with self._db.snapshot("iter_all") as query:
            last_id = 0
            while True:
                batch = [fact_from_row(row) for row in query(
                    f"SELECT {_FACT_COLUMNS} FROM facts WHERE fact_id > ? ORDER BY fact_id "
                    "LIMIT ?", (last_id, batch_size))]
                if not batch:
                    return
                last_id = batch[-1].fact_id
                yield batch

    @retried
    def fingerprint(self) -> str | None:
        """The stored model fingerprint (model + tokenizer identity), or None if never set."""
        with self._db.reading("fingerprint") as db:
            return schema.get_meta(db, _FINGERPRINT_KEY)

    @retried
    def set_fingerprint(self, value: str) -> None:
        """Record the fingerprint of the model and tokenizer the stored facts were made with."""
        value = check_text(value, "fingerprint", ConfigError, strip=False)
        with self._db.transaction("set_fingerprint") as db:
            schema.set_meta(db, _FINGERPRINT_KEY, value)

    @property
    @retried
    def schema_version(self) -> int:
        """Schema version of the open database."""
        with self._db.reading("schema_version") as db:
            return int(schema.get_meta(db, schema.VERSION_KEY) or 0)

    @store_verb
    def user_version(self, user_id: str) -> int:
        """Raised by every committed change of the user's facts, by any process; 0: none yet.

        One key lookup: cheap enough to ask before serving a user whose facts are cached.
        """
        with self._db.reading("user_version") as db:
            return schema.user_version(db, user_id)

    def close(self) -> None:
        """Close the database (idempotent); later calls raise StoreError."""
        self._db.close()

    def __enter__(self) -> FactStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


