"""Facts that change: a newer fact of a user supersedes the older ones it replaces.

The rule (Memory's supersede_threshold): a fact an add stores supersedes each of the user's
current facts, and each earlier fact of the same call, whose embedding has cosine similarity
>= the threshold with its own and that became true no later than it did. The superseded fact
stays in the store (valid_to, superseded_by; history SUPERSEDE) for as-of reads, and leaves
what search and answers serve, its KV with it. The rule reads only embeddings and times; the
threshold is chosen on the knowledge-update dev set (docs/benchmarks.md).

An explicit Memory.supersede (Editing) and infer=True's UPDATE decisions mark the same way.
Reads as of a date (search_as_of) rank the facts true then, superseded ones included: those
are registered with the engine again (not with the index), their KV built on first use.
Runs under the Memory's lock, after the add's own transaction (a crash in between leaves both
facts current, as before this rule existed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from inferscale_engine.facts import FactId
from inferscale_engine.memory.registration import RegisteredFacts
from inferscale_engine.memory.search.index import RetrievalIndex
from inferscale_engine.memory.store import FactStore, StoredFact, reserved

_CANDIDATES = 8
"""Most similar current facts considered per new fact."""


def find(stored: Sequence[StoredFact], vectors: torch.Tensor, index: RetrievalIndex,
         user_id: str, since_of: Callable[[FactId], float | None],
         threshold: float | None) -> dict[FactId, list[FactId]]:
    """New fact id -> the facts it supersedes (vectors: the new facts' [n, dim] rows).

    Args:
        since_of: when a served fact became true (None: not served).
    """
    if threshold is None or not stored:
        return {}
    out: dict[FactId, list[FactId]] = {}
    similar = index.similar_many(user_id=user_id, embeddings=vectors, threshold=threshold,
                                 limit=_CANDIDATES)
    within = (vectors @ vectors.T).tolist()
    for i, fact in enumerate(stored):
        older = [f for f, _ in similar[i] if (since := since_of(f)) is not None
                 and since <= fact.since]
        older += [stored[j].fact_id for j in range(i)
                  if within[i][j] >= threshold and stored[j].since <= fact.since]
        if older:
            out[fact.fact_id] = older
    return out


def apply(store: FactStore, user_id: str, found: dict[FactId, list[FactId]],
          forget: Callable[[str, list[FactId]], None]) -> int:
    """Mark what `find` found in the store and stop serving it; returns how many were marked.

    A fact superseded by two new facts is marked by the first (the store keeps one
    successor).
    """
    marked = 0
    for new, old in found.items():
        done = store.supersede(user_id=user_id, fact_ids=old, by=new)
        forget(user_id, done)
        marked += len(done)
    return marked


def search_as_of(store: FactStore, served: RegisteredFacts, user_id: str,
                 vector: torch.Tensor, at: float, k: int) -> list[tuple[StoredFact, float]]:
    """The user's k facts true at `at` most similar to `vector` (public records, best first).

    Every stored fact of the user is scored (an exact scan: as-of reads are rare); the hits
    are made servable (RegisteredFacts.register_historic).
    """
    rows = [r for r in store.get_all(user_id=user_id) if r.current(at)]
    if not rows or not k:
        return []
    matrix = torch.stack([torch.from_numpy(r.embedding_array().copy()) for r in rows])
    scores = matrix.to(vector.device) @ vector.float()
    top = scores.topk(min(k, len(rows)))
    hits = [(rows[i], float(s)) for s, i in zip(top.values.tolist(), top.indices.tolist(),
                                                strict=True)]
    served.register_historic(user_id, [r for r, _ in hits])
    return [(reserved.public_record(r), s) for r, s in hits]
