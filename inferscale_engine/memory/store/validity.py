"""When facts are true: superseding, expiry, the times given on add (store side).

A superseded fact stays in the store with valid_to (when it stopped being true) and
superseded_by (the fact that replaced it), so history keeps the chain and an as-of read can
still find it; reads of the present skip it. An expired fact (expires_at passed) is never
served; a sweep deletes its row (history: EXPIRE). The caller runs each function inside the
FactStore transaction that also bumps the user's version.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from inferscale_engine.checks import check_list
from inferscale_engine.errors import FactNotFoundError, InvalidFactError, InvalidRequestError
from inferscale_engine.facts import FactId
from inferscale_engine.memory.store import history
from inferscale_engine.memory.store.sql.database import Database

_IDS_PER_QUERY = 500


def supersede(db: Database, user_id: str, ids: Sequence[int], by: FactId | None,
              at: float | None) -> list[FactId]:
    """Mark the user's current facts `ids` superseded by `by`; returns those marked.

    by None: no newer fact replaces them; they just stopped being true.
    """
    if by is not None and by in ids:
        raise InvalidRequestError(f"fact {by} cannot supersede itself")
    newer = (None, None) if by is None else db.execute(
        "SELECT text, valid_from FROM facts WHERE fact_id = ? AND user_id = ?",
        (by, user_id)).fetchone()
    existing: dict[int, tuple[str, float | None]] = {}
    for lo in range(0, len(ids), _IDS_PER_QUERY):
        chunk = list(ids[lo:lo + _IDS_PER_QUERY])
        existing.update((row[0], (row[1], row[2])) for row in db.execute(
            f"SELECT fact_id, text, valid_to FROM facts WHERE user_id = ? AND fact_id IN "
            f"({','.join('?' * len(chunk))})", (user_id, *chunk)))
    missing = [i for i in ids if i not in existing] + ([by] if newer is None else [])
    if missing:
        raise FactNotFoundError(f"user {user_id!r} has no fact with id(s) {missing}: deleted, "
                                "never added, or another user's")
    now = time.time()
    end = at if at is not None else newer[1] if newer[1] is not None else now
    marked = [FactId(i) for i in ids if existing[i][1] is None]
    db.executemany("UPDATE facts SET valid_to = ?, superseded_by = ?, updated_at = ?, "
                   "pinned = 0 WHERE fact_id = ?", [(end, by, now, i) for i in marked])
    history.record(db, user_id, [(i, "SUPERSEDE", existing[i][0], newer[0]) for i in marked],
                   now)
    return marked


def expired(db: Database, now: float, limit: int,
            user_prefix: str = "") -> list[tuple[str, FactId]]:
    """(user, fact id) of facts whose expires_at is at or before `now`, oldest expiry first.

    user_prefix: only users whose id starts with it (substr, not LIKE: SQLite's LIKE ignores
    ASCII case).
    """
    prefix, args = ("AND substr(user_id, 1, ?) = ? ", (len(user_prefix), user_prefix)
                    ) if user_prefix else ("", ())
    return [(row[0], FactId(row[1])) for row in db.execute(
        "SELECT user_id, fact_id FROM facts WHERE expires_at IS NOT NULL AND expires_at <= ? "
        f"{prefix}ORDER BY expires_at, fact_id LIMIT ?", (now, *args, limit))]


def times(value: object, what: str, num_facts: int) -> list[float | None]:
    """Per fact, a time in seconds since the epoch or None: one value for all, or a list."""
    items = (check_list(value, what, InvalidFactError, num_facts)
             if isinstance(value, Sequence) and not isinstance(value, str)
             else [value] * num_facts)
    out: list[float | None] = []
    for i, item in enumerate(items):
        if item is not None and (isinstance(item, bool) or not isinstance(item, int | float)
                                 or not math.isfinite(item)):
            raise InvalidFactError(f"{what}[{i}] is {item!r:.40}; pass seconds since the epoch "
                                   "(a finite number) or None")
        out.append(None if item is None else float(item))
    return out


def set_expiry(db: Database, user_id: str, fact_ids: Sequence[int],
               expires_at: object) -> list[FactId]:
    """Set expires_at of the user's facts that have not expired yet; returns them.

    An expired fact is left as it is (a refresh never brings one back).
    """
    (end,) = times(expires_at, "expires_at", 1)
    ids, now = list(dict.fromkeys(fact_ids)), time.time()
    changed: list[FactId] = []
    for lo in range(0, len(ids), _IDS_PER_QUERY):
        chunk = list(ids[lo:lo + _IDS_PER_QUERY])
        changed += [FactId(row[0]) for row in db.execute(
            f"SELECT fact_id FROM facts WHERE user_id = ? AND fact_id IN "
            f"({','.join('?' * len(chunk))}) AND (expires_at IS NULL OR expires_at > ?)",
            (user_id, *chunk, now))]
    db.executemany("UPDATE facts SET expires_at = ? WHERE fact_id = ?",
                   [(end, i) for i in changed])
    return changed
