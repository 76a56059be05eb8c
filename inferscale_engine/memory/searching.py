"""Searching: the search verb Memory forwards to (the index, the keyword signal, the filters).

A plain part Memory holds, as it holds Editing, Listing and Answering. Present reads rank the
served facts (search/index.py, fused with keyword matches in hybrid mode: search/hybrid.py);
a read as of a date scans the facts true then (supersession.py).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from inferscale_engine import checks
from inferscale_engine.errors import ConfigError, FactNotFoundError, InvalidRequestError
from inferscale_engine.facts import FactId
from inferscale_engine.memory import supersession
from inferscale_engine.memory.gate import InteractiveGate, interactive_call
from inferscale_engine.memory.registration import RegisteredFacts
from inferscale_engine.memory.scope import Scopes
from inferscale_engine.memory.search import (
    filters,
    hybrid,
    neighbors,
    recency,
    retrieval,
    versions,
)
from inferscale_engine.memory.search.index import RetrievalIndex
from inferscale_engine.memory.store import FactStore, reserved
from inferscale_engine.memory.types import SearchResult

Reranker = Callable[[str, list[str]], Sequence[float]]
"""(query, texts) -> one relevance score per text, higher first: e.g. a sentence-transformers
CrossEncoder as  lambda query, texts: model.predict([(query, t) for t in texts])."""
DEFAULT_RERANK_CANDIDATES = 20
"""Facts a reranker scores per search (at least k)."""
logger = logging.getLogger(__name__)


class Searching:
    """Memory's search verb."""

    def __init__(self, store: FactStore, served: RegisteredFacts, index: RetrievalIndex,
                 scopes: Scopes, gate: InteractiveGate,
                 embed: Callable[[list[str]], torch.Tensor], search_mode: str,
                 counters: Counter[str], reranker: Reranker | None = None,
                 rerank_candidates: int = DEFAULT_RERANK_CANDIDATES,
                 hide_older_versions: str = versions.DEFAULT_HIDE_OLDER_VERSIONS,
                 recency_weight: float = recency.DEFAULT_RECENCY_WEIGHT,
                 recency_half_life_days: float = recency.DEFAULT_HALF_LIFE_DAYS,
                 neighbor_share: float = neighbors.DEFAULT_NEIGHBOR_SHARE) -> None:
        self._neighbor_share = neighbors.check_neighbor_share(neighbor_share)
        """Share of a present search's k given to its best facts' neighbors (neighbors.py)."""
        self._recency = recency.bonus_of(served.since, *recency.check_recency(
            recency_weight, recency_half_life_days))
        """Newer facts' bonus in what a present search chooses (None: off; recency.py)."""
        self._versions = versions.check_hide_older_versions(hide_older_versions, setting=True)
        self._store, self._served, self._index, self._scopes = store, served, index, scopes
        self._gate, self._embed, self._search_mode = gate, embed, search_mode
        if reranker is not None and not callable(reranker):
            raise ConfigError(f"reranker must be a callable (query, texts) -> scores, got "
                              f"{type(reranker).__name__}")
        self._counters, self._reranker = counters, reranker
        self._rerank_candidates = checks.check_int(rerank_candidates, "rerank_candidates", 1,
                                                   ConfigError)

    @interactive_call
    def search(self, *, user_id: str, query: str, k: int = 5,
               filter: Mapping[str, Any] | None = None, agent_id: str | None = None,
               run_id: str | None = None, as_of: Any = None,
               search_mode: str | None = None, exclude: Sequence[int] = (),
               hide_older_versions: str | None = None) -> SearchResult:
        """The user's k facts most similar to `query`, best first, and their handle.

        search_mode: 'vector' (cosine) or 'hybrid' (keyword matches fused with the cosine choose
        the k facts, search/hybrid.py); None: the Memory's. Either way the hits are ordered by,
        and scored with, their cosine similarity. With `filter` (search/filters.py), only facts
        whose metadata match it; with agent_id / run_id, only facts added in them. A user with
        no facts gets an empty result. as_of (a datetime, date, ISO string or epoch seconds):
        among the facts true then, superseded ones included (ranked by cosine). With the
        Memory's reranker, the rerank_candidates best are scored by it and its k best returned,
        ordered by and scored with its scores (a read as of a date is not reranked).
        exclude: fact ids left out before the k are chosen (k others are returned).
        hide_older_versions ('now', 'always', 'never'; None: the Memory's): among the facts
        found, leave out older versions of another found fact when the query asks about the
        present ('now') or always (search/versions.py); a read as of a date keeps them. The
        result names them (older_versions) and may hold fewer than k facts.
        """
        user = self._scopes.user(user_id)
        query = checks.check_text(query, "query", InvalidRequestError)
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise InvalidRequestError(f"k={k!r} must be an int >= 0 (facts to retrieve)")
        wanted, scope = filters.check_filter(filter), filters.scope(agent_id, run_id)
        narrow = wanted is not None or scope != (None, None)
        at = checks.check_time(as_of, "as_of")
        mode = hybrid.check_search_mode(search_mode or self._search_mode)
        skip = frozenset(checks.check_fact_ids(exclude, "exclude"))
        policy = (self._versions if hide_older_versions is None
                  else versions.check_hide_older_versions(hide_older_versions))
        vector = self._embed([query])[0]
        wanted_k, k = k, max(k, self._rerank_candidates) if self._reranker and k else k
        with user as uid:
            if at is not None:
                hits = [(self._served[r.fact_id], s) for r, s in supersession.search_as_of(
                    self._store, self._served, uid, vector, at,
                    k + len(skip) if not narrow else 2**31)
                    if filters.selected(r, wanted, scope) and r.fact_id not in skip][:wanted_k]
                return SearchResult(tuple(hits), retrieval.handle_of(uid, hits))
            ranked, found_by = retrieval.ranked(self._index, uid, vector, k + len(skip) if k
                                                else 0, narrow,
                                                query if mode == "hybrid" else None,
                                                self._recency)
            ranked = [(f, s) for f, s in ranked if f not in skip]  # before the k are cut
            if not narrow:
                if self._neighbor_share:
                    ranked, found_by = self._with_neighbors(uid, vector, ranked, k, skip,
                                                            found_by)
                hits = hybrid.by_score([(self._served[fact_id], score)
                                        for fact_id, score in ranked[:k]])
            else:
                stored = self._store.get(user_id=uid, fact_ids=[f for f, _ in ranked])
        if narrow:  # the filter is evaluated outside the lock; a delete may come between
            ranked = retrieval.narrowed(ranked, [reserved.public_record(r) for r in stored],
                                        wanted, scope)
            with self._scopes.lock:
                hits = hybrid.by_score([(self._served[f], s) for f, s in ranked
                                        if f in self._served][:k])
        older = (self._older_versions(uid, hits) if versions.applies(policy, query)
                 else ())
        if older:
            hits = [(f, s) for f, s in hits if f.fact_id not in older]
        return self._result(uid, query, hits, found_by, wanted_k, older)  # reranker: unlocked

    def _with_neighbors(self, user_id: str, vector: torch.Tensor,
                        ranked: list[tuple[FactId, float]], k: int, skip: frozenset[FactId],
                        found_by: Mapping[FactId, str]
                        ) -> tuple[list[tuple[FactId, float]], dict[FactId, str]]:
        """The k chosen with neighbors (neighbors.py), each with its cosine; their signals."""
        chosen, taken = neighbors.scored(
            ranked, k, self._neighbor_share,
            lambda anchors: self._index.adjacent(user_id=user_id, fact_ids=anchors), skip,
            lambda ids: self._index.scores(user_id=user_id, query_embedding=vector,
                                           fact_ids=ids))
        self._counters["neighbors_added"] += len(taken)
        return chosen, {**found_by, **dict.fromkeys(taken, neighbors.NEIGHBOR)}

    def _older_versions(self, user_id: str, hits: list[retrieval.Hit]) -> tuple[FactId, ...]:
        """The hits that are older versions of another hit (search/versions.py), counted.

        Only the first versions.MAX_HITS are compared (a k x k product per read).
        """
        hits = hits[:versions.MAX_HITS]
        if len(hits) < 2:
            return ()
        ids = [f.fact_id for f, _ in hits]
        try:
            similarity = self._index.pairwise(user_id=user_id, fact_ids=ids)
        except FactNotFoundError:  # one was deleted since it was found: keep them all
            return ()
        older = versions.older_versions([(f.fact_id, s) for f, s in hits], similarity,
                                        self._served.since, [f.text for f, _ in hits])
        self._counters["older_versions_left_out"] += len(older)
        return tuple(f for f in ids if f in older)

    def _result(self, user_id: str, query: str, hits: list[retrieval.Hit],
                found_by: Mapping[FactId, str], k: int, older: tuple[FactId, ...] = ()
                ) -> SearchResult:
        """The k best hits; with a reranker, the k its scores rank first (with its scores)."""
        if self._reranker is not None and len(hits) > 1:
            hits = self._rerank(query, hits)
        hits = hits[:k]
        return SearchResult(tuple(hits), retrieval.handle_of(user_id, hits),
                            tuple(found_by[f.fact_id] for f, _ in hits), older)

    def _rerank(self, query: str, hits: list[retrieval.Hit]) -> list[retrieval.Hit]:
        """Hits ordered by the reranker's scores; on its failure, as they were (counted)."""
        assert self._reranker is not None
        try:
            scores = [float(s) for s in self._reranker(query, [f.text for f, _ in hits])]
            if len(scores) != len(hits) or not all(math.isfinite(s) for s in scores):
                raise ValueError(f"{len(scores)} scores (finite: "
                                 f"{all(math.isfinite(s) for s in scores)}) for {len(hits)} texts")
        except Exception as exc:  # noqa: BLE001 - search still answers, in cosine order
            self._counters["rerank_failures"] += 1
            logger.warning("the reranker failed (%s: %s); facts kept in cosine order",
                           type(exc).__name__, exc)
            return hits
        self._counters["reranked_searches"] += 1
        order = sorted(range(len(hits)), key=lambda i: -scores[i])
        return [(hits[i][0], scores[i]) for i in order]

