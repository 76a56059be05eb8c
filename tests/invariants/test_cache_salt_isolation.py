"""Invariant 4: injected KV never reaches a text request through vLLM's prefix cache."""

from __future__ import annotations

import pytest

from inferscale_engine.facts import MemoryHandle
from tests.conftest import (
    ARCHS,
    FACTS,
    QUESTIONS,
    greedy,
    max_abs_diff,
    plain_prefill,
    running_engine,
)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module", params=ARCHS)
def engine(request, tiny_models):
    # Block size 32 so that the shared prefix spans full blocks the prefix cache can hold.
    with running_engine(tiny_models[request.param], block_size=32) as eng:
        yield eng


def test_text_request_after_injected_request_gets_a_true_prefill(engine):
    ids = engine.add_facts("u1", FACTS[:4])  # encoded separately: injected KV is approximate
    handle = MemoryHandle("u1", tuple(ids))
    injected = engine.generate(handle, QUESTIONS[0], greedy(6), mode="kv")
    assert injected.plan_status == "inject"
    text = engine.generate(handle, QUESTIONS[0], greedy(6), mode="text")
    # Neither injected blocks nor the save requests' (salted per user) may be reused: this is
    # the first text request, so nothing of it is cached.
    save_prefix = len(engine.prompts.preamble()) + len(engine.prompts.fact_ids(FACTS[0]))
    assert text.num_cached_tokens == 0, "text request reused injected or saved blocks"
    # A never-seen salt makes a guaranteed plain prefill (no prefix-cache hit possible).
    prompt, _ = engine.prepare_request(handle, [{"role": "user", "content": QUESTIONS[0]}])
    reference = plain_prefill(engine, prompt.token_ids(), greedy(6))
    assert reference.num_cached_tokens == 0
    assert text.token_ids == reference.token_ids
    assert max_abs_diff(text.logprobs, reference.logprobs) <= 1e-5
    assert max_abs_diff(text.logprobs, injected.logprobs) > 1e-3  # contamination would show
    again = engine.generate(handle, QUESTIONS[0], greedy(6), mode="text")
    assert again.num_cached_tokens > save_prefix  # text requests do share their own blocks
    assert again.token_ids == text.token_ids


def test_salts_differ_between_users_and_plans(engine):
    a = engine.add_facts("ua", [FACTS[0]])
    b = engine.add_facts("ub", [FACTS[0]])
    salt = {
        name: engine.prepare_request(handle, [{"role": "user", "content": "hi"}])[1].cache_salt
        for name, handle in [("a", MemoryHandle("ua", tuple(a))),
                             ("b", MemoryHandle("ub", tuple(b))), ("a0", MemoryHandle("ua", ()))]
    }
    assert len(set(salt.values())) == 3


def test_an_unsalted_prompt_never_hits_a_saved_facts_blocks(engine):
    """The prefix-cache oracle: [preamble][fact] sent as plain text after the fact was saved
    gets no cached tokens beyond the preamble, and exactly what a wrong guess gets."""
    from vllm import TokensPrompt

    secret = "The door code is " + " ".join(f"{i:02d}" for i in range(24)) + "."
    engine.add_facts("victim", [secret])
    preamble = list(engine.prompts.preamble())

    def cached(text: str) -> int:
        ids = [*preamble, *engine.prompts.fact_ids(text), *engine.prompts.encode(" ok")]
        out = engine.llm.generate([TokensPrompt(prompt_token_ids=ids)], [greedy(1)],
                                  use_tqdm=False)[0]
        return out.num_cached_tokens or 0

    cached("Something else entirely.")  # text requests share the public preamble's blocks
    wrong = cached(secret.replace("door", "gate"))
    right = cached(secret)
    assert len(engine.prompts.fact_ids(secret)) >= 2 * 32  # the fact spans full blocks
    assert right == wrong and right <= len(preamble), (right, wrong, len(preamble))


def test_text_prompts_are_salted_per_user(engine):
    """Issue 52: a user's text prompt (text mode: the inspector's text answer, a fallback; no
    facts: the served model's infer=True prompts) carries the user's text_salt. The same
    user's repeat shares its blocks; another user's prompt repeating it exactly finds none of
    it cached, and an unsalted one (a request without memory) nothing beyond the public
    preamble."""
    from vllm import TokensPrompt

    def unsalted_cached(ids: list[int]) -> int:
        out = engine.llm.generate([TokensPrompt(prompt_token_ids=ids)], [greedy(1)],
                                  use_tqdm=False)[0]
        return out.num_cached_tokens or 0

    owner = MemoryHandle("text-a", tuple(engine.add_facts("text-a", [FACTS[1]])))
    other = MemoryHandle("text-b", tuple(engine.add_facts("text-b", [FACTS[1]])))
    question = [{"role": "user", "content": QUESTIONS[1]}]
    for mine, theirs in ((owner, other), (MemoryHandle("text-c", ()), MemoryHandle("text-d", ()))):
        ids = engine.render_prompt(mine, question).token_ids()
        assert ids == engine.render_prompt(theirs, question).token_ids()  # the same prompt
        first = engine.generate(mine, question, greedy(2), mode="text")
        assert engine.generate(mine, question, greedy(2), mode="text").num_cached_tokens > 0
        probe = engine.generate(theirs, question, greedy(2), mode="text")
        assert probe.num_prompt_tokens == first.num_prompt_tokens == len(ids)
        assert probe.num_cached_tokens == 0, "another user's text prompt hit this one's blocks"
        # unsalted prompts share the public preamble's blocks with each other, nothing more
        preamble = len(engine.prompts.preamble())
        assert len(ids) // 32 * 32 > preamble  # a cacheable block beyond the preamble
        assert unsalted_cached(ids) <= preamble, "an unsalted prompt hit a user's text prompt"
