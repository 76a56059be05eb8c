"""The preamble cache: the KV of system-prompt preambles, shared by every user's requests.

A request's KV starts with its preamble (everything before the memory block), taken from the
slab too, so serving never depends on vLLM's prefix cache. The configured preamble stays for
good; requests with their own system prompt (agents, chat engines) get theirs encoded on first
use, at most MAX_PREAMBLES of them, least recently used first out, and they are the first KV
evicted when the slab is full.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence

from inferscale_engine.errors import SlabFullError
from inferscale_engine.facts import FactId
from inferscale_engine.protocol.plan import SYSTEM_OWNER, pack_token_ids, token_digest
from inferscale_engine.runtime.residency import Residency
from inferscale_engine.runtime.runner import WorkerClient
from inferscale_engine.runtime.write_path import FactWriter


class PreambleCache:
    """Slab entries of preambles by token digest; LRU beyond the configured one."""

    MAX_PREAMBLES = 16
    """Distinct preambles kept besides the configured one. Agents and chat engines send one
    per tool set or per retrieved context, so they must not accumulate until the slab is full."""

    def __init__(self, writer: FactWriter, residency: Residency, workers: WorkerClient,
                 counters: Counter[str], default: Sequence[int]) -> None:
        self._writer = writer
        self._residency = residency
        self._workers = workers
        self._counters = counters
        self._entries: OrderedDict[str, tuple[int, tuple[int, ...]]] = OrderedDict()
        self._default = token_digest(default)
        self._in_batch: set[str] = set()
        """Preambles of the batch being built: never evicted for another one of it."""
        self._memo: tuple[tuple[int, ...], str, bytes | None] | None = None
        """The last preamble tuple, its digest and (once asked) its packed ids."""

    def __len__(self) -> int:
        return len(self._entries)

    def key(self, preamble: Sequence[int], pinned: set[FactId] | None = None) -> int:
        """Slab key of a preamble, encoded on first use.

        Args:
            pinned: facts of the batch being built (never evicted to make room).

        Raises:
            SlabFullError: not even the preamble fits.
        """
        digest = self._digest(preamble)
        self._in_batch.add(digest)
        entry = self._entries.get(digest)
        if entry is not None:
            self._entries.move_to_end(digest)
            return entry[0]
        self.evict(self.MAX_PREAMBLES - 1)
        try:
            key, pages = self._writer.save_preamble(SYSTEM_OWNER, preamble, set(pinned or ()))
        except SlabFullError:
            self.evict(0)
            key, pages = self._writer.save_preamble(SYSTEM_OWNER, preamble, set(pinned or ()))
        self._entries[digest] = (key, pages)
        return key

    def run(self, preamble: Sequence[int]) -> bytes:
        """The preamble's ids packed as a plan's first run (pack_token_ids), once per preamble."""
        memo = self._memo
        if memo is None or preamble is not memo[0]:
            return pack_token_ids(preamble)
        packed = memo[2]
        if packed is None:
            packed = pack_token_ids(preamble)
            self._memo = (memo[0], memo[1], packed)
        return packed

    def _digest(self, preamble: Sequence[int]) -> str:
        """token_digest, remembered for the last preamble tuple.

        The prompt builder hands out one tuple per system prompt, so requests repeat the same
        object: an identity test instead of hashing its ids (~30 us with cold caches).
        """
        memo = self._memo
        if memo is not None and preamble is memo[0]:
            return memo[1]
        digest = token_digest(preamble)
        if type(preamble) is tuple:  # immutable: safe to recognize by identity
            self._memo = (preamble, digest, None)
        return digest

    def end_batch(self) -> None:
        """The batch was sent: its preambles may be evicted again."""
        self._in_batch.clear()

    def evict(self, keep: int) -> None:
        """Free least recently used preambles until at most `keep` evictable ones remain."""
        evictable = [d for d in self._entries if d != self._default and d not in self._in_batch]
        victims = evictable[:max(0, len(evictable) - keep)]
        if not victims:
            return
        keys = []
        for digest in victims:
            key, pages = self._entries.pop(digest)
            self._residency.free_pages(pages)
            keys.append(key)
        self._workers.free(keys)
        self._counters["evicted_preambles"] += len(keys)
