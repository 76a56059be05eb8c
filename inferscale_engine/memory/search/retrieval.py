"""The read rules on top of the index: what search returns, what one request is served with.

Memory's verbs (main.py, answering.py) call these under the Memory's lock where they read
served state; the rules themselves hold no state. Embeddings come from embedder.py, ranking
from index.py, metadata conditions from filters.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from inferscale_engine import checks
from inferscale_engine.facts import Fact, FactId, MemoryHandle
from inferscale_engine.memory.search import filters
from inferscale_engine.memory.search.hybrid import hybrid_search, signals
from inferscale_engine.memory.search.index import RetrievalIndex
from inferscale_engine.memory.search.recency import RECENCY_CANDIDATES, Bonus, rechosen

_DUPLICATE_CANDIDATES = 8
"""Most similar indexed facts compared by text per new fact."""

Match = tuple[FactId | tuple[int], float]
"""What a new fact duplicates: an existing fact id, or (position,) of an earlier fact of the
same call; and the cosine similarity."""

Hit = tuple[Fact, float]
"""A served fact and its cosine similarity to the query."""


def ranked(index: RetrievalIndex, user_id: str, vector: torch.Tensor, k: int, narrow: bool,
           keywords: str | None = None, recency: Bonus | None = None
           ) -> tuple[list[tuple[FactId, float]], dict[FactId, str]]:
    """The user's k best (fact id, cosine), and per fact the signal that found it.

    Every indexed fact when a filter will `narrow`; signals: hybrid.SIGNALS. With
    `keywords` (the query's text), hybrid search (hybrid.py), else cosine alone. With
    `recency`, newer facts get its bonus in the choice (recency.py).
    """
    if keywords is not None:
        return hybrid_search(index, user_id, keywords, vector, k, everything=narrow,
                             recency=recency)
    wide = k if recency is None else max(k, RECENCY_CANDIDATES)  # search caps it at the count
    found = index.search(user_id=user_id, query_embedding=vector,
                         k=wide if not narrow else index.count(user_id=user_id))
    if recency is not None:
        found = rechosen(found, recency, len(found) if narrow else k)
    return found, signals(found, frozenset(), None)


def narrowed(ranked_ids: list[tuple[FactId, float]], records: Sequence[Any],
             wanted: Mapping[str, Any] | None, scope: tuple[str | None, str | None]
             ) -> list[tuple[FactId, float]]:
    """The ranked ids whose public records (same order) are in `scope` and match `wanted`."""
    return [hit for hit, record in zip(ranked_ids, records, strict=True)
            if filters.selected(record, wanted, scope)]


def handle_of(user_id: str, hits: Sequence[Hit]) -> MemoryHandle:
    """The handle naming `hits` in rank order, with their scores."""
    assert all(fact.user_id == user_id for fact, _ in hits), "the index crossed users"
    return MemoryHandle(user_id, tuple(f.fact_id for f, _ in hits),
                        tuple(score for _, score in hits))


def serve_handle(user_id: str, query: str | None, k: int, recent: Sequence[int],
                 exclude: Sequence[int],
                 search: Callable[[str, int, frozenset[FactId]], MemoryHandle],
                 pinned: Sequence[FactId] = ()) -> MemoryHandle:
    """The facts one request is served with: pinned, top-k, then recent (the one rule).

    `pinned` first (the user's pinned facts, outside k), then the user's k facts most similar
    to `query` that are neither pinned nor in `recent` nor in `exclude` (k new facts; fewer
    only where older versions are left out, search/versions.py), best first, then `recent` in
    its order (a fact listed twice keeps its first place). A blank or None query: pinned and
    `recent` only. `search(query, n, skip)` is the user's top-n handle among the facts not in
    `skip`.
    """
    first = list(dict.fromkeys(pinned))
    ids = [FactId(f) for f in dict.fromkeys(checks.check_fact_ids(recent, "recent"))
           if f not in first]
    skip = {*first, *ids, *checks.check_fact_ids(exclude, "exclude")}
    if not (k and query is not None and checks.has_visible(query)):
        return MemoryHandle(user_id, (*first, *ids))
    found = search(query, k, frozenset(FactId(f) for f in skip))
    top = [(f, s) for f, s in zip(found.fact_ids, found.scores, strict=True)
           if f not in skip][:k]
    scores = tuple(s for _, s in top) if not (ids or first) else ()  # the order is relevance
    return MemoryHandle(user_id, (*first, *(f for f, _ in top), *ids), scores)


def find_duplicates(index: RetrievalIndex, user_id: str, vectors: torch.Tensor,
                    threshold: float | None, texts: Sequence[str],
                    text_of: Callable[[FactId], str | None]) -> list[Match | None]:
    """Per new fact (vectors: [n, dim], L2-normalized): None, or the fact it duplicates.

    A fact duplicates one of the user's indexed facts, or an earlier fact of the same call,
    when BOTH their cosine similarity is >= threshold AND their texts say the same words
    (checks.same_text). The embedding alone never drops a fact: models map texts they cannot
    read (emoji, rare scripts) to one vector. threshold None disables detection.

    Args:
        texts: the new facts' texts, one per row of `vectors`.
        text_of: text of an indexed fact id (None if unknown).
    """
    if threshold is None or not len(vectors):
        return [None] * len(vectors)
    within = vectors @ vectors.T  # [n, n]
    candidates = index.similar_many(user_id=user_id, embeddings=vectors, threshold=threshold,
                                    limit=_DUPLICATE_CANDIDATES)
    matches: list[Match | None] = []
    for i, similar in enumerate(candidates):
        best: Match | None = next(((fact_id, score) for fact_id, score in similar
                                   if (known := text_of(fact_id)) is not None
                                   and checks.same_text(known, texts[i])), None)
        for j in range(i):
            score = float(within[i, j])
            if score >= threshold and (best is None or score > best[1]) and checks.same_text(
                    texts[j], texts[i]):
                earlier = matches[j]  # a duplicate of a duplicate names the original
                best = (earlier[0] if earlier else (j,), score)
        matches.append(best)
    return matches
