"""The fingerprint of a store: what its token ids, embeddings and KV were derived with.

When it changes, Memory recomputes what depends on the changed part; fact KV is never
persisted, so it is always rebuilt by the model being served.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from inferscale_engine.config import EngineConfig
from inferscale_engine.memory.store.fact_store import FactStore
from inferscale_engine.memory.store.records import StoredFact
from inferscale_engine.prompting.prompt import FACT_FORMAT
from inferscale_engine.protocol.plan import PLAN_VERSION


def fingerprint(config: EngineConfig, tokenizer: Any, embedder_name: str,
                fact_dates: bool = False) -> dict[str, Any]:
    """What stored token ids, embeddings and KV were made with (JSON-compatible).

    fact_dates: whether token ids hold each fact's date (Memory's date_facts).
    """
    return {"plan_version": PLAN_VERSION, "model": config.model, "dtype": config.dtype,
            "tokenizer": tokenizer_digest(tokenizer), "fact_format": FACT_FORMAT,
            "fact_dates": fact_dates, "embedder": embedder_name}


def stale_parts(stored: str | None, current: dict[str, Any]) -> set[str]:
    """Which derived data to recompute: 'tokens' and/or 'embeddings'.

    A store without a readable fingerprint has unknown provenance: both are recomputed.
    """
    try:
        old = json.loads(stored) if stored is not None else None
    except ValueError:
        old = None
    if not isinstance(old, dict):
        return {"tokens", "embeddings"}
    parts = set()
    if any(old.get(key) != current[key] for key in ("tokenizer", "fact_format")) or (
            old.get("fact_dates", False) != current.get("fact_dates", False)):
        parts.add("tokens")
    if old.get("embedder") != current["embedder"]:
        parts.add("embeddings")
    return parts


def refresh(store: FactStore, batch: list[StoredFact], stale: set[str],
            tokenize: Callable[[StoredFact], tuple[int, ...]],
            embed: Callable[[list[str]], Any]) -> list[StoredFact]:
    """Recompute (in the store) the stale token ids and/or embeddings of a batch of facts.

    tokenize: a stored fact's token ids as they are served now.
    """
    vectors = embed([f.text for f in batch]) if "embeddings" in stale else None
    out = []
    for i, old in enumerate(batch):
        token_ids = tokenize(old) if "tokens" in stale else old.token_ids
        out.append(store.update(user_id=old.user_id, fact_id=old.fact_id, text=old.text,
                                token_ids=token_ids,
                                embedding=old.embedding if vectors is None else vectors[i]))
    return out


def tokenizer_digest(tokenizer: Any) -> str:
    """Identity of a tokenizer's vocabulary and rules (not of the folder it came from)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        blob = backend.to_str()
    else:  # slow tokenizers: the vocabulary and the class
        blob = type(tokenizer).__name__ + json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
