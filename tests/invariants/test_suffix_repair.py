"""Suffix repair: the facts a layout repairs are prefilled as text after the injected ones.

Only a prefix of the prompt can be claimed, so a repaired request must claim exactly the
preamble and the facts it still injects; with every fact repaired (r = k) it IS text mode.
"""

from __future__ import annotations

import pytest

from inferscale_engine.errors import ConfigError
from inferscale_engine.facts import MemoryHandle
from inferscale_engine.prompting.layout import QUALITY_LAYOUT, USER_BLOCK_HEADER, Layout, arrange
from tests.conftest import FACTS, QUESTIONS, greedy, running_engine

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def engine(tiny_models):
    with running_engine(tiny_models["qwen2"]) as eng:
        yield eng


@pytest.fixture(scope="module")
def handle(engine):
    ids = engine.add_facts("rita", FACTS[:4])
    return MemoryHandle("rita", tuple(ids), (0.2, 0.9, 0.5, 0.7))  # best: 2nd, 4th, 3rd, 1st


@pytest.mark.parametrize("placement", ["memory", "user"])
def test_repairing_every_fact_is_text_mode_exactly(engine, handle, placement):
    layout = Layout(repair_facts=4, repair_placement=placement, repair_order="handle")
    kv = engine.generate(handle, QUESTIONS[0], greedy(6, logprobs=5), layout=layout)
    text = engine.generate(handle, QUESTIONS[0], greedy(6, logprobs=5), mode="text",
                           layout=layout)
    prompt, plan = engine.prepare_request(handle, QUESTIONS[0], layout=layout)
    assert kv.plan_status == "inject" and plan.num_tokens == len(prompt.preamble)
    assert kv.num_injected_tokens == len(prompt.preamble) and kv.num_repaired_facts == 4
    assert kv.token_ids == text.token_ids and kv.logprobs == text.logprobs  # bit for bit
    assert kv.first_token_logprobs == text.first_token_logprobs
    if placement == "memory":  # the same tokens as plain text mode, too
        plain = engine.generate(handle, QUESTIONS[0], greedy(6, logprobs=5), mode="text")
        assert plain.num_prompt_tokens == text.num_prompt_tokens
        assert plain.token_ids == text.token_ids and plain.logprobs == text.logprobs


def test_a_repaired_request_claims_only_the_unrepaired_prefix(engine, handle):
    layout = Layout(repair_facts=2)
    prompt, plan = engine.prepare_request(handle, QUESTIONS[1], layout=layout)
    facts = [engine._facts[f].fact.token_ids for f in handle.fact_ids]
    assert prompt.facts == (facts[0], facts[2])  # injected, in handle order
    assert prompt.repaired == (facts[1], facts[3])  # the two most relevant, best first
    assert plan.num_tokens == len(prompt.preamble) + len(facts[0]) + len(facts[2])
    out = engine.generate(handle, QUESTIONS[1], greedy(4), layout=layout)
    assert out.plan_status == "inject" and out.num_injected_tokens == plan.num_tokens
    assert out.num_repaired_facts == 2
    assert out.num_repaired_tokens == len(facts[1]) + len(facts[3])
    text = engine.generate(handle, QUESTIONS[1], greedy(4), mode="text", layout=layout)
    assert text.num_prompt_tokens == out.num_prompt_tokens == len(prompt.token_ids())
    assert engine.stats().counters["repaired_facts"] >= 2


def test_user_placement_writes_a_block_before_the_question(engine, handle):
    layout = Layout(repair_facts=1, repair_placement="user")
    prompt, plan = engine.prepare_request(handle, QUESTIONS[2], layout=layout)
    tail = engine.tokenizer.decode(prompt.rest)
    best = engine._facts[handle.fact_ids[1]].fact.text
    assert tail.index(USER_BLOCK_HEADER) < tail.index(best) < tail.index(QUESTIONS[2])
    assert len(prompt.facts) == 3 and not prompt.repaired
    assert plan.num_tokens == len(prompt.preamble) + sum(map(len, prompt.facts))


def test_quality_layout_moves_the_two_best_facts_before_the_question(engine, handle):
    prompt, plan = engine.prepare_request(handle, QUESTIONS[2], layout=QUALITY_LAYOUT)
    tail = engine.tokenizer.decode(prompt.rest)
    texts = [engine._facts[f].fact.text for f in handle.fact_ids]
    assert len(prompt.facts) == len(texts) - 2 and plan.num_tokens == len(prompt.preamble) + sum(
        map(len, prompt.facts))
    assert sum(t in tail for t in texts) == 2 and tail.index(USER_BLOCK_HEADER) < tail.index(
        QUESTIONS[2])


def test_also_inject_keeps_every_fact_and_repeats_the_best(engine, handle):
    layout = Layout(repair_facts=1, repair_also_inject=True)
    prompt, _ = engine.prepare_request(handle, QUESTIONS[0], layout=layout)
    assert len(prompt.facts) == 4 and prompt.repaired == (prompt.facts[1],)


def test_text_facts_are_written_as_text_whatever_r_and_never_injected(engine, handle):
    """A fact with no KV yet (an asynchronous add's) joins the repaired facts as text."""
    facts = [engine._facts[f].fact.token_ids for f in handle.fact_ids]
    pending = frozenset({handle.fact_ids[0]})  # the least relevant one
    alone = Layout(text_facts=pending)  # no r of its own: only that fact is text
    prompt, plan = engine.prepare_request(handle, QUESTIONS[0], layout=alone)
    assert prompt.facts == tuple(facts[1:]) and prompt.repaired == (facts[0],)
    first_plan = plan
    assert plan.num_tokens == len(prompt.preamble) + sum(map(len, facts[1:]))
    with_r = Layout(repair_facts=2, text_facts=pending)  # r=2 among the others, plus it
    prompt, _ = engine.prepare_request(handle, QUESTIONS[0], layout=with_r)
    assert prompt.facts == (facts[2],) and prompt.repaired == (facts[1], facts[3], facts[0])
    also = Layout(repair_facts=1, repair_also_inject=True, text_facts=pending)
    prompt, _ = engine.prepare_request(handle, QUESTIONS[0], layout=also)
    assert prompt.facts == tuple(facts[1:]) and prompt.repaired == (facts[1], facts[0])
    # the same prompt as its text prefill; the other facts' KV injected
    kv = engine.generate(handle, QUESTIONS[0], greedy(4), layout=alone)
    text = engine.generate(handle, QUESTIONS[0], greedy(4), mode="text", layout=alone)
    assert kv.plan_status == "inject" and kv.num_repaired_facts == 1
    assert kv.num_injected_tokens == first_plan.num_tokens
    assert kv.num_prompt_tokens == text.num_prompt_tokens
    # every fact pending: text mode exactly, bit for bit
    every = Layout(text_facts=frozenset(handle.fact_ids), repair_order="handle")
    kv = engine.generate(handle, QUESTIONS[0], greedy(6, logprobs=5), layout=every)
    text = engine.generate(handle, QUESTIONS[0], greedy(6, logprobs=5), mode="text",
                           layout=every)
    assert kv.num_repaired_facts == 4 and kv.token_ids == text.token_ids
    assert kv.logprobs == text.logprobs
    with pytest.raises(ConfigError, match="text_facts"):
        Layout(text_facts={1, 2})  # type: ignore[arg-type]


def test_bad_settings_are_refused_clearly(engine, handle):
    with pytest.raises(ConfigError, match="repair_facts=-1"):
        Layout(repair_facts=-1)
    with pytest.raises(ConfigError, match="repair_placement='end'"):
        Layout(repair_placement="end")
    with pytest.raises(ConfigError, match="repair_facts=5 is more than the 4 facts"):
        engine.generate(handle, QUESTIONS[0], greedy(2), layout=Layout(repair_facts=5))
    from tests.conftest import engine_config
    with pytest.raises(ConfigError, match=r"\(256 \+ 900 \+ 0\) must be below max_model_len"):
        engine_config(engine.config.model, context_window_tokens=900)


def test_arrange_ranks_budgets_and_orders():
    ids, lengths = [11, 5, 9, 7], [10, 20, 30, 40]
    scores = (0.1, 0.9, 0.5, 0.7)
    assert arrange(Layout(), ids, lengths, scores) == ([0, 1, 2, 3], [])
    assert arrange(Layout(repair_facts=2), ids, lengths, scores) == ([0, 2], [1, 3])
    assert arrange(Layout(repair_facts=2), ids, lengths) == ([2, 3], [0, 1])  # handle order
    assert arrange(Layout(repair_facts=2, repair_order="handle"), ids, lengths, scores) == (
        [0, 2], [1, 3])
    assert arrange(Layout(repair_facts=3, repair_order="handle"), ids, lengths, scores) == (
        [0], [1, 2, 3])
    assert arrange(Layout(repair_token_budget=65), ids, lengths, scores) == ([0, 2], [1, 3])
    assert arrange(Layout(repair_token_budget=19), ids, lengths, scores) == ([0, 1, 2, 3], [])
    assert arrange(Layout(fact_order="added"), ids, lengths, scores) == ([1, 3, 2, 0], [])
    assert arrange(Layout(repair_facts=1, repair_also_inject=True), ids, lengths, scores) == (
        [0, 1, 2, 3], [1])
