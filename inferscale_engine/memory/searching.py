"""Searching: the search verb Memory forwards to (the index, the keyword signal, the filters).

A plain part Memory holds, as it holds Editing, Listing and Answering. Present reads rank the
served facts (search/index.py, fused with keyword matches in hybrid mode: search/hybrid.py);
a read as of a date scans the facts true then (supersession.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from inferscale_engine import checks
from inferscale_engine.errors import InvalidRequestError
from inferscale_engine.facts import FactId
from inferscale_engine.memory import supersession
from inferscale_engine.memory.gate import InteractiveGate, interactive_call
from inferscale_engine.memory.registration import RegisteredFacts
from inferscale_engine.memory.scope import Scopes
from inferscale_engine.memory.search import filters, hybrid, retrieval
from inferscale_engine.memory.search.index import RetrievalIndex
from inferscale_engine.memory.store import FactStore, reserved
from inferscale_engine.memory.types import SearchResult


class Searching:
    """Memory's search verb."""

    def __init__(self, store: FactStore, served: RegisteredFacts, index: RetrievalIndex,
                 scopes: Scopes, gate: InteractiveGate,
                 embed: Callable[[list[str]], torch.Tensor], search_mode: str) -> None:
        self._store, self._served, self._index, self._scopes = store, served, index, scopes
        self._gate, self._embed, self._search_mode = gate, embed, search_mode

    @interactive_call
    def search(self, *, user_id: str, query: str, k: int = 5,
               filter: Mapping[str, Any] | None = None, agent_id: str | None = None,
               run_id: str | None = None, as_of: Any = None,
               search_mode: str | None = None) -> SearchResult:
        """The user's k facts most similar to `query`, best first, and their handle.

        search_mode: 'vector' (cosine) or 'hybrid' (keyword matches fused with the cosine choose
        the k facts, search/hybrid.py); None: the Memory's. Either way the hits are ordered by,
        and scored with, their cosine similarity. With `filter` (search/filters.py), only facts
        whose metadata match it; with agent_id / run_id, only facts added in them. A user with
        no facts gets an empty result. as_of (a datetime, date, ISO string or epoch seconds):
        among the facts true then, superseded ones included (ranked by cosine).
        """
        user = self._scopes.user(user_id)
        query = checks.check_text(query, "query", InvalidRequestError)
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise InvalidRequestError(f"k={k!r} must be an int >= 0 (facts to retrieve)")
        wanted, scope = filters.check_filter(filter), filters.scope(agent_id, run_id)
        narrow = wanted is not None or scope != (None, None)
        at = checks.check_time(as_of, "as_of")
        mode = hybrid.check_search_mode(search_mode or self._search_mode)
        vector = self._embed([query])[0]
        with user as uid:
            if at is not None:
                hits = [(self._served[r.fact_id], s) for r, s in supersession.search_as_of(
                    self._store, self._served, uid, vector, at, k if not narrow else 2**31)
                    if filters.selected(r, wanted, scope)][:k]
                return SearchResult(tuple(hits), retrieval.handle_of(uid, hits))
            ranked, found_by = retrieval.ranked(self._index, uid, vector, k, narrow,
                                                query if mode == "hybrid" else None)
            if not narrow:
                hits = hybrid.by_score([(self._served[fact_id], score)
                                        for fact_id, score in ranked])
                return _result(uid, hits, found_by)
            stored = self._store.get(user_id=uid, fact_ids=[f for f, _ in ranked])
        # The filter is evaluated outside the lock; a delete may come between: keep the served.
        ranked = retrieval.narrowed(ranked, [reserved.public_record(r) for r in stored],
                                    wanted, scope)
        with self._scopes.lock:
            hits = hybrid.by_score([(self._served[f], s) for f, s in ranked
                                    if f in self._served][:k])
        return _result(uid, hits, found_by)


def _result(user_id: str, hits: list[retrieval.Hit], found_by: Mapping[FactId, str]
            ) -> SearchResult:
    return SearchResult(tuple(hits), retrieval.handle_of(user_id, hits),
                        tuple(found_by[f.fact_id] for f, _ in hits))

