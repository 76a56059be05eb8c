"""Which facts have KV in the slab, where, and which to evict (least recently used first).

Facts are known to the engine whether or not their KV is resident: KV is a cache that can
always be rebuilt from the fact's token ids and the context it was encoded after. This module
is pure bookkeeping (no torch, no vLLM): the engine runs the save requests and frees worker
entries. SlabAllocator hands out slab pages; the worker only learns them from save plans.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass, field

from inferscale_engine.errors import SlabFullError
from inferscale_engine.facts import Fact, FactId
from inferscale_engine.protocol.plan import pack_token_ids


@dataclass(slots=True)
class FactRecord:
    """A fact, the context its KV is encoded after, and where that KV is (if anywhere)."""

    fact: Fact
    context_ids: tuple[int, ...]
    """Up to W tokens of preceding conversation (Context-Window Encoding)."""
    slab_key: int | None = None
    pages: tuple[int, ...] | None = None
    key_scale: tuple[float, ...] = ()
    """Key temperature the KV is encoded with (() = 1): kept so a re-encode matches."""
    host_key: int | None = None
    """Where the KV waits in host RAM after its demotion from the slab (tier_manager.py)."""
    host_pages: tuple[int, ...] | None = None
    packed_ids: bytes = field(init=False, repr=False)
    """fact.token_ids packed once (plan.pack_token_ids): a plan joins these, no per-token work."""
    packed_from: tuple[int, ...] = field(init=False, repr=False)
    """The very tuple packed_ids was packed from (a prompt built from it spells the plan)."""

    def __post_init__(self) -> None:
        self.packed_from = self.fact.token_ids
        self.packed_ids = pack_token_ids(self.packed_from)

    @property
    def resident(self) -> bool:
        """True if the fact's KV is in the slab."""
        return self.slab_key is not None


class Residency:
    """Slab pages of resident facts, allocated with LRU eviction."""

    def __init__(self, allocator: SlabAllocator, slab_keys: Iterator[int] | None = None,
                 held: Container[FactId] = frozenset()) -> None:
        """Keep the allocator.

        Args:
            slab_keys: where slab keys come from (shared by the engine's shards).
            held: facts never evicted, whatever a call protects (the users' pinned facts,
                pins.py).
        """
        self._allocator = allocator
        self._lru: OrderedDict[FactId, FactRecord] = OrderedDict()
        self._slab_keys = slab_keys if slab_keys is not None else itertools.count(1)
        self._held = held

    def next_slab_key(self) -> int:
        """A slab key never used before (keys are never reused, so stale plans fail closed)."""
        return next(self._slab_keys)

    @property
    def num_free_pages(self) -> int:
        """Unallocated slab pages."""
        return self._allocator.num_free_pages

    @property
    def held(self) -> Container[FactId]:
        """The facts never evicted (the users' pinned facts)."""
        return self._held

    @property
    def num_pages(self) -> int:
        """Slab pages in all."""
        return self._allocator.num_pages

    @property
    def num_resident(self) -> int:
        """Facts whose KV is in the slab."""
        return len(self._lru)

    def touch(self, records: Iterable[FactRecord]) -> None:
        """Mark resident records as just used."""
        for record in records:
            if record.resident:
                self._lru.move_to_end(record.fact.fact_id)

    def allocate(self, num_tokens: int, pinned: set[FactId], evict: bool
                 ) -> tuple[tuple[int, ...], list[FactRecord]]:
        """Pages for `num_tokens`, evicting least recently used unpinned facts if allowed.

        Neither `pinned` (the call's own facts) nor the held facts are evicted.

        Returns:
            The pages and the records evicted to make room (their worker entries must be freed).

        Raises:
            SlabFullError: it does not fit even after evicting everything unpinned; nothing was
                evicted or allocated.
        """
        needed = self._allocator.pages_needed(num_tokens)
        evicted: list[FactRecord] = []
        if needed > self._allocator.num_free_pages and evict:
            reclaimable = self._allocator.num_free_pages
            candidates = []
            for fact_id, record in self._lru.items():
                if reclaimable >= needed:
                    break
                if fact_id not in pinned and fact_id not in self._held and record.pages:
                    candidates.append(record)
                    reclaimable += len(record.pages)
            if reclaimable >= needed:
                for record in candidates:  # keep slab_key: the caller frees the worker entry
                    self._allocator.free(record.pages or ())
                    self._lru.pop(record.fact.fact_id, None)
                    record.pages = None
                evicted = candidates
        return self._allocator.allocate(num_tokens), evicted

    def can_fit(self, token_counts: Iterable[int], pinned: set[FactId], evict: bool) -> bool:
        """True if facts of these lengths fit, evicting every unpinned fact if allowed.

        Checked before a re-encode, so that a request that cannot fit evicts nothing.
        """
        needed = sum(self._allocator.pages_needed(n) for n in token_counts)
        reclaimable = sum(len(r.pages or ()) for fact_id, r in self._lru.items()
                          if fact_id not in pinned and fact_id not in self._held) if evict else 0
        return needed <= self._allocator.num_free_pages + reclaimable

    def admit(self, record: FactRecord, slab_key: int, pages: tuple[int, ...]) -> None:
        """Record that `record`'s KV now lives in `pages` under `slab_key`."""
        record.slab_key, record.pages = slab_key, pages
        self._lru[record.fact.fact_id] = record
        self._lru.move_to_end(record.fact.fact_id)

    def release(self, record: FactRecord) -> None:
        """Forget where `record`'s KV is and free its pages."""
        if record.pages is not None:
            self._allocator.free(record.pages)
        self._lru.pop(record.fact.fact_id, None)
        record.slab_key, record.pages = None, None

    def free_pages(self, pages: tuple[int, ...]) -> None:
        """Return pages that were allocated but never admitted."""
        self._allocator.free(pages)

    def check(self) -> None:
        """Internal consistency (tests): every allocated page belongs to one resident fact."""
        used = [p for r in self._lru.values() for p in (r.pages or ())]
        assert len(used) == len(set(used)), "a page belongs to two facts"
        assert self._allocator.num_free_pages + len(used) <= self._allocator.num_pages


class SlabAllocator:
    """App-side page allocator of the slab; mirrors what every worker stores."""

    def __init__(self, num_pages: int, page_tokens: int) -> None:
        self.num_pages = num_pages
        self.page_tokens = page_tokens
        self._free = list(range(num_pages - 1, -1, -1))  # pop() hands out low pages first

    @property
    def num_free_pages(self) -> int:
        """Pages not allocated."""
        return len(self._free)

    def pages_needed(self, num_tokens: int) -> int:
        """Pages a run of `num_tokens` tokens takes."""
        return -(-num_tokens // self.page_tokens)

    def allocate(self, num_tokens: int) -> tuple[int, ...]:
        """Pages for `num_tokens` tokens.

        Raises:
            SlabFullError: not enough free pages; nothing is allocated.
        """
        needed = self.pages_needed(num_tokens)
        if needed > len(self._free):
            raise SlabFullError(
                f"the KV slab is full: {num_tokens} tokens need {needed} pages, "
                f"{len(self._free)} of {self.num_pages} are free. Delete facts you no longer "
                "need or raise EngineConfig.slab_capacity_bytes."
            )
        return tuple(self._free.pop() for _ in range(needed))

    def free(self, pages: tuple[int, ...]) -> None:
        """Return pages to the free list."""
        self._free.extend(reversed(pages))
