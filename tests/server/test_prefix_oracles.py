"""No prefix-cache membership oracle between tenants (issue 52).

vLLM shares prefix-cache blocks between prompts of one cache_salt and reports how many of a
prompt's tokens it found (`usage.prompt_tokens_details.cached_tokens`, on with
--enable-prompt-tokens-details; the inspector's `prefix_cached_tokens`). Tenant b's prompts
carry a code; tenant a, as an attacker would, sends a prompt that repeats b's token for token
and reads how much of it was cached. Every path gets no more than the public preamble, and
exactly what a wrong guess of the code gets. Each probe is checked to be able to see a hit:
the attacker's own repeat of it is cached. The paths: the inspector's text answer (probed
through /v1/completions and through the inspector itself), the served model's infer=True
extraction prompt, and a client's own cache_salt (kept, and combined with its tenant's).
"""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.server.conftest import auth

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def _code(name: str, seed: int) -> str:
    """A fact holding a code long enough to span full blocks of the prefix cache."""
    return f"The {name} code is " + " ".join(f"{(seed + 7 * i) % 100:02d}" for i in range(60)) + "."


@pytest.fixture(scope="module")
def prompts(tiny_models):
    """The prompt code of the server (`--model tiny`, default settings), in this process."""
    from inferscale_engine.config import EngineConfig
    from inferscale_engine.model.check import load_tokenizer
    from inferscale_engine.prompting.prompt import PromptBuilder

    config = EngineConfig(model=str(tiny_models["qwen2"]))
    return config, PromptBuilder(load_tokenizer(config), config.system_prompt,
                                 config.user_block_header)


def _text_prompt(prompts, question: str, fact: str) -> list[int]:
    """The ids of a text-mode answer to `question` with one fact: the server's layout."""
    from inferscale_engine.prompting.layout import arrange

    config, builder = prompts
    ids = builder.fact_ids(fact)
    injected, repaired = arrange(config.layout, [1], [len(ids)], (1.0,))
    messages = [{"role": "user", "content": question}]
    if config.layout.repair_placement == "user":
        prompt = builder.build(messages, [ids] * len(injected),
                               user_block=[fact] * len(repaired))
    else:
        prompt = builder.build(messages, [ids] * len(injected), repaired=[ids] * len(repaired))
    return list(prompt.token_ids())


def _probe(http: httpx.Client, model: str, ids: list[int]) -> tuple[int, int]:
    """cached_tokens of tenant a's completion of `ids` without memory, and of its repeat.

    Each probe has a cache_salt of its own, so that it finds none of the attacker's earlier
    probes (a wrong guess shares a prefix with the right one): before the fix the server
    dropped it, and every prompt met in one unsalted cache.
    """
    salt = f"probe-{uuid.uuid4().hex}"
    return (_cached(http, model, "a", ids, cache_salt=salt),
            _cached(http, model, "a", ids, cache_salt=salt))


def _cached(http: httpx.Client, model: str, tenant: str, ids: list[int], **extra) -> int:
    """cached_tokens of a completion of `ids` without memory, by `tenant`."""
    response = http.post("/v1/completions", headers=auth(tenant), json={
        "model": model, "prompt": ids, "max_tokens": 1, "memory": {"enabled": False},
        **extra})
    assert response.status_code == 200, response.text
    details = response.json()["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def _ask(http: httpx.Client, tenant: str, user: str, question: str) -> dict:
    response = http.post("/ui/api/ask", headers=auth(tenant), json={
        "user_id": user, "question": question, "k": 1, "max_tokens": 1})
    assert response.status_code == 200, response.text
    return response.json()


def _add(http: httpx.Client, tenant: str, user: str, text: str) -> None:
    added = http.post("/v1/memories", headers=auth(tenant), json={"user_id": user,
                                                                  "texts": [text]})
    assert added.status_code == 200, added.text


def _victim_asks(http: httpx.Client, prompts, user_b: str, name: str) -> tuple[str, str,
                                                                               list[int]]:
    """b's user stores a code and asks about it in the inspector: its text-mode prompt is in
    the cache. (question, fact, the prompt's ids as an attacker rebuilds them)."""
    question, secret = f"What is the {name} code?", _code(name, len(name))
    _add(http, "b", user_b, secret)
    asked = _ask(http, "b", user_b, question)
    ids = _text_prompt(prompts, question, secret)
    assert len(ids) == asked["text"]["prompt_tokens"]  # the attacker's copy is exact
    return question, secret, ids


def test_the_inspectors_text_answer_is_no_oracle_to_completions(http, model, prompts, user_b):
    question, secret, ids = _victim_asks(http, prompts, user_b, "locker")
    wrong = _text_prompt(prompts, question, secret.replace("locker", "garage"))
    preamble = len(prompts[1].preamble())
    (right, repeat), (guess, _) = _probe(http, model, ids), _probe(http, model, wrong)
    assert right == guess and right <= preamble, (right, guess, preamble, len(ids))
    assert repeat > preamble  # the probe sees a hit where there is one


def test_the_inspectors_text_answer_is_no_oracle_to_the_inspector(http, prompts, user_a,
                                                                   user_b):
    question, secret, ids = _victim_asks(http, prompts, user_b, "shed")
    preamble = len(prompts[1].preamble())
    _add(http, "a", user_a, secret)  # a's user stores the same fact, asks the same question
    mine = _ask(http, "a", user_a, question)["text"]
    assert mine["prompt_tokens"] == len(ids)
    assert mine["prefix_cached_tokens"] <= preamble, mine
    assert _ask(http, "a", user_a, question)["text"]["prefix_cached_tokens"] > preamble


def test_the_infer_extraction_prompt_is_no_oracle(http, model, prompts, user_a, user_b):
    from inferscale_engine.memory.infer import EXTRACT_SYSTEM, conversation_text

    def extraction(text: str) -> list[int]:
        turns = [{"role": "user", "content": text}]
        return list(prompts[1].build([{"role": "system", "content": EXTRACT_SYSTEM},
                                      {"role": "user", "content": conversation_text(turns)}],
                                     []).token_ids())

    secret = "My " + _code("safe", 5)
    added = http.post("/v3/memories/add/", headers=auth("b"), json={
        "user_id": user_b, "infer": True, "messages": [{"role": "user", "content": secret}]})
    assert added.status_code == 200, added.text
    ids, wrong = extraction(secret), extraction(secret.replace("safe", "door"))
    preamble = len(prompts[1].preamble([{"role": "system", "content": EXTRACT_SYSTEM}]))
    (right, repeat), (guess, _) = _probe(http, model, ids), _probe(http, model, wrong)
    assert right == guess and right <= preamble, (right, guess, preamble, len(ids))
    assert repeat > preamble  # the probe sees a hit where there is one


def test_a_clients_cache_salt_is_kept_and_combined_with_its_tenants(http, model, prompts,
                                                                    user_a):
    ids = list(prompts[1].encode(_code("vault", 11)))
    assert _cached(http, model, "a", ids, cache_salt="client-1") == 0
    assert _cached(http, model, "a", ids, cache_salt="client-1") > 0  # kept: its own blocks
    assert _cached(http, model, "a", ids, cache_salt="client-2") == 0  # apart from another
    assert _cached(http, model, "a", ids) == 0  # and from the tenant's unsalted requests
    assert _cached(http, model, "b", ids, cache_salt="client-1") == 0  # another tenant's
    # with memory too: the salt rides in the plan, which the connector still accepts
    _add(http, "a", user_a, _code("vault", 11))
    body = {"model": model, "user": user_a, "max_tokens": 1, "cache_salt": "client-1",
            "messages": [{"role": "user", "content": "What is the vault code?"}]}
    served = [http.post("/v1/chat/completions", headers=auth("a"), json=body).json()
              for _ in range(2)]
    assert all(s["memory"]["stripped_fields"] == [] for s in served)
    assert served[0]["memory"]["plan_status"] == "inject", served[0]["memory"]
    assert served[1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # kept
