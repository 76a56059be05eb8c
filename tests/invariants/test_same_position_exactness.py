"""Invariant 1a: a fact injected where it was encoded reproduces a plain prefill (fp32)."""

from __future__ import annotations

import pytest

from inferscale_engine.facts import MemoryHandle
from tests.conftest import ARCHS, FACTS, QUESTIONS, greedy, max_abs_diff, running_engine

pytestmark = pytest.mark.vllm
TOLERANCE = 1e-5


@pytest.fixture(scope="module", params=ARCHS)
def engine(request, tiny_models):
    with running_engine(tiny_models[request.param], context_window_tokens=64) as eng:
        yield eng


def test_single_fact_at_encoding_position_matches_text_prefill(engine):
    (fact_id,) = engine.add_facts("u1", [FACTS[0]])
    handle = MemoryHandle("u1", (fact_id,))
    worst = 0.0
    for question in QUESTIONS:
        kv = engine.generate(handle, question, greedy(8), mode="kv")
        text = engine.generate(handle, question, greedy(8), mode="text")
        assert kv.plan_status == "inject"
        assert kv.num_injected_tokens == len(engine.prompts.preamble()) + len(
            engine.prompts.fact_ids(FACTS[0]))
        assert kv.token_ids == text.token_ids
        worst = max(worst, max_abs_diff(kv.logprobs, text.logprobs))
    print(f"\n[{engine.config.model}] same-position single fact: max |dlogprob| = {worst:.3e}")
    assert worst <= TOLERANCE


def test_context_window_encoding_is_exact_when_the_context_is_the_preceding_fact(engine):
    # Fact 2 is encoded after fact 1's exact tokens (W >= len(fact 1)), so in the plan
    # [fact 1][fact 2] both sit where and after what they were encoded: exact again.
    (first,) = engine.add_facts("u2", [FACTS[1]])
    (second,) = engine.add_facts("u2", [FACTS[2]], contexts=["- " + FACTS[1] + "\n"])
    handle = MemoryHandle("u2", (first, second))
    kv = engine.generate(handle, QUESTIONS[1], greedy(8), mode="kv")
    text = engine.generate(handle, QUESTIONS[1], greedy(8), mode="text")
    diff = max_abs_diff(kv.logprobs, text.logprobs)
    print(f"\n[{engine.config.model}] two facts, context-window encoded: max |dlogprob| = "
          f"{diff:.3e}")
    assert kv.plan_status == "inject" and kv.token_ids == text.token_ids
    assert diff <= TOLERANCE
