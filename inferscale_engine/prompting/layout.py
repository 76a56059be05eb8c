"""Layout: where a handle's facts go in the prompt, and which are repaired as text.

vLLM's connector can only claim a PREFIX of the prompt, so the one repair that fits is a
suffix: the r facts most relevant to the query are prefilled as text after the injected ones
(at the end of the memory block, or as a block at the start of the last user turn), where they
attend to every injected fact and the question attends to them as it would in text mode.
r = k with placement 'memory' is text mode token for token (only the preamble is injected).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inferscale_engine.errors import ConfigError

PLACEMENTS = ("memory", "user")
ORDERS = ("rank", "handle")
FACT_ORDERS = ("handle", "added")
USER_BLOCK_HEADER = "More facts about the user, from earlier conversations:\n"
"""Default first line of the block of repaired facts in the user turn (placement 'user'),
worded to continue the default system prompt (EngineConfig.user_block_header). With
"More memories:\n" under that system prompt, Qwen2.5-Coder-0.5B answered "Where do I live?"
with the sister's city in kv AND text mode; the LoCoMo benchmark, whose system prompt speaks of
memories of a conversation, uses "More memories:\n"."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Prompt layout of memory facts.

    EngineConfig.layout is the default; a request may pass its own.
    """

    repair_facts: int = 0
    """r: the handle's r most relevant facts are prefilled as text after the injected ones
    (relevance: the handle's scores, else its order). 0: every fact is injected."""
    repair_token_budget: int | None = None
    """Adaptive r: repair the most relevant facts while their tokens fit this budget (and at
    most repair_facts of them, when that is > 0). None: a fixed r."""
    repair_placement: str = "memory"
    """'memory': at the end of the memory block; 'user': a block (EngineConfig.
    user_block_header) at the start
    of the last user turn, right before the question."""
    repair_order: str = "rank"
    """Order of the repaired facts: 'rank' (most relevant first) or 'handle' (as in the
    memory block)."""
    repair_also_inject: bool = False
    """Inject all facts AND repeat the repaired ones as text (instead of moving them)."""
    fact_order: str = "handle"
    """Order of the facts in the memory block: 'handle' (as given) or 'added' (by fact id,
    i.e. in the order they were added: chronological for a conversation)."""
    text_facts: frozenset[int] = frozenset()
    """Fact ids of this request written as text among the repaired facts whatever r (a fact
    whose KV is not ready yet: an asynchronous add's); never injected."""

    def __post_init__(self) -> None:
        if isinstance(self.repair_facts, bool) or not isinstance(self.repair_facts, int) or (
                self.repair_facts < 0):
            raise ConfigError(f"repair_facts={self.repair_facts!r} must be an int >= 0 (facts "
                              "prefilled as text after the injected ones)")
        if self.repair_token_budget is not None and (
                isinstance(self.repair_token_budget, bool)
                or not isinstance(self.repair_token_budget, int) or self.repair_token_budget < 0):
            raise ConfigError(f"repair_token_budget={self.repair_token_budget!r} must be None or "
                              "an int >= 0 (tokens of repaired facts per request)")
        if not isinstance(self.text_facts, frozenset) or not all(
                isinstance(f, int) and not isinstance(f, bool) for f in self.text_facts):
            raise ConfigError(f"text_facts={self.text_facts!r:.60} must be a frozenset of fact "
                              "ids")
        for name, allowed in (("repair_placement", PLACEMENTS), ("repair_order", ORDERS),
                              ("fact_order", FACT_ORDERS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name}={getattr(self, name)!r}; use one of {allowed}")

    @property
    def repairs(self) -> bool:
        """True if this layout may repair facts (its r or budget, or facts sent as text)."""
        return self.chooses_repairs or bool(self.text_facts)

    @property
    def chooses_repairs(self) -> bool:
        """True if this layout repairs the most relevant facts (repair_facts or a budget)."""
        return self.repair_facts > 0 or self.repair_token_budget is not None

    def check_handle_size(self, num_facts: int) -> None:
        """Refuse an r larger than the handle (a setting that cannot mean what it says).

        Raises:
            ConfigError: repair_facts > num_facts.
        """
        if self.repair_facts > num_facts and num_facts:
            raise ConfigError(f"repair_facts={self.repair_facts} is more than the {num_facts} "
                              "facts of the handle; lower it (r <= k)")


QUALITY_LAYOUT = Layout(repair_facts=2, repair_placement="user")
"""The default (EngineConfig.layout): the 2 most relevant facts repeated as text in a "More
memories:" block before the question, the rest injected. Chosen on the LoCoMo dev grid: about
the best text layout's answers at injection's TTFT (docs/benchmarks.md: the defaults'
figures).
"""


def arrange(layout: Layout, fact_ids: Sequence[int], lengths: Sequence[int],
            scores: Sequence[float] = ()) -> tuple[list[int], list[int]]:
    """Which facts of a handle are injected and which are repaired as text, in prompt order.

    Args:
        fact_ids: the handle's facts, in handle order.
        lengths: their token counts.
        scores: their relevance to the query (higher first); empty: the handle's order is the
            relevance order (search() returns best first).

    Returns:
        Indexes (into fact_ids) of the injected facts, in memory-block order, and of the
        repaired facts, in the order they are written.
    """
    count = len(fact_ids)
    block = list(range(count))
    if layout.fact_order == "added":
        block.sort(key=lambda i: fact_ids[i])
    if not layout.repairs or not count:
        return block, []
    by_rank = sorted(range(count), key=lambda i: -scores[i]) if len(scores) == count else list(
        range(count))
    as_text = {i for i in block if fact_ids[i] in layout.text_facts}
    chosen = set(as_text)
    if layout.chooses_repairs:  # the r most relevant of the others, within the budget
        limit = min(layout.repair_facts, count) if layout.repair_facts else count
        used = 0
        for i in [i for i in by_rank if i not in as_text][:limit]:
            budget = layout.repair_token_budget
            if budget is not None and used + lengths[i] > budget:
                break
            chosen.add(i)
            used += lengths[i]
    repaired = [i for i in (by_rank if layout.repair_order == "rank" else block) if i in chosen]
    injected = [i for i in block if i not in (as_text if layout.repair_also_inject else chosen)]
    return injected, repaired
