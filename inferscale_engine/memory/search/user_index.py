"""One user's embeddings on a torch device: cosine top-k by one matmul (RetrievalIndex's part).

The rows of a matrix hold the user's normalized embeddings; a search scores them all (or, from
HALF_SCAN_MIN_ROWS rows, float16 copies, re-ranked in float32) and reads the result back in one
transfer.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from inferscale_engine.checks import check_half_scan_min_rows
from inferscale_engine.errors import ConfigError, FactNotFoundError, RetrievalError
from inferscale_engine.facts import FactId
from inferscale_engine.memory.search.vectors import (
    as_matrix,
    fetch,
    index_fact_ids,
    is_valid_norm,
    query_vector,
    raise_if_invalid,
)

_NEAREST_CHUNK_ROWS = 256
"""Rows per score matrix in similar_many: [256, 100k] float32 is 100 MB."""

HALF_SCAN_MIN_ROWS = {"cuda": 524_288, "cpu": 8_192}
"""Per device type, from how many rows an index also keeps float16 copies of its rows and scans
those (half the bytes of the memory-bound scan), then re-ranks the best in float32: where that
outweighs the extra steps (docs/benchmarks.md has the figures). Other device types: never."""

SCORED_FETCH_ROWS = 16_384
"""Up to this many rows, search_scored reads every row's score back with the top k (128 KiB
as float64 at most) instead of making a second transfer for the cosines of the facts named."""

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

    def search(self, query_embedding: Any, k: int) -> list[tuple[FactId, float]]:
        """The k facts most similar to a query [dim], best first, as (fact id, cosine).

        k larger than the index returns every fact. Equal scores rank by smaller fact id.
        """
        return self.search_scored(query_embedding, k, tuple)[0]

    def search_scored(self, query_embedding: Any, k: int,
                      meanwhile: Callable[[], Iterable[int]]
                      ) -> tuple[list[tuple[FactId, float]], dict[FactId, float]]:
        """search(), and the query's cosine with each indexed fact that `meanwhile` names.

        meanwhile: called once, after the scan is queued and before its result is waited for
        (host work that a GPU scan then hides: hybrid.py's keyword query); it returns fact ids. With
        at most SCORED_FETCH_ROWS rows, their cosines come back in the search's own transfer
        (the whole score vector with the top k: no second device round trip); else a second
        transfer reads them. Ids the index does not hold are left out.
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise RetrievalError(f"k={k!r} must be an int >= 0")
        query, norm = query_vector(query_embedding, self.dim, self.device)
        host_work = _Once(meanwhile)
        if k == 0 or not self._row_fact_ids:
            host_work()
            raise_if_invalid(is_valid_norm(float(norm)), "query_embedding")
            return [], self._cosines(query_embedding, host_work.result, None)
        k = min(k, len(self))
        candidates = 2 * k + 64
        if self._half is not None and candidates < len(self):
            found = self._search_half(query, norm, k, candidates, host_work)
            if found is not None:
                return found, self._cosines(query_embedding, host_work.result, None)
        scores = self._embeddings[:len(self)] @ query  # [len]
        top = torch.topk(scores, min(k + 1, len(self)))  # sorted; one more shows a tie at the cut
        host_work()
        every = len(self) <= SCORED_FETCH_ROWS and bool(host_work.result)
        # Scores, rows and the query's norm (and every row's score) in one transfer: the only
        # device sync of a search.
        values, rows, (query_norm, *all_scores) = fetch((top.values, top.indices), norm,
                                                        *([scores] if every else []))
        raise_if_invalid(is_valid_norm(query_norm), "query_embedding")
        cosines = self._cosines(query_embedding, host_work.result, all_scores if every else None)
        if len(values) == k or values[k] < values[k - 1]:  # the usual case: no tie at the cut
            return self._ranked(zip(values[:k], map(int, rows[:k])), k), cosines
        tied = torch.nonzero(scores >= values[k - 1]).squeeze(1)  # every row tying at the cut
        return self._ranked(zip(scores[tied].tolist(), tied.tolist(), strict=True), k), cosines

    def _cosines(self, query_embedding: Any, named: Iterable[int] | None,
                 all_scores: list[float] | None) -> dict[FactId, float]:
        """The cosines of the indexed facts of `named`: from every row's score, or computed."""
        ids = [f for f in dict.fromkeys(named or ()) if f in self._row_of]
        if all_scores is not None:
            return {FactId(f): all_scores[self._row_of[f]] for f in ids}
        return dict(zip(map(FactId, ids), self.scores(query_embedding, ids) if ids else [],
                        strict=True))

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
    """A callable run at most once (None: nothing); `result` is what it returned."""

    def __init__(self, call: Callable[[], Any] | None) -> None:
        self._call = call
        self.result: Any = None

    def __call__(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            self.result = call()
