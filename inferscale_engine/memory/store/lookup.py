"""Reading a user's facts by id in chunks, and the error every verb gives for a missing id.

The caller runs these inside one of its FactStore transactions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from inferscale_engine.errors import FactNotFoundError
from inferscale_engine.memory.store.sql.database import Database

IDS_PER_QUERY = 500
"""Ids bound in one query: under SQLITE_MAX_VARIABLE_NUMBER of every SQLite build (999)."""


def select_facts(db: Database, columns: str, user_id: str,
                 fact_ids: Sequence[int]) -> Iterator[tuple[Any, ...]]:
    """Rows (`columns`) of the user's facts among `fact_ids`, in no particular order."""
    for start in range(0, len(fact_ids), IDS_PER_QUERY):
        chunk = fact_ids[start:start + IDS_PER_QUERY]
        yield from db.execute(f"SELECT {columns} FROM facts WHERE user_id = ? AND fact_id IN "
                              f"({','.join('?' * len(chunk))})", (user_id, *chunk))


def raise_missing(user_id: str, missing: list[int]) -> None:
    """FactNotFoundError naming the ids in `missing`, if any."""
    if missing:
        raise FactNotFoundError(f"user {user_id!r} has no fact with id(s) "
                                f"{list(dict.fromkeys(missing))}: deleted, never added, or "
                                "another user's; list the user's facts with get_all()")
