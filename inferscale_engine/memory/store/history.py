"""Each fact's history: every ADD, UPDATE, SUPERSEDE, EXPIRE and DELETE, texts and time.

Rows are written in the same transaction as the change they record (fact_store.py), so history and
facts never disagree, on either database (sql/). A user's reset erases the user's history too:
a deleted user leaves no text behind. Schema step 3 creates the table and records an ADD for
every fact already stored.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from inferscale_engine.memory.types import HistoryEvent

if TYPE_CHECKING:
    from inferscale_engine.memory.store.sql.database import Database

EVENTS = ("ADD", "UPDATE", "DELETE", "SUPERSEDE", "EXPIRE")
"""SUPERSEDE: a newer fact replaced it (new_text: the newer fact's text); EXPIRE: its
expiration passed and a sweep deleted it."""


def create_v3(db: Database) -> None:
    """The history table, with an ADD for each stored fact (at its creation time)."""
    t = db.types
    db.execute(f"""CREATE TABLE history (
        event_id {t.id}, fact_id {t.integer} NOT NULL,
        user_id TEXT NOT NULL, event TEXT NOT NULL, old_text TEXT, new_text TEXT,
        created_at {t.real} NOT NULL)""")
    db.execute("CREATE INDEX history_fact ON history (fact_id, event_id)")
    db.execute("CREATE INDEX history_user ON history (user_id)")
    db.execute("INSERT INTO history (fact_id, user_id, event, old_text, new_text, created_at) "
                 "SELECT fact_id, user_id, 'ADD', NULL, text, created_at FROM facts "
                 "ORDER BY fact_id")


def record(db: Database, user_id: str,
           events: Iterable[tuple[int, str, str | None, str | None]], now: float) -> None:
    """Append (fact id, event, old text, new text) rows for one user."""
    db.executemany(
        "INSERT INTO history (fact_id, user_id, event, old_text, new_text, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        [(fact_id, user_id, event, old, new, now) for fact_id, event, old, new in events])


def record_at(db: Database, user_id: str,
              events: Iterable[tuple[int, str, str | None, str | None, float]]) -> None:
    """Append (fact id, event, old text, new text, time) rows, each at its own time (imports)."""
    db.executemany(
        "INSERT INTO history (fact_id, user_id, event, old_text, new_text, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?)", [(fact_id, user_id, *rest) for fact_id, *rest in events])


def read(db: Database, user_id: str, fact_id: int) -> list[HistoryEvent]:
    """A fact's events, oldest first ([] for an id the user never had)."""
    return [HistoryEvent(*row) for row in db.execute(
        "SELECT event_id, fact_id, user_id, event, old_text, new_text, created_at FROM history "
        "WHERE fact_id = ? AND user_id = ? ORDER BY event_id", (fact_id, user_id))]


def read_user(db: Database, user_id: str) -> list[HistoryEvent]:
    """Every event of a user, oldest first (those of deleted facts too)."""
    return [HistoryEvent(*row) for row in db.execute(
        "SELECT event_id, fact_id, user_id, event, old_text, new_text, created_at FROM history "
        "WHERE user_id = ? ORDER BY event_id", (user_id,))]


def erase_user(db: Database, user_id: str) -> None:
    """Forget every event of a user (a reset)."""
    db.execute("DELETE FROM history WHERE user_id = ?", (user_id,))
