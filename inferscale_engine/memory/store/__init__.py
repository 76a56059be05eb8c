"""The store room: what survives a restart. Durable facts, turns and history, in SQL.

Facts are the source of truth; fact KV and the search index are caches rebuilt from them.
Each write call of FactStore is one transaction. Nothing here imports torch or vLLM.

  fact_store.py   FactStore: the verbs on the database (add_facts, get, update, delete, ...);
                  open_store (here) opens one at a path or URL
  records.py      StoredFact, Turn: what one row holds, and how values become column blobs
  schema.py       the migration steps of both databases, the meta table, per-user versions
                  (a new column or table is a new step appended here)
  history.py      HistoryEvent: every ADD / UPDATE / SUPERSEDE / EXPIRE / DELETE of a fact, in
                  the same transaction
  transfer.py     a user's facts written whole (an import): times, links, history kept
  validity.py     when facts are true: superseding, expiry, the times given on add
  sessions.py     Session: a user's conversations as the turns table tells them; turn rows
  verbs.py        store_verb: every FactStore verb's user check and retry
  reserved.py     metadata keys InferScale reserves ('inferscale.*'): context, agent, run
  pending.py      facts of an asynchronous add: stored at once, embedded and encoded later
  pinning.py      the pinned column: pinning and unpinning current facts
  lookup.py       a user's facts read by id in chunks; the error for a missing id
  fingerprint.py  what stored token ids and embeddings were derived with
  sql/            the SQL dialects: Database (the contract), SQLite, PostgreSQL
"""

from __future__ import annotations

import os
from pathlib import Path

from inferscale_engine.errors import InvalidRequestError
from inferscale_engine.memory.store.fact_store import FactStore
from inferscale_engine.memory.store.records import StoredFact, Turn
from inferscale_engine.memory.store.sql import is_url
from inferscale_engine.memory.store.sql.sqlite import private_folder

__all__ = ["FactStore", "StoredFact", "Turn", "open_store"]


def open_store(store: FactStore | str | os.PathLike[str]) -> FactStore:
    """`store`, or the FactStore at that path (missing folders created 0700) or URL."""
    if isinstance(store, FactStore):
        return store
    if not isinstance(store, str | os.PathLike):
        raise InvalidRequestError(f"store must be a FactStore, a database path or URL, got "
                                  f"{type(store).__name__}")
    path = os.fspath(store)
    if is_url(path):
        return FactStore(path)
    path = os.path.expanduser(path)
    if path != ":memory:":
        private_folder(Path(path).parent)
    return FactStore(path)
