"""Memory's result types: AddResult, SearchResult, MemoryStats (importable without torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inferscale_engine.facts import Fact, FactId, MemoryHandle

if TYPE_CHECKING:
    from inferscale_engine.runtime.generation import EngineStats


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
    num_served_users: int = 0
    """Users whose serving state is held now: facts registered, or read from a shared store
    (at most MemoryConfig.max_served_users of those)."""
