"""Pinned facts (store side): the `pinned` column and pinning or unpinning current facts.

A pinned fact is in every prompt of its user (runtime/pins.py serves it). The flag is durable,
so a restart pins the fact again; a superseded fact loses it in the superseding transaction
(validity.py), and a deleted one goes with its row. The caller runs each function inside the
FactStore transaction that also bumps the user's version.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from inferscale_engine.facts import FactId
from inferscale_engine.memory.store.lookup import raise_missing, select_facts
from inferscale_engine.memory.store.sql.database import Database


def create_v6(db: Database) -> None:
    """Schema step 6: facts get `pinned` (0 or 1; 0 for every fact stored before)."""
    db.execute(f"ALTER TABLE facts ADD COLUMN pinned {db.types.integer} NOT NULL DEFAULT 0")


def set_pinned(db: Database, user_id: str, fact_ids: Sequence[int], pinned: bool
               ) -> list[FactId]:
    """Pin (or unpin) the user's current facts; returns those whose flag changed.

    Raises:
        FactNotFoundError: an id is unknown, another user's, superseded or expired; nothing
            changes.
    """
    ids = list(dict.fromkeys(fact_ids))
    now = time.time()
    rows = {row[0]: row for row in select_facts(
        db, "fact_id, pinned, valid_to, expires_at", user_id, ids)}
    raise_missing(user_id, [i for i in ids if i not in rows or rows[i][2] is not None
                            or (rows[i][3] is not None and rows[i][3] <= now)])
    changed = [FactId(i) for i in ids if bool(rows[i][1]) != pinned]
    db.executemany("UPDATE facts SET pinned = ? WHERE fact_id = ?",
                   [(int(pinned), i) for i in changed])
    return changed
