"""The memory layer: users' durable facts, retrieval, and serving them as injected KV.

`from inferscale_engine.memory import Memory` is the entry point. Names resolve lazily
(PEP 562) so that the store and the result types import without torch or vLLM.

  main.py          Memory: the facade, every verb (add, search, get_all, update, delete, ...)
  answering.py     the answering half Memory holds (generate, answer, stream, prepare)
  searching.py     the search verb: the index, the keyword signal, filters, as-of reads
  fallback.py      one handle's facts answered: KV when possible, stale facts left out,
                   the same facts as text when injection fails
  scope.py         the one preamble of every verb: user checked, lock, open, synced
  editing.py       the part that changes stored facts (update, supersede, delete, reset, ...)
  supersession.py  facts that change: the newer supersedes the older; reads as of a date
  dating.py        date_facts: each fact served with its date ('[8 May 2023] ...'), kv and text
  listing.py       the part that reads the store as it is (get, get_all, records, history)
  transfers.py     the part that moves a user's facts out and in (export, import_)
  exporting.py     the export: JSON Lines, a header then one fact per line, with history
  formats.py       what an import reads: our export, mem0's export, a LangGraph store dump
  backup.py        backup and restore of a store (SQLite, PostgreSQL) and its disk tier
  ingest.py        the write path: new facts -> duplicates -> contexts -> store -> register
  infer.py         add(..., infer=True): facts extracted by the served model, reconciled
  registration.py  the facts registered with the engine and indexed (servable), start-up
  background.py    add(wait=False): facts stored at once, embedded and encoded in a queue
  expiry.py        expiration_date: expired facts never served, hidden or swept (EXPIRE)
  pinning.py       pinned facts: pin, unpin, add(pinned=True); in every answer, before top-k
  gate.py          large adds yield to interactive calls between their chunks
  aio.py           the async verbs (aadd, asearch, ...), typed as their synchronous twins
  config.py        MemoryConfig
  types.py         AddResult, AddStatus, SearchResult, MemoryStats
  store/           durable facts, turns and history; SQL dialects, schema, reserved keys
  search/          embedder, per-user index, metadata filters, retrieval rules
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Memory": "main", "MemoryConfig": "config", "AddResult": "types", "SearchResult": "types",
    "MemoryItem": "types",
    "MemoryStats": "types", "FactStore": "store.fact_store", "StoredFact": "store.records",
    "Turn": "store.records", "Embedder": "search.embedder", "RetrievalIndex": "search.index",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'inferscale_engine.memory' has no attribute {name!r}")
    return getattr(importlib.import_module(f"inferscale_engine.memory.{module}"), name)


def __dir__() -> list[str]:
    return __all__
