"""ChatInferScale and InferScaleLLM on the real engine: every handle carrier, user checks,
the fallbacks to text mode (counted), tool calls and streaming."""

from __future__ import annotations

import dataclasses

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from llama_index.core.base.llms.types import ChatMessage

from inferscale_engine.errors import HandleError, InvalidRequestError, SlabFullError
from inferscale_engine.protocol.handoff import PlanHandoff
from inferscale_integrations import ChatInferScale, InferScaleLLM
from inferscale_integrations.handles import make_handle_message
from inferscale_integrations.tools import format_tool_call
from tests.conftest import FACTS, QUESTIONS
from tests.integrations.conftest import MAX_TOKENS

pytestmark = pytest.mark.vllm


@pytest.fixture()
def handle(memory, user_id):
    memory.add(user_id=user_id, texts=FACTS[:3])
    return memory.search(user_id=user_id, query=QUESTIONS[0], k=2).handle


def test_every_carrier_reaches_the_engine(handle, sent, probe):
    llm = ChatInferScale(max_tokens=MAX_TOKENS)
    marker, extra = make_handle_message(handle)
    question = HumanMessage(QUESTIONS[0])
    llm.invoke([question], kv_handles=[handle.to_dict()])  # call kwargs
    llm.bind(kv_handles=[handle]).invoke([question])  # bound kwargs
    llm.invoke([HumanMessage(marker, additional_kwargs=extra), question])  # message
    llm.invoke(f"Known: {marker}\n{QUESTIONS[0]}")  # marker in a string prompt
    assert [h for h, _, _ in sent] == [handle] * 4
    assert [m["content"] for m in sent[2][1]] == [QUESTIONS[0]]  # the carrier was dropped
    assert sent[3][1][-1]["content"] == f"Known: \n{QUESTIONS[0]}"
    probe.report("ChatInferScale via kwargs/bind/additional_kwargs/marker")
    assert probe.kv_requests == 4 and llm.counters["injected"] == 4


def test_foreign_handles_are_refused(handle, memory):
    memory.add(user_id="mallory", texts=["Mallory reads mail."])
    other = memory.search(user_id="mallory", query="mail", k=1).handle
    with pytest.raises(HandleError, match="several users"):
        ChatInferScale().invoke("q", kv_handles=[handle, other])
    with pytest.raises(HandleError, match="serves user_id='mallory'"):
        ChatInferScale(user_id="mallory").invoke("q", kv_handles=[handle])
    forged = dataclasses.replace(other, fact_ids=handle.fact_ids, scores=())  # alice's ids
    with pytest.raises(HandleError, match="does not belong"):
        InferScaleLLM().chat([ChatMessage(role="user", content="q")], kv_handles=[forged])


def test_injection_failure_falls_back_to_text_and_is_counted(handle, engine, monkeypatch):
    real = engine.generate

    def no_room(handle, messages, sampling=None, mode="kv", **options):
        if mode == "kv":
            raise SlabFullError("simulated: the facts do not fit in the slab")
        return real(handle, messages, sampling, mode, **options)

    monkeypatch.setattr(engine, "generate", no_room)
    llm = ChatInferScale(max_tokens=MAX_TOKENS)
    answer = llm.invoke(QUESTIONS[0], kv_handles=[handle])
    assert answer.response_metadata["mode"] == "text" and answer.content
    assert llm.counters["fallback_text"] == 1 and "injected" not in llm.counters


def test_a_refused_plan_is_served_as_text_and_counted(handle, engine, monkeypatch, probe):
    monkeypatch.setattr(engine._planner, "_secret", b"not the connector's key")  # the MAC fails
    monkeypatch.setattr(engine._planner, "handoff",  # in one process: another engine's reference
                        PlanHandoff(b"not the connector's key"))
    llm = InferScaleLLM(max_tokens=MAX_TOKENS)
    response = llm.chat([ChatMessage(role="user", content=QUESTIONS[0])], kv_handles=[handle])
    assert response.raw["plan_status"] == "rejected" and probe.injected_tokens == 0
    assert llm.counters["fallback_refused"] == 1 and "injected" not in llm.counters


def test_stale_handles_and_unknown_markers(handle, memory, user_id):
    memory.delete(user_id=user_id, fact_ids=[handle.fact_ids[0]])
    llm = ChatInferScale(max_tokens=MAX_TOKENS)
    answer = llm.invoke(f"[[inferscale:made-elsewhere]] {QUESTIONS[0]}", kv_handles=[handle])
    assert answer.response_metadata["plan_status"] == "inject"
    assert llm.counters["stale_facts"] == 1 and llm.counters["unknown_markers"] == 1


def test_options_are_checked(handle):
    llm = ChatInferScale(max_tokens=MAX_TOKENS)
    with pytest.raises(InvalidRequestError, match="unknown option"):
        llm.invoke("q", frequency_penalty=1.0)
    with pytest.raises(InvalidRequestError, match="serves only"):
        llm.invoke("q", model="another-model")
    with pytest.raises(InvalidRequestError, match="temperature"):
        llm.invoke("q", temperature=-1)
    marker, extra = make_handle_message(handle)
    with pytest.raises(InvalidRequestError, match="nothing to answer"):
        llm.invoke([HumanMessage(marker, additional_kwargs=extra)])


def test_stream_yields_as_the_engine_produces_with_usage_on_the_last_chunk(handle):
    import asyncio
    import time

    llm = ChatInferScale(max_tokens=12)
    whole = llm.invoke(QUESTIONS[1], kv_handles=[handle])
    stamps, chunks = [], []
    for chunk in llm.stream(QUESTIONS[1], kv_handles=[handle]):
        stamps.append(time.perf_counter())
        chunks.append(chunk)
    assert "".join(c.content for c in chunks) == whole.content
    assert sum(1 for c in chunks if c.content) >= 3 and stamps[0] < stamps[-1]
    assert chunks[-1].chunk_position == "last" and chunks[-1].usage_metadata["output_tokens"] == 12
    assert sum(1 for c in chunks if c.usage_metadata) == 1
    assert llm.counters["injected"] == 2  # the invoke and the stream, each counted once

    async def collect():
        return [c async for c in llm.astream(QUESTIONS[1], kv_handles=[handle])]

    assert "".join(c.content for c in asyncio.run(collect())) == whole.content


def test_tool_calls_are_parsed_from_the_answer(handle, engine, monkeypatch, sent):
    """The tiny model cannot write a tool call: the engine's answer is replaced after a real
    run, to check how ChatInferScale reads it."""
    real = engine.generate
    offered = []

    def calls_weather(*args, **kwargs):
        offered.append(kwargs.get("tools"))
        generation = real(*args, **kwargs)
        text = "Checking. " + format_tool_call("weather", {"city": "Oslo"})
        return dataclasses.replace(generation, text=text)

    monkeypatch.setattr(engine, "generate", calls_weather)

    @tool
    def weather(city: str) -> str:
        """Weather in a city."""
        return "sunny"

    llm = ChatInferScale(max_tokens=MAX_TOKENS).bind_tools([weather], kv_handles=[handle])
    message = llm.invoke(QUESTIONS[0])
    assert message.content == "Checking."
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("weather", {"city": "Oslo"})]
    assert [t["function"]["name"] for t in offered[-1]] == ["weather"]
    prompt, _ = engine.prepare_request(handle, QUESTIONS[0], tools=offered[-1])
    rendered = engine.tokenizer.decode(prompt.rest)  # the model's own template lists the tool
    assert '"name": "weather"' in rendered and "<tools>" in rendered
    assert sent[-1][0] == handle  # extra bind_tools kwargs were forwarded
