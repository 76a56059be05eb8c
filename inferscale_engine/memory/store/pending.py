"""Facts of an asynchronous add: stored at once (pending), embedded and encoded later.

An asynchronous add commits its facts with pending=1 and a stand-in embedding before it
returns; the background queue (memory/background.py) then writes the real embedding and the
context the KV was encoded after, and clears the flag. A restart finds what is still pending
here and queues it again, so an acknowledged fact is never lost. The caller runs each function
inside the FactStore transaction that also bumps the user's version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from inferscale_engine.facts import FactId
from inferscale_engine.memory.store.records import embedding_blob, metadata_json
from inferscale_engine.memory.store.sql.database import Database


def finish_rows(db: Database, user_id: str, done: Mapping[int, tuple[object, Mapping[str, object]]],
           now: float) -> list[FactId]:
    """Write each pending fact's embedding and metadata, clear its flag; returns those written.

    A fact no longer pending (finished by another process) or gone (deleted meanwhile) is left
    as it is.
    """
    written = []
    for fact_id, (embedding, metadata) in done.items():
        cursor = db.execute(
            "UPDATE facts SET embedding = ?, metadata = ?, pending = 0, updated_at = ? "
            "WHERE fact_id = ? AND user_id = ? AND pending = 1",
            (embedding_blob(embedding, f"embedding of fact {fact_id}"),
             metadata_json(metadata, 1)[0], now, fact_id, user_id))
        if cursor.rowcount:
            written.append(FactId(fact_id))
    return written


def pending_rows(db: Database, columns: str, limit: int) -> Sequence[tuple[object, ...]]:
    """Rows of pending facts of every user, oldest first (at most `limit`)."""
    return db.execute(f"SELECT {columns} FROM facts WHERE pending = 1 ORDER BY fact_id LIMIT ?",
                      (limit,)).fetchall()
