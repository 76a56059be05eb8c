"""The LoCoMo protocol: dev/test split by conversation and the category-stratified sample."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from benchmarks.locomo_data import DEFAULT_DATA, load_conversations
from benchmarks.locomo_protocol import (
    DEV_CONVERSATIONS,
    fold,
    proportional_allocation,
    select,
    split_of,
    stratified_sample,
)


@dataclass(frozen=True)
class Item:
    position: int
    category: int


def items(sizes: dict[int, int]) -> list[Item]:
    out, position = [], 0
    for round_ in range(max(sizes.values())):  # interleaved, as categories are in the data
        for category, size in sizes.items():
            if round_ < size:
                out.append(Item(position, category))
                position += 1
    return out


def test_split_membership():
    assert DEV_CONVERSATIONS == ("conv-26", "conv-30")
    assert [split_of(c) for c in ("conv-26", "conv-30")] == ["dev", "dev"]
    assert {split_of(c) for c in ("conv-41", "conv-42", "conv-43", "conv-44", "conv-47",
                                  "conv-48", "conv-49", "conv-50")} == {"test"}
    with pytest.raises(ValueError):
        fold([], "train")


def test_proportional_allocation_uses_largest_remainders():
    locomo = {1: 282, 2: 321, 3: 96, 4: 841}
    # exact quotas 73.25, 83.38, 24.94, 218.44: floors sum to 398, the two largest remainders win
    assert proportional_allocation(locomo, 400) == {1: 73, 2: 83, 3: 25, 4: 219}
    for total in (0, 1, 7, 150, 999, 1539):
        got = proportional_allocation(locomo, total)
        assert sum(got.values()) == total
        for category, size in locomo.items():
            assert abs(got[category] - total * size / 1540) < 1
    assert proportional_allocation(locomo, 5000) == locomo
    assert proportional_allocation({"a": 1, "b": 1}, 1) == {"a": 1, "b": 0}  # tie: smaller key


def test_stratified_sample_is_deterministic_proportional_and_ordered():
    pool = items({1: 282, 2: 321, 3: 96, 4: 841})
    sample = stratified_sample(pool, 400, seed=0, stratum=lambda i: i.category)
    assert sample == stratified_sample(pool, 400, seed=0, stratum=lambda i: i.category)
    assert sample != stratified_sample(pool, 400, seed=1, stratum=lambda i: i.category)
    assert Counter(i.category for i in sample) == {1: 73, 2: 83, 3: 25, 4: 219}
    assert [i.position for i in sample] == sorted(i.position for i in sample)
    assert len(set(sample)) == 400
    smaller = stratified_sample(pool, 200, seed=0, stratum=lambda i: i.category)
    assert set(smaller) <= set(sample)  # a larger sample extends a smaller one
    assert stratified_sample(pool, 5000, seed=0, stratum=lambda i: i.category) == pool


@pytest.mark.skipif(not DEFAULT_DATA.exists(), reason="LoCoMo data not on this machine")
def test_folds_and_selection_on_the_data():
    conversations = load_conversations(DEFAULT_DATA)
    dev, test = fold(conversations, "dev"), fold(conversations, "test")
    assert [c.sample_id for c in dev] == list(DEV_CONVERSATIONS)
    assert len(test) == 8 and not {c.sample_id for c in dev} & {c.sample_id for c in test}
    cats = (1, 2, 3, 4)
    dev_sel = select(conversations, split="dev", names=None, categories=cats, seed=0)
    assert dev_sel.split == "dev" and dev_sel.num_questions == 233
    test_sel = select(conversations, split="test", names=None, categories=cats, seed=0,
                      test_questions=400)
    assert test_sel.split == "test" and test_sel.num_questions == 400
    assert {c.sample_id for c, _ in test_sel.groups} <= {c.sample_id for c in test}
    pool = Counter(q.category for c in test for q in c.questions)
    drawn = Counter(q.category for _, qs in test_sel.groups for q in qs)
    assert drawn == proportional_allocation(pool, 400)
    again = select(conversations, split="test", names=None, categories=cats, seed=0,
                   test_questions=400)
    assert again.keys == test_sel.keys
    adhoc = select(conversations, split="dev", names=["conv-41", "0"], categories=(2,), seed=0,
                   max_per_conversation=5)
    assert adhoc.split is None and [c.sample_id for c, _ in adhoc.groups] == ["conv-41",
                                                                              "conv-26"]
    assert all(len(qs) == 5 and {q.category for q in qs} == {2} for _, qs in adhoc.groups)
    with pytest.raises(ValueError):
        select(conversations, split="test", names=None, categories=cats, seed=0,
               max_per_conversation=3)
