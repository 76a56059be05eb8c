"""Per-user cosine top-k retrieval: one embedding matrix per user on a torch device.

A user's search only ever scores that user's facts (user_index.py holds one user's matrix).
Embeddings come from search/embedder.py. Facts added with their texts are also in the user's
keyword index (lexical.py): one add and one remove update both, so the two never disagree on a
user's facts.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ParamSpec, TypeVar, cast

import torch

from inferscale_engine.checks import check_half_scan_min_rows, check_user_id
from inferscale_engine.errors import FactNotFoundError, RetrievalError
from inferscale_engine.facts import FactId
from inferscale_engine.memory.search.embedder import resolve_device
from inferscale_engine.memory.search.lexical import LexicalIndex
from inferscale_engine.memory.search.user_index import UserIndex
from inferscale_engine.memory.search.vectors import index_fact_ids, to_tensor

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _verb(call: Callable[_P, _R]) -> Callable[_P, _R]:
    """An index verb: its `user_id` keyword checked and normalized (the index's one check)."""
    @functools.wraps(call)
    def checked(*args: Any, **kwargs: Any) -> _R:
        kwargs["user_id"] = check_user_id(kwargs["user_id"])
        return call(*args, **kwargs)
    return cast(Callable[_P, _R], checked)


class RetrievalIndex:
    """A separate UserIndex per user on one device. Thread-safe."""

    def __init__(self, *, dim: int | None = None, device: str | torch.device | None = None,
                 half_scan_min_rows: int | None = None, context_facts: int = 0) -> None:
        """An empty index.

        Args:
            dim: embedding dimension; None = that of the first add.
            device: where the matrices live; None = CUDA if available.
            half_scan_min_rows: see UserIndex (per user).
            context_facts: facts before a fact whose texts it is also matched by (lexical.py).
        """
        self._dim, self._device = dim, resolve_device(device)
        self._half_scan_min_rows = check_half_scan_min_rows(half_scan_min_rows)
        self._users: dict[str, UserIndex] = {}
        self._keywords = LexicalIndex(context_facts)  # the texts of facts added with texts
        self._lock = threading.RLock()

    @_verb
    def add(self, *, user_id: str, fact_ids: Sequence[int], embeddings: Any,
            texts: Sequence[str] | None = None, sessions: Sequence[str | None] | None = None
            ) -> None:
        """Index (or re-index) facts: embeddings [n, dim]; texts, sessions for keywords."""
        ids = index_fact_ids(fact_ids)
        for name, given in (("texts", texts), ("sessions", sessions)):
            if given is not None and len(given) != len(ids):
                raise RetrievalError(f"{len(given)} {name} for {len(ids)} fact_ids; pass one each")
        vectors = to_tensor(embeddings, self._device, "embeddings")
        if not ids and not vectors.numel():
            return
        with self._lock:
            index = self._users.get(user_id)
            if index is None:
                if self._dim is None and (vectors.ndim != 2 or vectors.shape[1] < 1):
                    raise RetrievalError(f"embeddings have shape {tuple(vectors.shape)}; pass "
                                         "[num_facts, dim]")
                index = UserIndex(self._dim or vectors.shape[1], device=self._device,
                                  half_scan_min_rows=self._half_scan_min_rows)
            index.add(ids, vectors)
            self._dim = index.dim
            self._users[user_id] = index
            self._keywords.remove(user_id, ids) if texts is None else self._keywords.add(
                user_id, ids, texts, sessions)

    @_verb
    def remove(self, *, user_id: str, fact_ids: Iterable[int]) -> None:
        """Remove a user's facts; FactNotFoundError (nothing removed) if one is not indexed."""
        with self._lock:
            index = self._users.get(user_id)
            if index is None:
                raise FactNotFoundError(f"user {user_id!r} has no indexed facts")
            ids = index_fact_ids(fact_ids)
            index.remove(ids)
            self._keywords.remove(user_id, ids)
            if not len(index):
                del self._users[user_id]  # frees the user's device memory

    @_verb
    def search(self, *, user_id: str, query_embedding: Any, k: int
               ) -> list[tuple[FactId, float]]:
        """The user's k most similar facts, best first; [] for a user with none."""
        with self._lock:
            index = self._users.get(user_id)
            return [] if index is None else index.search(query_embedding, k)

    @_verb
    def hybrid_candidates(self, *, user_id: str, query_embedding: Any, query: str, k: int,
                          keywords: int) -> tuple[list[tuple[FactId, float]],
                                                  list[tuple[FactId, float]],
                                                  dict[FactId, float]]:
        """Hybrid search's candidates (hybrid.py): vector hits, keyword hits, their cosines.

        The user's k most similar facts, the `keywords` best keyword matches of `query`, and
        each keyword match's cosine. The keyword query runs on the host while the scan runs on
        the device, and the matches' cosines come back with the scan's result
        (UserIndex.search_scored).
        """
        with self._lock:
            index = self._users.get(user_id)
            matched: list[tuple[FactId, float]] = []

            def keyword_ids() -> list[int]:
                matched.extend(self._keywords.search(user_id, query, keywords))
                return [f for f, _ in matched]
            if index is None:
                keyword_ids()
                return [], matched, {}
            hits, cosines = index.search_scored(query_embedding, k, keyword_ids)
            return hits, matched, cosines

    @_verb
    def keyword_search(self, *, user_id: str, query: str, k: int) -> list[tuple[FactId, float]]:
        """The user's k facts best matching the query's words (BM25, lexical.py), best first."""
        with self._lock:
            return self._keywords.search(user_id, query, k)

    @_verb
    def scores(self, *, user_id: str, query_embedding: Any, fact_ids: Sequence[int]
               ) -> list[float]:
        """The query's cosine with each fact of `fact_ids`, in order (all the user's)."""
        with self._lock:
            index = self._holding(user_id, fact_ids)
            return index.scores(query_embedding, fact_ids) if index else []

    @_verb
    def pairwise(self, *, user_id: str, fact_ids: Sequence[int]) -> list[list[float]]:
        """The cosines of the user's facts `fact_ids` with each other, [n][n], in order."""
        with self._lock:
            index = self._holding(user_id, fact_ids)
            return index.pairwise(fact_ids) if index else []

    @_verb
    def adjacent(self, *, user_id: str, fact_ids: Sequence[int]
                 ) -> dict[FactId, tuple[FactId, ...]]:
        """Per indexed fact of `fact_ids`, the user's facts added right after and before it.

        UserIndex.adjacent; facts not indexed are left out.
        """
        with self._lock:
            index = self._users.get(user_id)
            if index is None:
                return {}
            return {FactId(f): index.adjacent(f) for f in fact_ids if f in index._row_of}

    def _holding(self, user_id: str, fact_ids: Sequence[int]) -> UserIndex | None:
        """The user's index if it holds every fact of `fact_ids` (None: no facts asked)."""
        index = self._users.get(user_id)
        if fact_ids and (index is None or any(f not in index._row_of for f in fact_ids)):
            raise FactNotFoundError(f"not all of {list(fact_ids)} are {user_id!r}'s")
        return index if fact_ids else None

    def nearest(self, *, user_id: str, embedding: Any) -> tuple[FactId, float] | None:
        """The user's most similar fact, or None."""
        hits = self.search(user_id=user_id, query_embedding=embedding, k=1)
        return hits[0] if hits else None

    @_verb
    def similar_many(self, *, user_id: str, embeddings: Any, threshold: float, limit: int = 8
                     ) -> list[list[tuple[FactId, float]]]:
        """Per row of embeddings [n, dim], the user's facts with cosine >= threshold.

        At most `limit` per row, most similar first.
        """
        with self._lock:
            index = self._users.get(user_id)
            if index is None:
                return [[] for _ in range(len(embeddings))]
            return index.similar_many(embeddings, threshold, limit)

    @_verb
    def drop_user(self, *, user_id: str) -> None:
        """Forget a user's index (no-op for an unknown user)."""
        with self._lock:
            self._users.pop(user_id, None)
            self._keywords.drop_user(user_id)

    def users(self) -> list[str]:
        """Users with at least one indexed fact, sorted."""
        with self._lock:
            return sorted(self._users)

    def count(self, *, user_id: str | None = None) -> int:
        """Indexed facts of one user, or of all users when user_id is None."""
        with self._lock:
            if user_id is None:
                return sum(len(index) for index in self._users.values())
            index = self._users.get(user_id)
            return len(index) if index is not None else 0
