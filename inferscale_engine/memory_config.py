"""MemoryConfig (what Memory.from_config builds), Memory's result types and its fingerprint.

The fingerprint names everything the stored token ids and embeddings were derived with. When it
changes, Memory recomputes what depends on the changed part; fact KV is never persisted, so it is
always rebuilt by the model being served.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferscale_engine.config import EngineConfig
from inferscale_engine.engine import EngineStats
from inferscale_engine.errors import ConfigError, InvalidRequestError
from inferscale_engine.facts import Fact, FactId, MemoryHandle
from inferscale_engine.plan import PLAN_VERSION
from inferscale_engine.prompt import FACT_FORMAT, PromptBuilder
from inferscale_engine.retrieval import DEFAULT_EMBEDDING_MODEL
from inferscale_engine.store import FactStore, StoredFact

DEFAULT_DB_PATH = "~/.inferscale/memory.db"
"""Default fact database (created on first use)."""
STARTUP_MODES = ("encode", "lazy")


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """How to build a Memory and the Engine it serves with."""

    engine: EngineConfig
    """The serving engine (model, slab size, eviction policy, ...)."""
    db_path: str = DEFAULT_DB_PATH
    """SQLite file holding facts and turns; ':memory:' for a throwaway store."""
    embedding_model: str = DEFAULT_EMBEDDING_MODEL
    """sentence-transformers model name or folder (default: offline all-MiniLM-L6-v2)."""
    dedupe_threshold: float | None = 0.95
    """Cosine similarity at or above which an added fact counts as a duplicate; None disables."""
    device: str | None = None
    """Device of the embedder and the per-user embedding matrices; None = CUDA if available."""
    startup: str = "encode"
    """'encode': re-encode every stored fact's KV at start-up; 'lazy': on first use."""
    encode_on_add: bool = True
    """Encode a fact's KV when it is added (False: on first use)."""

    def __post_init__(self) -> None:
        if not isinstance(self.engine, EngineConfig):
            raise ConfigError(f"MemoryConfig.engine must be an EngineConfig, got "
                              f"{type(self.engine).__name__}")
        if not isinstance(self.db_path, str) or not self.db_path.strip():
            raise ConfigError(f"db_path={self.db_path!r} must be a file path or ':memory:'")
        if not isinstance(self.embedding_model, str) or not self.embedding_model.strip():
            raise ConfigError(f"embedding_model={self.embedding_model!r} must be a "
                              "sentence-transformers name or folder")
        if self.device is not None and (not isinstance(self.device, str)
                                        or not self.device.strip()):
            raise ConfigError(f"device={self.device!r} must be a torch device name such as "
                              "'cpu' or 'cuda:0', or None (CUDA if available)")
        check_dedupe_threshold(self.dedupe_threshold)
        check_startup(self.startup)
        if not isinstance(self.encode_on_add, bool):
            raise ConfigError(f"encode_on_add={self.encode_on_add!r} must be True or False")


@dataclass(frozen=True, slots=True)
class AddResult:
    """What add() did with one fact."""

    fact_id: FactId
    """The new fact's id, or for a DUPLICATE the id of the fact it duplicates."""
    text: str
    event: str
    """'ADD' (stored) or 'DUPLICATE' (not stored: a near-identical fact exists)."""
    similarity: float | None = None
    """Cosine similarity to the duplicated fact (DUPLICATE only)."""


@dataclass(frozen=True, slots=True)
class SearchResult:
    """A user's facts ranked by similarity to a query, and a handle naming them."""

    hits: tuple[tuple[Fact, float], ...]
    """(fact, cosine similarity), best first."""
    handle: MemoryHandle
    """The hits' fact ids in rank order, ready for Engine.generate."""

    @property
    def facts(self) -> list[Fact]:
        """The hits' facts, best first."""
        return [fact for fact, _ in self.hits]


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """Sizes and counters of a Memory and of its engine."""

    num_users: int
    """Users with facts or turns in the store."""
    num_facts: int
    """Facts in the store (durable)."""
    num_indexed: int
    """Facts searchable and servable now (registered with the engine)."""
    num_resident: int
    """Facts whose KV is in the slab now."""
    engine: EngineStats
    counters: dict[str, int] = field(default_factory=dict)
    """Memory's own events: added, duplicates, encode_failures, startup_* ..."""


def check_dedupe_threshold(value: object) -> float | None:
    """The threshold if it is None or a float in (0, 1]; ConfigError otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and 0.0 < value <= 1.0):
        raise ConfigError(f"dedupe_threshold={value!r} must be a cosine similarity in (0, 1] "
                          "(e.g. 0.95), or None to store near-duplicates too")
    return float(value)


def check_startup(value: object) -> str:
    """The start-up mode if valid; ConfigError otherwise."""
    if value not in STARTUP_MODES:
        raise ConfigError(f"startup={value!r} must be 'encode' (rebuild every fact's KV now) or "
                          "'lazy' (rebuild each fact's KV on first use)")
    return str(value)


def fingerprint(config: EngineConfig, tokenizer: Any, embedder_name: str) -> dict[str, Any]:
    """What stored token ids, embeddings and KV were made with (JSON-compatible)."""
    return {"plan_version": PLAN_VERSION, "model": config.model, "dtype": config.dtype,
            "tokenizer": tokenizer_digest(tokenizer), "fact_format": FACT_FORMAT,
            "embedder": embedder_name}


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
    if any(old.get(key) != current[key] for key in ("tokenizer", "fact_format")):
        parts.add("tokens")
    if old.get("embedder") != current["embedder"]:
        parts.add("embeddings")
    return parts


def refresh(store: FactStore, batch: list[StoredFact], stale: set[str], prompts: PromptBuilder,
            embed: Callable[[list[str]], Any]) -> list[StoredFact]:
    """Recompute (in the store) the stale token ids and/or embeddings of a batch of facts."""
    vectors = embed([f.text for f in batch]) if "embeddings" in stale else None
    out = []
    for i, old in enumerate(batch):
        token_ids = prompts.fact_ids(old.text) if "tokens" in stale else old.token_ids
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


def open_store(store: FactStore | str | os.PathLike[str]) -> FactStore:
    """`store`, or the FactStore at that path (its folder created if missing)."""
    if isinstance(store, FactStore):
        return store
    if not isinstance(store, str | os.PathLike):
        raise InvalidRequestError(f"store must be a FactStore or a database path, got "
                                  f"{type(store).__name__}")
    path = os.path.expanduser(os.fspath(store))
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    return FactStore(path)
