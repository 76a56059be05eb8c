"""Search modes: vector (cosine) alone, or hybrid: keyword BM25 scores fused with the cosine.

Hybrid search is two steps. The fused score  cosine + KEYWORD_WEIGHT * bm25 / max bm25  (the
query's best keyword match scores the full weight; a fact with none of the query's words adds
nothing) CHOOSES the k facts: keyword matches bring in what the embedding ranks low (names,
rare words). The cosine ORDERS the k chosen facts and is the score a search reports: a single
keyword in common ("live" in "Where do I live?" and "Her sister lives in Boston.") may bring a
fact in, but does not put it ahead of the facts that mean what the query asks. Scores stay
cosines in [-1, 1] in either mode, so a threshold means the same in both.

The candidates are the vector top-k and the keyword top-KEYWORD_CANDIDATES: a fact in neither
cannot beat the vector top-k. The keyword query (SQLite FTS5, on the host) runs after the
vector scan is queued and before its result is waited for (index.py hybrid_candidates): on a
GPU the query's embedding and the scan run while the host matches the keywords, and for a user
of up to SCORED_FETCH_ROWS facts the keyword matches' cosines come back in the scan's own
transfer. The weight, and the weighted sum over reciprocal-rank fusion, were chosen on the
LoCoMo dev fold (benchmarks/retrieval_locomo.py, docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from inferscale_engine.errors import ConfigError, InvalidRequestError
from inferscale_engine.facts import FactId
from inferscale_engine.memory.search.recency import RECENCY_CANDIDATES, Bonus, raised

if TYPE_CHECKING:  # this module imports no torch: MemoryConfig reads its modes
    from inferscale_engine.memory.search.index import RetrievalIndex

_Hit = TypeVar("_Hit", bound=tuple[Any, float])

SEARCH_MODES = ("vector", "hybrid")
DEFAULT_SEARCH_MODE = "hybrid"
"""Chosen on the LoCoMo dev fold (turn facts, MiniLM): gold-evidence recall at k=5/10/20 of
58.1/68.1/75.6% against vector's 34.9/45.9/56.6% (docs/benchmarks.md#keyword-search)."""
KEYWORD_WEIGHT = 0.5
"""Weight of the normalized BM25 score next to the cosine: on the dev fold, 0.3/0.5/0.7/1.0
gave recall at k=20 of 74.4/75.6/74.9/73.2% (and at k=10 66.2/68.1/67.4/67.5%)."""
KEYWORD_CANDIDATES = 200
"""Keyword matches fused per search (at least 2k)."""


def check_search_mode(value: object, setting: bool = False) -> str:
    """The search mode; InvalidRequestError (ConfigError for a `setting`) if it is not one."""
    if value not in SEARCH_MODES:
        error = ConfigError if setting else InvalidRequestError
        raise error(f"search_mode={value!r} must be 'vector' (embeddings only) or 'hybrid' "
                    "(embeddings and keywords)")
    return str(value)


def fuse(vector_hits: list[tuple[FactId, float]], keyword_hits: list[tuple[FactId, float]],
         cosines: dict[FactId, float], k: int, weight: float = KEYWORD_WEIGHT,
         bonus: Mapping[FactId, float] | None = None) -> list[tuple[FactId, float]]:
    """The k best of the candidates by cosine + weight * bm25 / max bm25, each with its cosine.

    In fused order, best first (by_score then orders a final selection by cosine).

    Args:
        vector_hits: (fact id, cosine), the vector top-k (or more).
        keyword_hits: (fact id, BM25 > 0), best first.
        cosines: the cosine of each keyword hit not among vector_hits.
        bonus: raises the fused score of the facts it names (recency.py raised).
    """
    cosine = dict(vector_hits)
    cosine.update((f, cosines[f]) for f, _ in keyword_hits if f not in cosine)
    fused = dict(cosine)
    if keyword_hits:
        top = keyword_hits[0][1]
        for fact_id, bm25 in keyword_hits:
            fused[fact_id] += weight * bm25 / top
    for fact_id, extra in (bonus or {}).items():
        if fact_id in fused:
            fused[fact_id] = raised(fused[fact_id], extra)
    chosen = sorted(fused, key=lambda f: (-fused[f], f))[:k]
    return [(f, cosine[f]) for f in chosen]


def by_score(hits: list[_Hit]) -> list[_Hit]:
    """Hits ordered by their score (the cosine), best first; ties keep their order."""
    return sorted(hits, key=lambda hit: -hit[1])


SIGNALS = ("embedding", "keywords", "both")
"""What found a hit (SearchResult.found_by): it is among the embedding's own top k, it holds a
word of the query, or both."""


def signals(ranked: list[tuple[FactId, float]], keyword_ids: frozenset[FactId],
            vector_ids: frozenset[FactId] | None) -> dict[FactId, str]:
    """Per ranked fact, the signal that found it (SIGNALS); vector_ids None: vector search."""
    if vector_ids is None:
        return {f: "embedding" for f, _ in ranked}
    return {f: ("both" if f in vector_ids else "keywords") if f in keyword_ids else "embedding"
            for f, _ in ranked}


def hybrid_search(index: RetrievalIndex, user_id: str, query: str, vector: object, k: int,
                  everything: bool = False, recency: Bonus | None = None
                  ) -> tuple[list[tuple[FactId, float]], dict[FactId, str]]:
    """The user's k best facts for `query` (its embedding `vector`) by the fused score.

    (fact id, cosine) in fused order: the caller narrows and cuts to k, then orders by cosine
    (by_score); and per fact, the signal that found it. everything=True ranks every indexed
    fact (a filter will narrow them afterwards). The weight is read at each call
    (benchmarks/retrieval_locomo.py sweeps it). With `recency` (recency.py), the vector
    candidates are widened to RECENCY_CANDIDATES and each candidate's bonus is fused too.
    """
    count = index.count(user_id=user_id)
    n = count if everything else min(k, count)
    wide = n if recency is None else min(count, max(n, RECENCY_CANDIDATES))
    vector_hits, keyword_hits, cosines = index.hybrid_candidates(
        user_id=user_id, query_embedding=vector, query=query, k=wide,
        keywords=max(KEYWORD_CANDIDATES, 2 * n))
    seen = {f for f, _ in vector_hits}
    missing = [f for f, _ in keyword_hits if f not in seen]
    bonus = None if recency is None else recency(
        list(dict.fromkeys([*(f for f, _ in vector_hits), *missing])))
    ranked = fuse(vector_hits, keyword_hits, cosines, n, KEYWORD_WEIGHT, bonus)
    top_k = frozenset(f for f, _ in vector_hits[:k])
    return ranked, signals(ranked, frozenset(f for f, _ in keyword_hits), top_k)
