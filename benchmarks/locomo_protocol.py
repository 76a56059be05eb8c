"""Which LoCoMo questions a run answers: the dev/test split by conversation and the samples.

Protocol (docs/benchmarks.md, "Answer quality"): tune on the dev fold with grids fixed in
advance, report the test fold once. The split is by conversation, so no fact or question of a
test conversation is ever seen while tuning:
  dev   conv-26 and conv-30 (233 questions of categories 1-4), all questions
  test  the other eight conversations (1,307 questions); a seeded sample of N questions
        stratified by category with proportional allocation (largest remainders)
Everything here is deterministic: the same arguments select the same questions on any machine.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from benchmarks.locomo_data import Conversation, Question

DEV_CONVERSATIONS = ("conv-26", "conv-30")
SPLITS = ("dev", "test")

T = TypeVar("T")


def split_of(sample_id: str) -> str:
    """'dev' or 'test': the fold a conversation belongs to."""
    return "dev" if sample_id in DEV_CONVERSATIONS else "test"


def fold(conversations: Sequence[Conversation], split: str) -> list[Conversation]:
    """The conversations of one fold, in dataset order."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: use one of {SPLITS}")
    return [c for c in conversations if split_of(c.sample_id) == split]


def proportional_allocation(sizes: Mapping[Hashable, int], total: int) -> dict[Hashable, int]:
    """Split `total` draws over strata in proportion to their sizes (largest remainders).

    Each stratum gets floor(total * size / sum) and the leftover draws go to the largest
    fractional parts (ties: the larger stratum, then the smaller key). Never more than a
    stratum holds; total >= sum(sizes) takes everything.
    """
    population = sum(sizes.values())
    if total >= population:
        return dict(sizes)
    quotas = {key: total * size / population for key, size in sizes.items()}
    out = {key: int(q) for key, q in quotas.items()}
    leftover = total - sum(out.values())
    order = sorted(sizes, key=lambda key: (-(quotas[key] - out[key]), -sizes[key], str(key)))
    for key in order[:leftover]:
        out[key] += 1
    return out


def stratified_sample(items: Sequence[T], total: int, seed: int | str,
                      stratum: Callable[[T], Hashable]) -> list[T]:
    """A seeded sample of `total` items, stratified by `stratum`, in the items' order.

    Each stratum is shuffled with its own seeded generator and its first `quota` items are
    taken, so a larger total extends a smaller one's sample whenever no quota shrinks.
    """
    groups: dict[Hashable, list[int]] = {}
    for position, item in enumerate(items):
        groups.setdefault(stratum(item), []).append(position)
    quotas = proportional_allocation({key: len(g) for key, g in groups.items()}, total)
    chosen: list[int] = []
    for key, positions in groups.items():
        shuffled = list(positions)
        random.Random(f"{seed}/stratum/{key}").shuffle(shuffled)
        chosen += shuffled[:quotas[key]]
    return [items[p] for p in sorted(chosen)]


@dataclass(frozen=True, slots=True)
class Selection:
    """The questions of a run, grouped by conversation (dataset order)."""

    split: str | None
    """'dev', 'test', or None for an ad-hoc --conversations run."""
    groups: tuple[tuple[Conversation, tuple[Question, ...]], ...]

    @property
    def keys(self) -> set[tuple[str, int]]:
        """(conversation, question index) of every selected question."""
        return {(conv.sample_id, q.index) for conv, qs in self.groups for q in qs}

    @property
    def num_questions(self) -> int:
        return sum(len(qs) for _, qs in self.groups)


def select(conversations: Sequence[Conversation], *, split: str | None,
           names: Sequence[str] | None, categories: Sequence[int], seed: int,
           max_per_conversation: int = 0, test_questions: int = 400) -> Selection:
    """The questions a run answers.

    Args:
        split: 'dev' (every question of the dev conversations) or 'test' (a category-stratified
            sample of `test_questions` over the test conversations); ignored with `names`.
        names: ad-hoc conversations (sample ids like 'conv-26', indices '0'-'9', or ['all']),
            or None.
        categories: question categories kept.
        max_per_conversation: dev / ad-hoc only: a seeded sample of this many per
            conversation (0 = all), for smoke runs.
        test_questions: size of the test sample (0 = all of the fold).
    """
    if names is not None:
        names = [str(i) for i in range(len(conversations))] if list(names) == ["all"] else names
        by_id = {c.sample_id: c for c in conversations}
        unknown = [n for n in names if not n.isdigit() and n not in by_id]
        if unknown:
            raise ValueError(f"unknown conversations {unknown}; known: {sorted(by_id)}")
        chosen = [conversations[int(n)] if n.isdigit() else by_id[n] for n in names]
        split = None
    else:
        chosen = fold(conversations, split or "dev")
    pool = [(conv, q) for conv in chosen for q in conv.questions if q.category in categories]
    if split == "test":
        if max_per_conversation:
            raise ValueError("the test fold is sampled by --test-questions, not --max-questions")
        if test_questions:
            pool = stratified_sample(pool, test_questions, f"{seed}/test",
                                     lambda item: item[1].category)
    elif max_per_conversation:
        kept = []
        for conv in chosen:
            mine = [(c, q) for c, q in pool if c is conv]
            if max_per_conversation < len(mine):
                rng = random.Random(f"{seed}/{conv.sample_id}")
                mine = sorted(rng.sample(mine, max_per_conversation), key=lambda i: i[1].index)
            kept += mine
        pool = kept
    groups = tuple((conv, tuple(q for c, q in pool if c is conv)) for conv in chosen)
    return Selection(split, tuple((conv, qs) for conv, qs in groups if qs))
