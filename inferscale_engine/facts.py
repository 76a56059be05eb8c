"""Fact, FactId and MemoryHandle: what the app holds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NewType

from inferscale_engine.errors import HandleError

FactId = NewType("FactId", int)


@dataclass(frozen=True, slots=True)
class Fact:
    """One stored memory fact."""

    fact_id: FactId
    user_id: str
    text: str
    token_ids: tuple[int, ...]
    """Token ids of the fact as it appears in prompts (formatted, no special tokens)."""


@dataclass(frozen=True, slots=True)
class MemoryHandle:
    """Opaque reference to some of one user's facts; resolved and checked by the engine."""

    user_id: str
    fact_ids: tuple[FactId, ...]
    scores: tuple[float, ...] = field(default=(), compare=False)
    """Relevance of each fact to the query it was retrieved for (search's cosine), or empty:
    the order of fact_ids is then the relevance order. Suffix repair picks by it."""

    def __post_init__(self) -> None:
        if self.scores and len(self.scores) != len(self.fact_ids):
            raise HandleError(f"a handle has {len(self.fact_ids)} fact ids but "
                              f"{len(self.scores)} scores; give one score per fact or none")

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible form (for message additional_kwargs)."""
        data: dict[str, Any] = {"user_id": self.user_id,
                                "fact_ids": [int(f) for f in self.fact_ids]}
        if self.scores:
            data["scores"] = [float(s) for s in self.scores]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryHandle:
        """Inverse of to_dict.

        Raises:
            HandleError: `data` is not a handle.
        """
        try:
            user_id, fact_ids = data["user_id"], data["fact_ids"]
        except (KeyError, TypeError):
            raise HandleError(f"not a memory handle: {data!r}; expected keys user_id, fact_ids"
                              ) from None
        if not isinstance(user_id, str) or not isinstance(fact_ids, list | tuple) or not all(
                isinstance(f, int) and not isinstance(f, bool) for f in fact_ids):
            raise HandleError(f"malformed memory handle {data!r}: user_id must be a string and "
                              "fact_ids a list of ints")
        scores = data.get("scores", ())
        if not isinstance(scores, list | tuple) or (scores and len(scores) != len(fact_ids)) or (
                not all(isinstance(s, int | float) and not isinstance(s, bool) for s in scores)):
            raise HandleError(f"malformed memory handle {data!r:.120}: scores must be one "
                              "number per fact id")
        return cls(user_id, tuple(FactId(f) for f in fact_ids), tuple(map(float, scores)))
