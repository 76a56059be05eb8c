"""Invariant 6: the connector never trusts a plan. Wrong ids, a bad MAC, a missing salt or
malformed params claim 0 tokens; vLLM prefills normally and the output equals text mode."""

from __future__ import annotations

import copy

import pytest

from inferscale_engine.facts import MemoryHandle
from inferscale_engine.runtime.generation import from_output as _generation
from tests.conftest import ARCHS, FACTS, QUESTIONS, greedy, running_engine

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module", params=ARCHS)
def engine(request, tiny_models):
    with running_engine(tiny_models[request.param]) as eng:
        yield eng


def send(engine, ids: list[int], params: dict | None, salt: str | None):
    from vllm import TokensPrompt

    sampling = greedy(6)
    if params is not None:
        sampling.extra_args = {"kv_transfer_params": params}
    prompt = TokensPrompt(prompt_token_ids=ids, cache_salt=salt) if salt else TokensPrompt(
        prompt_token_ids=ids)
    out = engine.llm.generate([prompt], [sampling], use_tqdm=False)[0]
    return _generation(out, "kv" if params else "text", len(ids), 0.0)


def prepare(engine, user: str):
    """(prompt ids, signed plan) of three facts of `user` and a question."""
    ids = engine.add_facts(user, FACTS[:3])
    prompt, plan = engine.prepare_request(MemoryHandle(user, tuple(ids)),
                                          [{"role": "user", "content": QUESTIONS[0]}])
    return prompt.token_ids(), plan


@pytest.fixture()
def prepared(engine, request):
    return prepare(engine, f"user-{request.node.name}")


def _injected_tokens(engine) -> int:
    return engine.stats().workers[0].get("injected_tokens", 0)


def test_valid_plan_is_injected(engine, prepared):
    ids, plan = prepared
    out = send(engine, ids, plan.to_params(), plan.cache_salt)
    assert out.plan_status == "inject" and out.num_injected_tokens == plan.num_tokens


def test_prompt_ids_differing_from_the_plan_claim_nothing_and_match_text_mode(engine, prepared):
    ids, plan = prepared
    altered = list(ids)
    position = plan.segments[2].start + 2  # inside the second fact
    altered[position] = (altered[position] + 1) % len(engine.tokenizer)
    before = _injected_tokens(engine)
    out = send(engine, altered, plan.to_params(), plan.cache_salt)
    text = send(engine, altered, None, None)
    # The MAC is computed over the prompt's ids (the plan carries none): another prompt fails
    # it exactly as a forged plan does.
    assert out.plan_status == "rejected" and out.num_injected_tokens == 0
    assert _injected_tokens(engine) == before
    assert out.token_ids == text.token_ids and out.logprobs == text.logprobs


def test_forged_mac_is_rejected(engine, prepared):
    ids, plan = prepared
    params = copy.deepcopy(plan.to_params())
    params["inferscale"]["user"] = "someone-else"
    out = send(engine, ids, params, plan.cache_salt)
    text = send(engine, ids, None, None)
    assert out.plan_status == "rejected" and out.num_injected_tokens == 0
    assert out.token_ids == text.token_ids and out.logprobs == text.logprobs


def test_unsalted_prompt_is_not_injected(engine, prepared):
    ids, plan = prepared
    out = send(engine, ids, plan.to_params(), None)
    assert out.plan_status == "mismatch" and out.num_injected_tokens == 0


@pytest.mark.parametrize("params", [
    {"inferscale": "not a mapping"},
    {"inferscale": {"v": 99}},
    {"inferscale": {"v": 2, "kind": "inject", "user": "u", "salt": "s", "keys": [1],
                    "lengths": [1], "tokens": "+////w==", "mac": "x"}},
    {"inferscale": {"v": 1, "kind": "teleport"}},
])
def test_malformed_params_are_rejected_and_the_engine_keeps_serving(engine, prepared, params):
    ids, plan = prepared
    out = send(engine, ids, params, plan.cache_salt)
    text = send(engine, ids, None, None)
    assert out.plan_status == "rejected" and out.num_injected_tokens == 0
    assert out.token_ids == text.token_ids
    assert send(engine, ids, plan.to_params(), plan.cache_salt).plan_status == "inject"
