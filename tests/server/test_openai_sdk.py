"""The openai SDK against `inferscale serve`: chat and completions, streaming and not, answered
from the user's injected KV; the headers, the `memory` field and /metrics all say so."""

from __future__ import annotations

import time

import pytest
from openai import OpenAI

from inferscale_engine.checks import has_visible
from tests.conftest import FACTS
from tests.server.conftest import MAX_TOKENS, metric, wait_metric
from tests.server.process import KEYS

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

INJECTED = "inferscale_injected_tokens_total"


@pytest.fixture()
def openai_a(server) -> OpenAI:
    return OpenAI(base_url=server.base_url + "/v1", api_key=KEYS["a"], max_retries=0,
                  timeout=60)


@pytest.fixture()
def facts(client_a, user_a) -> list[int]:
    """The user's facts, stored and encoded by the server."""
    return [int(r.fact_id) for r in client_a.add(user_id=user_a, texts=FACTS)]


def _check_served(headers, facts: list[int], status: str) -> int:
    injected = int(headers["x-inferscale-injected-tokens"])
    assert headers["x-inferscale-plan-status"] == status and injected > 0
    assert 0 < int(headers["x-inferscale-facts"]) <= 3
    return injected


def test_chat_answers_from_injected_kv(server, model, openai_a, user_a, facts):
    before = metric(server, INJECTED)
    raw = openai_a.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "Who has a turtle?"}],
        user=user_a, extra_body={"memory": {"k": 3}}, max_tokens=MAX_TOKENS, temperature=0)
    completion = raw.parse()
    memory = completion.model_extra["memory"]
    assert memory["user_id"] == user_a and memory["plan_status"] == "inject"
    assert memory["facts"] == 3 and set(memory["fact_ids"]) <= set(facts)
    assert facts[3] in memory["fact_ids"]  # the turtle fact is retrieved
    assert _check_served(raw.headers, facts, "inject") == memory["injected_tokens"]
    assert completion.choices[0].message.content
    assert completion.model_extra.get("kv_transfer_params") is None  # never sent back
    after = wait_metric(server, INJECTED, before + memory["injected_tokens"])
    assert after >= before + memory["injected_tokens"]


def test_chat_streams_from_injected_kv(server, model, openai_a, user_a, facts):
    before = metric(server, INJECTED)
    stream = openai_a.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Where did Bob go?"}],
        extra_headers={"X-User-Id": user_a}, extra_body={"memory": {"k": 2}},
        max_tokens=MAX_TOKENS, temperature=0, stream=True)
    planned = _check_served(stream.response.headers, facts, "planned")
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text
    assert wait_metric(server, INJECTED, before + planned) >= before + planned


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completions_answer_from_injected_kv(server, model, openai_a, user_a, facts, stream):
    before = metric(server, INJECTED)
    raw = openai_a.completions.with_raw_response.create(
        model=model, prompt="Alice likes", max_tokens=MAX_TOKENS, temperature=0, stream=stream,
        extra_body={"memory": {"user_id": user_a, "k": 1}})
    injected = _check_served(raw.headers, facts, "planned" if stream else "inject")
    result = raw.parse()
    if stream:
        text = "".join(chunk.choices[0].text for chunk in result)
    else:
        text = result.choices[0].text
        assert result.model_extra["memory"]["fact_ids"] == [facts[0]]
    assert text
    assert wait_metric(server, INJECTED, before + injected) >= before + injected


def test_without_a_user_or_with_memory_off_nothing_is_injected(model, openai_a, user_a, facts):
    for extra in ({}, {"user": user_a, "extra_body": {"memory": {"enabled": False}}}):
        raw = openai_a.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=1, **extra)
        assert raw.headers["x-inferscale-plan-status"] == "off"
        assert raw.headers["x-inferscale-injected-tokens"] == "0"
        assert raw.parse().model_extra["memory"]["fact_ids"] == []


def test_write_saves_the_exchange_after_the_response(model, openai_a, client_a, user_a):
    question = "Remember that my piano is called Clara."
    completion = openai_a.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], user=user_a,
        extra_body={"memory": {"write": True, "session_id": "s1"}}, max_tokens=MAX_TOKENS)
    answer = completion.choices[0].message.content.strip()
    deadline = time.monotonic() + 120  # a bound on waiting for the background add, not speed
    stored = {}
    while question not in stored and time.monotonic() < deadline:
        time.sleep(0.3)
        stored = {f.text: f.fact_id for f in client_a.get_all(user_id=user_a)}
    assert question in stored, "the exchange was not written back"
    assert client_a.get(user_id=user_a, fact_id=stored[question]).session_id == "s1"
    assert answer in stored or not has_visible(answer)
