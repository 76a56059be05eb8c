"""Per-user cosine top-k retrieval: one embedding matrix per user on a torch device.

A user's search only ever scores that user's facts. Embeddings come from search/embedder.py.
Facts added with their texts are also in the user's keyword index (lexical.py): one add and
one remove update both, so the two never disagree on a user's facts.
"""

from __future__ import annotations

import bisect
import functools
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ParamSpec, TypeVar, cast

import torch

from inferscale_engine.checks import check_half_scan_min_rows, check_user_id
from inferscale_engine.errors import ConfigError, FactNotFoundError, RetrievalError
from inferscale_engine.facts import FactId
from inferscale_engine.memory.search.embedder import resolve_device
from inferscale_engine.memory.search.lexical import LexicalIndex
from inferscale_engine.memory.search.vectors import (
    as_matrix,
    fetch,
    index_fact_ids,
    is_valid_norm,
    query_vector,
    raise_if_invalid,
    to_tensor,
)

_P = ParamSpec("_P")
_R = TypeVar("_R")
_NEAREST_CHUNK_ROWS = 256
"""Rows per score matrix in similar_many: [256, 100k] float32 is 100 MB."""

HALF_SCAN_MIN_ROWS = {"cuda": 524_288, "cpu": 8_192}
"""Per device type, from how many rows an index also keeps float16 copies of its rows and scans
those (half the bytes of the memory-bound scan), then re-ranks the best in float32: where that
outweighs the extra steps (docs/benchmarks.md has the figures). Other device types: never."""

_HALF_SCORE_ERROR = 2e-3
"""Bound on |float16 score - float32 score| for unit vectors: rounding both vectors to float16
(2 * 2**-11), the float16 output (2**-12), float32 accumulation; with a margin."""


class UserIndex:
    """One user's embeddings as the rows of a matrix on `device`; cosine top-k by matmul.

    Rows [0, len) are live and L2-normalized; capacity doubles when full, and removal moves the
    last rows into the holes, so no operation loops over all rows in Python. Not thread-safe on
    its own: RetrievalIndex serializes access.
    """

    def __init__(self, dim: int, *, device: str | torch.device = "cpu",
                 initial_capacity: int = 16, half_scan_min_rows: int | None = None) -> None:
        """An empty index.

        Args:
            dim: embedding dimension.
            device: where the rows live.
            initial_capacity: rows allocated up front.
            half_scan_min_rows: from this many rows, searches scan float16 copies of the rows
                and re-rank the candidates in float32 (the float32 scan's results; 1.5x the
                memory); None = HALF_SCAN_MIN_ROWS of the device type; 0 = never.
        """
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ConfigError(f"dim={dim!r} must be an int >= 1 (the embedder's dimension)")
        self.dim = dim
        self.device = torch.device(device)
        self._embeddings = torch.empty(max(initial_capacity, 1), dim, dtype=torch.float32,
                                       device=self.device)
        """[capacity, dim] float32; rows [0, len) hold the normalized embeddings."""
        rows = check_half_scan_min_rows(half_scan_min_rows)
        self._half_scan_min_rows = (HALF_SCAN_MIN_ROWS.get(self.device.type, 0) if rows is None
                                    else rows)
        self._half: torch.Tensor | None = None
        """[capacity, dim] float16 copies of the rows once there are half_scan_min_rows."""
        self._row_fact_ids: list[int] = []
        """Fact id of each live row."""
        self._row_of: dict[int, int] = {}
        """Row of each fact id."""
        self._ordered: list[int] = []
        """The indexed fact ids, ascending (the order they were added in): adjacent()."""

    def __len__(self) -> int:
        return len(self._row_fact_ids)

    @property
    def capacity(self) -> int:
        """Rows allocated on the device."""
        return self._embeddings.shape[0]

    def fact_ids(self) -> list[FactId]:
        """Indexed fact ids, sorted."""
        return [FactId(f) for f in self._ordered]

    def adjacent(self, fact_id: int) -> tuple[FactId, ...]:
        """The indexed facts added right after and right before an indexed fact.

        The ids next above and below it, those that exist, in that order.
        """
        at = bisect.bisect_left(self._ordered, fact_id)
        return tuple(FactId(self._ordered[i]) for i in (at + 1, at - 1)
                     if 0 <= i < len(self._ordered))

    def add(self, fact_ids: Sequence[int], embeddings: Any) -> None:
        """Index embeddings [len(fact_ids), dim]; an id already indexed gets the new vector.

        Raises:
            RetrievalError: duplicate ids in the call, or embeddings of the wrong shape, with
                NaN/inf or all zeros. Nothing changes.
        """
        ids = index_fact_ids(fact_ids)
        if len(set(ids)) != len(ids):
            raise RetrievalError(f"fact_ids {ids} repeat an id; pass each fact once")
        vectors = as_matrix(embeddings, len(ids), self.dim, self.device)
        replaced = [i for i, fact_id in enumerate(ids) if fact_id in self._row_of]
        if replaced:
            rows = torch.tensor([self._row_of[ids[i]] for i in replaced], device=self.device)
            self._write(rows, vectors[torch.tensor(replaced, device=self.device)])
        added = [i for i, fact_id in enumerate(ids) if fact_id not in self._row_of]
        if added:
            start = len(self)
            self._reserve(start + len(added))
            self._write(slice(start, start + len(added)),
                        vectors[torch.tensor(added, device=self.device)])
            for row, i in enumerate(added, start):
                self._row_of[ids[i]] = row
                self._row_fact_ids.append(ids[i])
                bisect.insort(self._ordered, ids[i])  # new ids are the largest: appended
        self._update_half()

    def remove(self, fact_ids: Iterable[int]) -> None:
        """Remove facts from the index.

        Raises:
            FactNotFoundError: an id is not indexed; nothing is removed.
        """
        ids = list(dict.fromkeys(index_fact_ids(fact_ids)))
        missing = [f for f in ids if f not in self._row_of]
        if missing:
            raise FactNotFoundError(f"fact id(s) {missing} are not in this user's index")
        num_live = len(self) - len(ids)
        removed_rows = {self._row_of.pop(f) for f in ids}
        holes = sorted(r for r in removed_rows if r < num_live)
        movers = [r for r in range(num_live, len(self)) if r not in removed_rows]
        if holes:  # len(holes) == len(movers): fill each hole with a live row from the tail
            self._write(torch.tensor(holes, device=self.device),
                        self._embeddings[torch.tensor(movers, device=self.device)])
            for hole, mover in zip(holes, movers, strict=True):
                fact_id = self._row_fact_ids[mover]
                self._row_fact_ids[hole] = fact_id
                self._row_of[fact_id] = hole
        del self._row_fact_ids[num_live:]
        for fact_id in ids:
            del self._ordered[bisect.bisect_left(self._ordered, fact_id)]

    def search(self, query_embedding: Any, k: int, meanwhile: Callable[[], object] | None = None
               ) -> list[tuple[FactId, float]]:
        """The k facts most similar to a query [dim], best first, as (fact id, cosine).

        k larger than the index returns every fact. Equal scores rank by smaller fact id.
        meanwhile: called once, after the scan is queued and before its result is waited for
        (host work that a GPU scan then hides: hybrid.py's keyword query).
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise RetrievalError(f"k={k!r} must be an int >= 0")
        query, norm = query_vector(query_embedding, self.dim, self.device)
        host_work = _Once(meanwhile)
        if k == 0 or not self._row_fact_ids:
            host_work()
            raise_if_invalid(is_valid_norm(float(norm)), "query_embedding")
            return []
        k = min(k, len(self))
        candidates = 2 * k + 64
        if self._half is not None and candidates < len(self):
            found = self._search_half(query, norm, k, candidates, host_work)
            if found is not None:
                return found
        scores = self._embeddings[:len(self)] @ query  # [len]
        top = torch.topk(scores, min(k + 1, len(self)))  # sorted; one more shows a tie at the cut
        host_work()
        # Scores, rows and the query's norm in one transfer (the only device sync of a search).
        values, rows, (query_norm,) = fetch((top.values, top.indices), norm)
        raise_if_invalid(is_valid_norm(query_norm), "query_embedding")
        if len(values) == k or values[k] < values[k - 1]:  # the usual case: no tie at the cut
            return self._ranked(zip(values[:k], map(int, rows[:k])), k)
        tied = torch.nonzero(scores >= values[k - 1]).squeeze(1)  # every row tying at the cut
        return self._ranked(zip(scores[tied].tolist(), tied.tolist(), strict=True), k)

    def scores(self, query_embedding: Any, fact_ids: Sequence[int]) -> list[float]:
        """The cosine of the query [dim] with each of the (indexed) facts, in order."""
        query, norm = query_vector(query_embedding, self.dim, self.device)
        raise_if_invalid(is_valid_norm(float(norm)), "query_embedding")
        rows = [self._row_of[f] for f in fact_ids]
        return (self._embeddings[torch.tensor(rows, device=self.device)] @ query).tolist()

    def pairwise(self, fact_ids: Sequence[int]) -> list[list[float]]:
        """The cosines of the (indexed) facts with each other, [n][n], in order."""
        rows = self._embeddings[torch.tensor([self._row_of[f] for f in fact_ids])]
        return (rows @ rows.T).tolist()

    def _search_half(self, query: torch.Tensor, norm: torch.Tensor, k: int, candidates: int,
                     host_work: Callable[[], object] | None = None
                     ) -> list[tuple[FactId, float]] | None:
        """The top k from a float16 scan, or None when it cannot prove them (scan in float32).

        The scan keeps the `candidates` best rows by float16 score and ranks them by their
        float32 scores. A row left out scores at most the lowest candidate's float16 score plus
        the error bound; when that is below the k-th float32 score, no row left out reaches or
        ties the top k, and the result is the float32 scan's.
        """
        assert self._half is not None
        rough = torch.topk(self._half[:len(self)] @ query.half(), candidates)  # sorted
        exact = self._embeddings[rough.indices] @ query  # [candidates] float32
        if host_work is not None:
            host_work()
        scores, rows, (lowest, query_norm) = fetch((exact, rough.indices), rough.values[-1], norm)
        raise_if_invalid(is_valid_norm(query_norm), "query_embedding")
        ranked = self._ranked(zip(scores, map(int, rows)), candidates)
        return ranked[:k] if lowest + _HALF_SCORE_ERROR < ranked[k - 1][1] else None

    def _ranked(self, found: Iterable[tuple[float, int]], k: int) -> list[tuple[FactId, float]]:
        """(fact id, score) best first, equal scores by smaller fact id, the first k."""
        ranked = sorted(found, key=lambda hit: (-hit[0], self._row_fact_ids[hit[1]]))
        return [(FactId(self._row_fact_ids[row]), score) for score, row in ranked[:k]]

    def nearest(self, embedding: Any) -> tuple[FactId, float] | None:
        """The most similar fact (for near-duplicate detection), or None if empty."""
        hits = self.search(embedding, 1)
        return hits[0] if hits else None

    def similar_many(self, embeddings: Any, threshold: float, limit: int
                     ) -> list[list[tuple[FactId, float]]]:
        """Per row of embeddings [n, dim], up to `limit` facts with cosine >= threshold.

        Most similar first. Near-duplicate detection of a whole batch: one [chunk, len] matmul
        per chunk of rows instead of a search per row.
        """
        vectors = as_matrix(embeddings, len(embeddings), self.dim, self.device)
        if not self._row_fact_ids:
            return [[] for _ in range(len(vectors))]
        out: list[list[tuple[FactId, float]]] = []
        for chunk in vectors.split(_NEAREST_CHUNK_ROWS):
            scores, rows = (chunk @ self._embeddings[:len(self)].T).topk(
                min(limit, len(self)), dim=1)  # [chunk, limit]
            for row_scores, row_ids in zip(scores.tolist(), rows.tolist(), strict=True):
                out.append([(FactId(self._row_fact_ids[r]), s)
                            for s, r in zip(row_scores, row_ids, strict=True) if s >= threshold])
        return out

    def _write(self, rows: torch.Tensor | slice, vectors: torch.Tensor) -> None:
        """Set rows (and their float16 copies) to normalized vectors."""
        self._embeddings[rows] = vectors
        if self._half is not None:
            self._half[rows] = vectors.half()

    def _update_half(self) -> None:
        """Start the float16 copies once the index reaches half_scan_min_rows."""
        if self._half is None and 0 < self._half_scan_min_rows <= len(self):
            self._half = self._embeddings.half()

    def _reserve(self, num_rows: int) -> None:
        if num_rows <= self.capacity:
            return
        capacity = max(num_rows, 2 * self.capacity)
        grown = torch.empty(capacity, self.dim, dtype=torch.float32, device=self.device)
        grown[:len(self)] = self._embeddings[:len(self)]
        self._embeddings = grown
        if self._half is not None:
            half = torch.empty(capacity, self.dim, dtype=torch.float16, device=self.device)
            half[:len(self)] = self._half[:len(self)]
            self._half = half


class _Once:
    """A callable run at most once (None: nothing)."""

    def __init__(self, call: Callable[[], object] | None) -> None:
        self._call = call

    def __call__(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            call()


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
    def search(self, *, user_id: str, query_embedding: Any, k: int,
               meanwhile: Callable[[], object] | None = None) -> list[tuple[FactId, float]]:
        """The user's k most similar facts, best first; [] for a user with none.

        meanwhile: run once while the scan runs on the device (UserIndex.search), also when
        the user has none.
        """
        with self._lock:
            index = self._users.get(user_id)
            if index is None:
                if meanwhile is not None:
                    meanwhile()
                return []
            return index.search(query_embedding, k, meanwhile)

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
