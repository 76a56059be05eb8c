"""The memory layer: users' durable facts, retrieval, and serving them as injected KV.

`from inferscale_engine.memory import Memory` is the entry point. Names resolve lazily
(PEP 562) so that the store and the result types import without torch or vLLM.

  main.py        Memory: the verbs (add, search, get_all, update, delete, reset, generate)
  serving.py     the front door of serving: KV when possible, stale facts and fallbacks
  served.py      facts registered with the engine and indexed (start-up loading)
  ingest.py      turns -> facts and contexts, duplicate detection, add() results
  config.py      MemoryConfig, open_store
  types.py       AddResult, SearchResult, MemoryStats
  fingerprint.py what stored token ids and embeddings were derived with
  store.py       FactStore (SQLite or PostgreSQL: sql/), records.py its rows
  embedder.py    sentence-transformers embeddings; retrieval.py per-user cosine top-k
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Memory": "main", "MemoryConfig": "config", "AddResult": "types", "SearchResult": "types",
    "MemoryStats": "types", "FactStore": "store", "StoredFact": "records", "Turn": "records",
    "Embedder": "embedder", "RetrievalIndex": "retrieval",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'inferscale_engine.memory' has no attribute {name!r}")
    return getattr(importlib.import_module(f"inferscale_engine.memory.{module}"), name)


def __dir__() -> list[str]:
    return __all__
