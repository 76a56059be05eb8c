"""PinnedFacts: the facts their users pinned (Engine.pin, Memory.add(pinned=True)), and the caps.

A pinned fact is served first in every prompt of its user and its KV never leaves the slab
while it is pinned: Residency passes over it when it evicts (residency.py), the host tier keeps
its copy (tier_manager.py), and the read path puts it right after the preamble and never
repairs it as text (read_path.py). Two caps keep pins from crowding out everything else:

- per user, at most EngineConfig.max_pinned_tokens fact tokens, and at most half of
  max_model_len (every prompt of the user carries them, with room left for the chat);
- per engine (each data-parallel shard has its own slab), at most max_pinned_slab_fraction of
  the slab's pages (the rest holds retrieved facts).

Pure bookkeeping under the Engine's lock: no torch, no vLLM.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from inferscale_engine.config import EngineConfig
from inferscale_engine.errors import InvalidRequestError
from inferscale_engine.facts import FactId


class PinnedFacts:
    """Pinned fact ids per user, their tokens, and the slab pages they hold per engine."""

    def __init__(self, config: EngineConfig) -> None:
        self.max_tokens = min(config.max_pinned_tokens, config.max_model_len // 2)
        """The per-user cap in tokens (EngineConfig.max_pinned_tokens, at most half the
        longest prompt)."""
        self._fraction = config.max_pinned_slab_fraction
        self._page_tokens = config.slab_page_tokens
        self._tokens: dict[FactId, int] = {}
        self._by_user: dict[str, set[FactId]] = {}
        self._pages: Counter[int] = Counter()
        """Slab pages the pinned facts take, per engine rank."""

    def __contains__(self, fact_id: object) -> bool:
        return fact_id in self._tokens

    def __len__(self) -> int:
        return len(self._tokens)

    def of(self, user_id: str) -> list[FactId]:
        """The user's pinned facts in the order they were added (by fact id)."""
        return sorted(self._by_user.get(user_id, ()))

    def tokens_of(self, user_id: str) -> int:
        """Fact tokens the user's pinned facts hold."""
        return sum(self._tokens[f] for f in self._by_user.get(user_id, ()))

    def pages(self, rank: int) -> int:
        """Slab pages the pinned facts of engine `rank` hold."""
        return self._pages[rank]

    def check(self, user_id: str, rank: int, token_counts: Sequence[int], slab_pages: int,
              replacing: Iterable[FactId] = ()) -> None:
        """Refuse pinning facts of these lengths more for the user (rank: its engine).

        replacing: pinned facts that the new ones replace (not counted).

        Raises:
            InvalidRequestError: the user's pinned tokens or the engine's pinned pages would
                pass their cap; the message gives the numbers.
        """
        if not token_counts:
            return
        freed = [self._tokens[f] for f in set(replacing) if f in self._tokens]
        held, adding = self.tokens_of(user_id) - sum(freed), sum(token_counts)
        if held + adding > self.max_tokens:
            raise InvalidRequestError(
                f"pinning {len(token_counts)} fact(s) of {adding} tokens would give user "
                f"{user_id!r:.40} {held + adding} pinned tokens, over the cap of "
                f"{self.max_tokens} (EngineConfig.max_pinned_tokens, at most half of "
                "max_model_len); unpin or delete pinned facts, or pin shorter ones")
        limit = int(slab_pages * self._fraction)
        pages = self._pages[rank] + sum(self._pages_needed(n) for n in token_counts) - sum(
            self._pages_needed(n) for n in freed)
        if pages > limit:
            raise InvalidRequestError(
                f"pinned facts would hold {pages} of the slab's {slab_pages} pages, over "
                f"{limit} (EngineConfig.max_pinned_slab_fraction={self._fraction}); unpin "
                "facts, or raise slab_capacity_bytes or max_pinned_slab_fraction")

    def add(self, user_id: str, rank: int, facts: Iterable[tuple[FactId, int]]) -> None:
        """Pin (fact id, tokens) of the user (checked first with check())."""
        for fact_id, num_tokens in facts:
            if fact_id in self._tokens:
                continue
            self._tokens[fact_id] = num_tokens
            self._by_user.setdefault(user_id, set()).add(fact_id)
            self._pages[rank] += self._pages_needed(num_tokens)

    def discard(self, user_id: str, rank: int, fact_ids: Iterable[FactId]) -> list[FactId]:
        """Unpin these facts of the user (not pinned: ignored); returns those unpinned."""
        held = self._by_user.get(user_id, set())
        done = [f for f in dict.fromkeys(fact_ids) if f in held]
        for fact_id in done:
            held.discard(fact_id)
            self._pages[rank] -= self._pages_needed(self._tokens.pop(fact_id))
        if not held:
            self._by_user.pop(user_id, None)
        return done

    def _pages_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self._page_tokens)
