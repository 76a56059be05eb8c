"""Residency: LRU eviction of slab pages, pinning, and the can-it-fit check (no vLLM)."""

from __future__ import annotations

import pytest

from inferscale_engine.errors import SlabFullError
from inferscale_engine.facts import Fact, FactId
from inferscale_engine.runtime.residency import FactRecord, Residency, SlabAllocator

PAGE_TOKENS = 4


def record(fact_id: int, num_tokens: int = PAGE_TOKENS) -> FactRecord:
    return FactRecord(Fact(FactId(fact_id), "u", f"fact {fact_id}", (1,) * num_tokens), ())


def admitted(residency: Residency, records: list[FactRecord]) -> list[FactRecord]:
    for rec in records:
        pages, evicted = residency.allocate(len(rec.fact.token_ids), set(), evict=False)
        assert evicted == []
        residency.admit(rec, residency.next_slab_key(), pages)
    return records


def test_least_recently_used_unpinned_facts_are_evicted_first():
    residency = Residency(SlabAllocator(3, PAGE_TOKENS))
    a, b, c = admitted(residency, [record(1), record(2), record(3)])
    residency.touch([a])  # LRU order now: b, c, a
    pages, evicted = residency.allocate(PAGE_TOKENS, pinned={FactId(2)}, evict=True)
    assert evicted == [c] and c.pages is None
    assert c.slab_key is not None  # kept: the caller frees the worker entry, then releases it
    d = record(4)
    residency.admit(d, residency.next_slab_key(), pages)
    assert residency.num_resident == 3 and residency.num_free_pages == 0
    residency.check()


def test_nothing_is_evicted_when_the_request_cannot_fit():
    residency = Residency(SlabAllocator(4, PAGE_TOKENS))
    admitted(residency, [record(1), record(2, 2 * PAGE_TOKENS)])  # 3 of 4 pages used
    assert residency.can_fit([PAGE_TOKENS], pinned=set(), evict=False)
    assert not residency.can_fit([2 * PAGE_TOKENS], pinned=set(), evict=False)
    assert residency.can_fit([4 * PAGE_TOKENS], pinned=set(), evict=True)
    assert not residency.can_fit([4 * PAGE_TOKENS], pinned={FactId(1)}, evict=True)
    assert not residency.can_fit([PAGE_TOKENS] * 5, pinned=set(), evict=True)
    with pytest.raises(SlabFullError, match="slab_capacity_bytes"):
        residency.allocate(4 * PAGE_TOKENS, pinned={FactId(1)}, evict=True)
    assert residency.num_resident == 2 and residency.num_free_pages == 1  # nothing evicted


def test_release_frees_pages_and_keys_are_never_reused():
    residency = Residency(SlabAllocator(2, PAGE_TOKENS))
    (a,) = admitted(residency, [record(1)])
    key = a.slab_key
    residency.release(a)
    assert not a.resident and residency.num_free_pages == 2 and residency.num_resident == 0
    assert residency.next_slab_key() > key
