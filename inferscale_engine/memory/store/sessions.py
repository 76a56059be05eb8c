"""A user's conversations as the FactStore's `turns` table tells them (the inspector lists them).

The store runs these inside its own transactions and reads (fact_store.py), as it does
history.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferscale_engine.memory.store.records import Turn
from inferscale_engine.memory.store.sql import Database


@dataclass(frozen=True, slots=True)
class Session:
    """One conversation of a user, as its stored turns tell it."""

    session_id: str | None
    """None: turns recorded without a session."""
    num_turns: int
    first_at: float
    """Seconds since the epoch of its first turn, and of its last one."""
    last_at: float


def sessions(db: Database, user_id: str) -> list[Session]:
    """Every session of a user with turns, the most recently active first."""
    return [Session(row[0], int(row[1]), float(row[2]), float(row[3])) for row in db.execute(
        "SELECT session_id, COUNT(*), MIN(created_at), MAX(created_at) FROM turns "
        "WHERE user_id = ? GROUP BY session_id ORDER BY MAX(turn_id) DESC", (user_id,)
    ).fetchall()]


_TURN_COLUMNS = "turn_id, user_id, session_id, role, content, created_at"


def insert(db: Database, user_id: str, session_id: str | None, rows: list[tuple[str, str]],
           now: float) -> list[int]:
    """Append (role, content) rows to a session; returns their turn ids."""
    return db.insert("INSERT INTO turns (user_id, session_id, role, content, created_at) "
                     "VALUES (?, ?, ?, ?, ?)",
                     [(user_id, session_id, role, content, now) for role, content in rows],
                     "turn_id")


def recent(db: Database, user_id: str, session_id: str | None, limit: int) -> list[Turn]:
    """The last `limit` turns of a session, oldest first."""
    session, args = ("IS NULL", ()) if session_id is None else ("= ?", (session_id,))
    rows = db.execute(f"SELECT {_TURN_COLUMNS} FROM turns WHERE user_id = ? AND session_id "
                      f"{session} ORDER BY turn_id DESC LIMIT ?", (user_id, *args, limit)
                      ).fetchall()
    return [Turn(*row) for row in reversed(rows)]
