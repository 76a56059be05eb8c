"""Memory's result types: MemoryItem, AddResult, AddStatus, HistoryEvent, SearchResult, ...

ImportResult too; no torch. MemoryItem is the one shape a user meets a fact in, from a local
Memory and from MemoryClient (a server) alike, as mem0 returns one result shape everywhere. A
field a later feature adds to every fact (validity, expiry) is one more field here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inferscale_engine.facts import Fact, FactId, MemoryHandle

if TYPE_CHECKING:
    from inferscale_engine.runtime.generation import EngineStats


@dataclass(frozen=True, slots=True)
class MemoryItem:
    """One fact as a user meets it, the one shape of Memory and MemoryClient.

    Memory gives it as SearchResult.items and StoredFact.to_item(); MemoryClient's search,
    get, get_all and update return it.
    """

    fact_id: FactId
    user_id: str
    text: str
    score: float | None = None
    """Cosine similarity to the query (search results only)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """The app's metadata (InferScale's reserved keys left out)."""
    session_id: str | None = None
    created_at: float | None = None
    """Seconds since the epoch; None where the source did not say."""
    updated_at: float | None = None
    agent_id: str | None = None
    """The agent scope the fact was added in (mem0's agent_id), if any."""
    run_id: str | None = None
    """The run scope the fact was added in (mem0's run_id), if any."""
    valid_from: float | None = None
    """When the fact became true (add's timestamp), seconds since the epoch; None: when added."""
    valid_to: float | None = None
    """When a newer fact superseded it; None: current."""
    superseded_by: FactId | None = None
    """The fact that superseded it, if any."""
    expires_at: float | None = None
    """When it expires (its expiration_date); None: never."""
    pinned: bool = False
    """In every prompt of the user, before the retrieved facts (add(pinned=True), pin())."""


@dataclass(frozen=True, slots=True)
class AddResult:
    """What add() did with one fact."""

    fact_id: FactId
    """The new fact's id, or for a DUPLICATE the id of the fact it duplicates."""
    text: str
    event: str
    """'ADD' (stored) or 'DUPLICATE' (not stored: a near-identical fact exists); with
    infer=True also 'UPDATE' (a new fact superseding a stored one), 'DELETE' (a stored fact
    no longer true) or 'NONE'."""
    similarity: float | None = None
    """Cosine similarity to the duplicated fact (DUPLICATE only)."""
    turn: int | None = None
    """Index of the message of add(messages=...) the fact was made of (None: added as a text,
    or a change infer=True decided). Callers map results to their messages with it."""
    supersedes: tuple[FactId, ...] = ()
    """The facts this one superseded (supersede(), infer=True's UPDATE, supersede_threshold):
    kept in the store for history and as-of reads, no longer served."""
    status: str | None = None
    """'PENDING' for a fact of add(wait=False): stored, its embedding, duplicate check and KV
    still to come (Memory.add_status(fact_id) tells how it went); None for a finished add."""


@dataclass(frozen=True, slots=True)
class AddStatus:
    """How an asynchronous add of one fact went (Memory.add_status; mem0's event)."""

    fact_id: FactId
    """The fact's id (also its event id)."""
    status: str
    """'PENDING' (queued), 'RUNNING', 'SUCCEEDED' (searchable, KV encoded) or 'FAILED'
    (still stored and served as text; retried at the next start)."""
    event: str = "ADD"
    """'ADD', or 'DUPLICATE': the background check found it repeats `duplicate_of`, and its
    row was deleted (history: ADD, then DELETE), or 'INFER': a message of add(infer=True,
    wait=False), whose row was deleted once the model's decisions were applied (`inferred`)."""
    duplicate_of: FactId | None = None
    error: str | None = None
    """What failed (FAILED only)."""
    inferred: tuple[AddResult, ...] = ()
    """INFER: what the add's model calls did (add(infer=True)'s results: ADD, UPDATE, ...)."""


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One change of one fact (Memory.history; MemoryClient.history)."""

    event_id: int
    fact_id: int
    user_id: str
    event: str
    """'ADD', 'UPDATE', 'DELETE', 'SUPERSEDE' or 'EXPIRE' (store/history.py)."""
    old_text: str | None
    new_text: str | None
    created_at: float
    """Seconds since the epoch."""


@dataclass(frozen=True, slots=True)
class SearchResult:
    """A user's facts ranked by similarity to a query, and a handle naming them."""

    hits: tuple[tuple[Fact, float], ...]
    """(fact, cosine similarity to the query), best first (hybrid search chooses which facts,
    by keywords and cosine; the cosine orders them)."""
    handle: MemoryHandle
    """The hits' fact ids in rank order, ready for Engine.generate."""
    found_by: tuple[str, ...] = ()
    """Per hit, what found it: 'embedding' (among the embedding's own top k), 'keywords' (a
    word of the query brought it in) or 'both'; empty for reads as of a date."""
    older_versions: tuple[FactId, ...] = ()
    """Facts the search found but left out as older versions of a found fact, because the
    query asks about the present (Memory's hide_older_versions; memory/search/versions.py)."""

    @property
    def facts(self) -> list[Fact]:
        """The hits' facts, best first."""
        return [fact for fact, _ in self.hits]

    @property
    def items(self) -> list[MemoryItem]:
        """The hits as MemoryItems (score set), best first."""
        return [MemoryItem(f.fact_id, f.user_id, f.text, score) for f, score in self.hits]


@dataclass(frozen=True, slots=True)
class ImportResult:
    """What Memory.import_ did with a file."""

    format: str
    """The file's format: 'inferscale', 'mem0' or 'langgraph'."""
    num_records: int
    """Facts the file holds."""
    fact_ids: tuple[FactId, ...]
    """The new facts, in the file's order."""
    num_skipped: int
    """Records the user already had (imported before, or the user's own facts): not added."""


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
    num_served_users: int = 0
    """Users whose serving state is held now: facts registered, or read from a shared store
    (at most MemoryConfig.max_served_users of those)."""
