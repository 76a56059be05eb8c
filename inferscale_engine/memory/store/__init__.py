"""The store room: what survives a restart. Durable facts, turns and history, in SQL.

Facts are the source of truth; fact KV and the search index are caches rebuilt from them.
Each write call of FactStore is one transaction. Nothing here imports torch or vLLM.

  fact_store.py   FactStore: the verbs on the database (add_facts, get, update, delete, ...),
                  open_store
  records.py      StoredFact, Turn: what one row holds, and how values become column blobs
  schema.py       the migration steps of both databases, the meta table, per-user versions
                  (a new column or table is a new step appended here)
  history.py      HistoryEvent: every ADD / UPDATE / SUPERSEDE / EXPIRE / DELETE of a fact, in
                  the same transaction
  validity.py     when facts are true: superseding, expiry, the times given on add
  sessions.py     Session: a user's conversations as the turns table tells them; turn rows
  verbs.py        store_verb: every FactStore verb's user check and retry
  reserved.py     metadata keys InferScale reserves ('inferscale.*'): context, agent, run
  fingerprint.py  what stored token ids and embeddings were derived with
  sql/            the SQL dialects: Database (the contract), SQLite, PostgreSQL
"""

from __future__ import annotations

from inferscale_engine.memory.store.fact_store import FactStore, open_store
from inferscale_engine.memory.store.records import StoredFact, Turn

__all__ = ["FactStore", "StoredFact", "Turn", "open_store"]
