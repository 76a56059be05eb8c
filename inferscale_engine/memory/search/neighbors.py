"""Neighbors: part of a search's k given to the facts added right beside its best facts.

A memory of a conversation answers from a turn AND the turns around it: "Did you go?" /
"Yes, to the LGBTQ support group last Friday." The question matches one of them; the other
holds half the answer and shares no word or meaning with the question. With neighbor_share s,
a present search (and a request's facts) keeps its k - floor(s * k) best facts as the anchors,
then, best anchor first, adds the user's fact added right after it, then the one right before
it (search/index.py adjacent: the next and previous indexed fact ids of the user), until k; a
fact already chosen, skipped or found as a neighbor before is not added twice. When there are
too few neighbors, the next best facts fill the k. Off by default (DEFAULT_NEIGHBOR_SHARE).

The neighbors are scored by their cosine like every hit, so the k are ordered as before (by
cosine), and SearchResult.found_by names them 'neighbor'. A search narrowed by a filter, a
read as of a date and k < 2 take no neighbors. The share 0.3 and the default (off) were
chosen on the LoCoMo dev fold (docs/benchmarks.md#neighbors).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence

from inferscale_engine.errors import ConfigError
from inferscale_engine.facts import FactId

DEFAULT_NEIGHBOR_SHARE = 0.0
"""Off: on the LoCoMo dev fold 0.3 finds more evidence among dialogue turns (R@20 74.1 -> 79.5%)
but not among observation facts (67.8 -> 68.2%), and the 0.5B's F1 did not move (text -0.5,
kv -1.0 points, within noise; docs/benchmarks.md#neighbors)."""
NEIGHBOR = "neighbor"
"""SearchResult.found_by of a fact taken as an anchor's neighbor."""


def check_neighbor_share(value: object) -> float:
    """The share of k given to neighbors: a number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and 0 <= value < 1):
        raise ConfigError(f"neighbor_share={value!r} must be a number >= 0 and < 1: the share "
                          "of a search's k given to the facts added beside its best facts "
                          "(0: off)")
    return float(value)


def with_neighbors(ranked: Sequence[tuple[FactId, float]], k: int, share: float,
                   adjacent: Callable[[list[FactId]], Mapping[FactId, Sequence[FactId]]],
                   skip: Collection[FactId]) -> tuple[list[FactId], list[FactId]]:
    """(the k chosen fact ids, those of them taken as neighbors).

    Args:
        ranked: the search's candidates, best first (skipped facts already out).
        adjacent: per anchor id, its neighbors (added right after, right before).
        skip: facts never chosen (excluded, pinned, recent).
    """
    anchors = [f for f, _ in ranked[:k - math.floor(share * k)]]
    if share <= 0 or k < 2 or not anchors:
        return [f for f, _ in ranked[:k]], []
    chosen, taken = list(anchors), []
    seen = {*anchors, *skip}
    beside = adjacent(anchors)
    for anchor in anchors:
        for fact_id in beside.get(anchor, ()):
            if len(chosen) < k and fact_id not in seen:
                chosen.append(fact_id)
                taken.append(fact_id)
                seen.add(fact_id)
    for fact_id, _ in ranked[len(anchors):]:
        if len(chosen) >= k:
            break
        if fact_id not in seen:
            chosen.append(fact_id)
            seen.add(fact_id)
    return chosen, taken


def scored(ranked: Sequence[tuple[FactId, float]], k: int, share: float,
           adjacent: Callable[[list[FactId]], Mapping[FactId, Sequence[FactId]]],
           skip: Collection[FactId], scores: Callable[[list[FactId]], Sequence[float]]
           ) -> tuple[list[tuple[FactId, float]], list[FactId]]:
    """with_neighbors, each chosen fact with its cosine (`scores`: the neighbors' cosines)."""
    ids, taken = with_neighbors(ranked, k, share, adjacent, skip)
    cosine = dict(ranked)
    if taken:
        cosine.update(zip(taken, scores(taken), strict=True))
    return [(f, cosine[f]) for f in ids], taken
