"""The fact store's schema: migration steps (both databases), the meta table, user versions.

`meta` holds the schema version and the model fingerprint. The schema version is the number of
steps of _MIGRATIONS applied; opening a store applies the missing ones in one transaction (all
or none), so a fresh database of either kind gets the current schema, and processes opening one
database together migrate it once (Database.lock_schema).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable

from inferscale_engine.errors import StoreError
from inferscale_engine.memory.store import history, pinning
from inferscale_engine.memory.store.sql.database import Database

VERSION_KEY = "schema_version"


def _create_v1(db: Database) -> None:
    t = db.types
    db.execute(f"""CREATE TABLE facts (
        fact_id {t.id}, user_id TEXT NOT NULL, session_id TEXT,
        text TEXT NOT NULL, token_ids {t.blob} NOT NULL, embedding {t.blob} NOT NULL,
        metadata TEXT NOT NULL DEFAULT '{{}}', created_at {t.real} NOT NULL,
        updated_at {t.real} NOT NULL, content_hash TEXT NOT NULL)""")
    db.execute("CREATE INDEX facts_user_id ON facts (user_id)")
    db.execute(f"""CREATE TABLE turns (
        turn_id {t.id}, user_id TEXT NOT NULL, session_id TEXT,
        role TEXT NOT NULL, content TEXT NOT NULL, created_at {t.real} NOT NULL)""")
    db.execute("CREATE INDEX turns_session ON turns (user_id, session_id, turn_id)")


def _nfc_user_ids_v2(db: Database) -> None:
    """User ids are NFC from this version on: two spellings of one name become one user."""
    for table in ("facts", "turns"):
        users = [row[0] for row in db.execute(f"SELECT DISTINCT user_id FROM {table}")]
        db.executemany(f"UPDATE {table} SET user_id = ? WHERE user_id = ?",
                       [(nfc, user) for user in users
                        if (nfc := unicodedata.normalize("NFC", user)) != user])


def _user_versions_v4(db: Database) -> None:
    """Per-user version stamps (bump_user_version); a user without a row is at version 0."""
    db.execute(f"CREATE TABLE user_versions (user_id TEXT PRIMARY KEY, "
               f"version {db.types.integer} NOT NULL)")


def _validity_v5(db: Database) -> None:
    """Time on every fact, and asynchronous adds.

    valid_from: when the fact became true (None: its created_at); valid_to and superseded_by:
    when it stopped, and the fact that replaced it; expires_at: when it expires; pending: its
    embedding and KV are still to be made (an asynchronous add).
    """
    t = db.types
    for column in (f"valid_from {t.real}", f"valid_to {t.real}",
                   f"superseded_by {t.integer}", f"expires_at {t.real}",
                   f"pending {t.integer} NOT NULL DEFAULT 0"):
        db.execute(f"ALTER TABLE facts ADD COLUMN {column}")
    db.execute("CREATE INDEX facts_expires_at ON facts (expires_at)")
    db.execute("CREATE INDEX facts_pending ON facts (pending)")


# _MIGRATIONS[v] upgrades schema version v to v + 1 inside the opening transaction; version 0
# is an empty database. Append a step to change the schema, never edit one.
_MIGRATIONS: list[Callable[[Database], None]] = [_create_v1, _nfc_user_ids_v2,
                                                 history.create_v3, _user_versions_v4,
                                                 _validity_v5, pinning.create_v6]


def migrate(db: Database) -> None:
    """Bring the database to the current schema version (one transaction).

    Raises:
        StoreError: the database has a newer schema than this InferScale knows, or failed.
    """
    with db.transaction("schema migration"):
        db.lock_schema()
        db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        version = int(get_meta(db, VERSION_KEY) or 0)
        if version > len(_MIGRATIONS):
            raise StoreError(f"{db.name!r} has schema version {version}, newer than this "
                             f"InferScale supports ({len(_MIGRATIONS)}); upgrade inferscale")
        for step in _MIGRATIONS[version:]:
            step(db)
        if version < len(_MIGRATIONS):
            set_meta(db, VERSION_KEY, str(len(_MIGRATIONS)))


def get_meta(db: Database, key: str) -> str | None:
    """The meta value of `key`, or None."""
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def set_meta(db: Database, key: str, value: str) -> None:
    """Set the meta value of `key` (inside a transaction)."""
    db.execute("INSERT INTO meta (key, value) VALUES (?, ?) "
               "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, value))


def bump_user_version(db: Database, user_id: str) -> None:
    """Raise the user's version by one, inside the write transaction that changes the user.

    Run first in the transaction: the row lock it takes makes other writers of this user wait
    until the commit (on PostgreSQL; SQLite has one writer at a time anyway).
    """
    db.execute("INSERT INTO user_versions (user_id, version) VALUES (?, 1) ON CONFLICT "
               "(user_id) DO UPDATE SET version = user_versions.version + 1", (user_id,))


def user_version(db: Database, user_id: str) -> int:
    """The user's version: 0 if never written, then one more per write of the user's facts."""
    row = db.execute("SELECT version FROM user_versions WHERE user_id = ?",
                     (user_id,)).fetchone()
    return 0 if row is None else int(row[0])
