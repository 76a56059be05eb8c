"""Conversation turns in the FactStore's `turns` table: appended, read back, listed by session.

The store runs these inside its own transactions and reads (store.py), as it does history.py's.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import cast

from inferscale_engine.memory.records import Turn

_COLUMNS = "turn_id, user_id, session_id, role, content, created_at"


@dataclass(frozen=True, slots=True)
class Session:
    """One conversation of a user, as its stored turns tell it."""

    session_id: str | None
    """None: turns recorded without a session."""
    num_turns: int
    first_at: float
    """Seconds since the epoch of its first turn, and of its last one."""
    last_at: float


def insert(conn: sqlite3.Connection, user_id: str, session_id: str | None,
           rows: list[tuple[str, str]], now: float) -> list[int]:
    """Append (role, content) rows to a session; their turn ids."""
    return [cast(int, conn.execute(
        "INSERT INTO turns (user_id, session_id, role, content, created_at) VALUES "
        "(?, ?, ?, ?, ?)", (user_id, session_id, role, content, now)).lastrowid)
        for role, content in rows]


def recent(conn: sqlite3.Connection, user_id: str, session_id: str | None,
           limit: int) -> list[Turn]:
    """The last `limit` turns of a session, oldest first."""
    rows = conn.execute(f"SELECT {_COLUMNS} FROM turns WHERE user_id = ? AND session_id IS ? "
                        "ORDER BY turn_id DESC LIMIT ?", (user_id, session_id, limit)).fetchall()
    return [Turn(*row) for row in reversed(rows)]


def sessions(conn: sqlite3.Connection, user_id: str) -> list[Session]:
    """Every session of a user with turns, the most recently active first."""
    return [Session(*row) for row in conn.execute(
        "SELECT session_id, COUNT(*), MIN(created_at), MAX(created_at) FROM turns "
        "WHERE user_id = ? GROUP BY session_id ORDER BY MAX(turn_id) DESC", (user_id,))]
