"""LlamaIndex chat engines and agents with KVMemory and InferScaleLLM on the real engine.

SimpleChatEngine (get() without input, stream_chat's put from a thread, async),
ContextChatEngine, CondensePlusContextChatEngine (its condense prompt carries the marker as
text), FunctionAgent and ReActAgent (scripted reading of the tiny model's answers).
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from llama_index.core.agent.workflow import FunctionAgent, ReActAgent
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.chat_engine import (
    CondensePlusContextChatEngine,
    ContextChatEngine,
    SimpleChatEngine,
)
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.core.tools import FunctionTool

from inferscale_integrations import InferScaleLLM, KVMemory
from inferscale_integrations.handles import HANDLES_KEY, MARKER_RE
from tests.conftest import FACTS, QUESTIONS
from tests.integrations.conftest import MAX_TOKENS
from tests.integrations.scripted import ScriptedInferScaleLLM, ScriptedReActParser

pytestmark = pytest.mark.vllm


class StaticRetriever(BaseRetriever):
    """Always the same document (retrieval is not the subject here)."""

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [NodeWithScore(node=TextNode(text="The museum opens at nine."), score=1.0)]


def lookup(query: str) -> str:
    """Look something up in the user's notes."""
    return f"notes about {query!r}: nothing new"


def test_simple_chat_engine_gets_without_input(memory, user_id, probe, sent, monkeypatch):
    memory.add(user_id=user_id, texts=FACTS[:3])
    llm = InferScaleLLM(max_tokens=MAX_TOKENS)
    kv = KVMemory(user_id=user_id, k=2)
    chat_engine = SimpleChatEngine.from_defaults(llm=llm, memory=kv)
    answer = chat_engine.chat(QUESTIONS[0])
    handle, messages, _ = sent[-1]
    # get() ran without input: the question came from the memory's own pending turn.
    assert messages[-1] == {"role": "user", "content": QUESTIONS[0]}
    assert all("[[inferscale:" not in m["content"] for m in messages)
    assert len(handle.fact_ids) == 2 and kv.turns[0]["fact_ids"][0] not in handle.fact_ids
    writers = []
    real_put = KVMemory.put
    monkeypatch.setattr(KVMemory, "put", lambda self, message: (
        writers.append(threading.get_ident()), real_put(self, message))[1])
    streamed = chat_engine.stream_chat(QUESTIONS[1])
    text = "".join(streamed.response_gen)  # returns after the writer thread joined
    assert writers[0] == threading.get_ident() != writers[1]  # the answer: put() in a thread
    probe.report("SimpleChatEngine chat + stream_chat")
    assert probe.kv_requests == 2 and probe.injected_tokens > 0 and llm.counters["injected"] == 2
    assert [(t["role"], t["content"]) for t in kv.turns] == [
        ("user", QUESTIONS[0]), ("assistant", answer.response),
        ("user", QUESTIONS[1]), ("assistant", text)]
    assert sent[-1][0].fact_ids[-2:] == tuple(f for t in kv.turns[:2] for f in t["fact_ids"])


async def test_simple_chat_engine_async(memory, user_id, probe):
    memory.add(user_id=user_id, texts=FACTS[:2])
    llm = InferScaleLLM(max_tokens=MAX_TOKENS)
    kv = KVMemory(user_id=user_id, k=2)
    chat_engine = SimpleChatEngine.from_defaults(llm=llm, memory=kv)
    answer = await chat_engine.achat(QUESTIONS[2])
    probe.report("SimpleChatEngine.achat")
    assert probe.injected_tokens > 0 and llm.counters["injected"] == 1
    assert [t["content"] for t in kv.turns] == [QUESTIONS[2], answer.response]


def test_context_chat_engine(memory, user_id, probe, sent):
    memory.add(user_id=user_id, texts=FACTS[:3])
    llm = InferScaleLLM(max_tokens=MAX_TOKENS)
    kv = KVMemory(user_id=user_id, k=2)
    chat_engine = ContextChatEngine.from_defaults(retriever=StaticRetriever(), llm=llm,
                                                  memory=kv)
    answer = chat_engine.chat(QUESTIONS[0])
    probe.report("ContextChatEngine")
    handle, messages, _ = sent[-1]
    assert handle is not None and len(handle.fact_ids) == 2
    assert "museum opens at nine" in messages[0]["content"]  # the retrieved context
    assert QUESTIONS[0] in messages[-1]["content"]
    assert probe.kv_requests == 1 and probe.injected_tokens > 0
    assert [t["content"] for t in kv.turns] == [QUESTIONS[0], answer.response]


def test_condense_plus_context_chat_engine_carries_the_marker(memory, user_id, probe, sent):
    memory.add(user_id=user_id, texts=FACTS[:3])
    llm = InferScaleLLM(max_tokens=MAX_TOKENS)
    kv = KVMemory(user_id=user_id, k=2)
    chat_engine = CondensePlusContextChatEngine.from_defaults(
        retriever=StaticRetriever(), llm=llm, memory=kv)
    chat_engine.chat(QUESTIONS[0])
    chat_engine.chat(QUESTIONS[1])
    probe.report("CondensePlusContextChatEngine x2 (condense + answer each)")
    # Each turn: the condense prompt (history rendered as text: the marker) + the answer.
    assert len(sent) == 4 and all(h is not None and h.user_id == user_id for h, _, _ in sent)
    assert all("[[inferscale:" not in m["content"] for _, msgs, _ in sent for m in msgs)
    assert probe.kv_requests == 4 and llm.counters["injected"] == 4
    assert [t["content"] for t in kv.turns][::2] == QUESTIONS[:2]


async def test_function_agent_calls_the_tool_with_memory(memory, user_id, probe, sent):
    memory.add(user_id=user_id, texts=FACTS[:3])
    llm = ScriptedInferScaleLLM(max_tokens=MAX_TOKENS)
    kv = KVMemory(user_id=user_id, k=2)
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(lookup)], llm=llm,
                          system_prompt="Use the tools.")
    result = await agent.run(user_msg=QUESTIONS[0], memory=kv)
    probe.report("FunctionAgent (tool call + answer)")
    assert len(sent) == 2 and all(h is not None and h.user_id == user_id for h, _, _ in sent)
    assert sent[1][1][-1]["role"] == "tool" and "notes about" in sent[1][1][-1]["content"]
    assert "<tool_call>" in sent[1][1][-2]["content"]
    assert probe.kv_requests == 2 and llm.counters["injected"] == 2
    assert [t["role"] for t in kv.turns] == ["user", "assistant", "tool", "assistant"]
    assert kv.turns[-1]["content"] == str(result.response.content)


async def test_react_agent_with_memory(memory, user_id, probe, sent):
    memory.add(user_id=user_id, texts=FACTS[:3])
    llm = InferScaleLLM(max_tokens=MAX_TOKENS)
    kv = KVMemory(user_id=user_id, k=2)
    parser = ScriptedReActParser("lookup")
    agent = ReActAgent(tools=[FunctionTool.from_defaults(lookup)], llm=llm,
                       output_parser=parser)
    result = await agent.run(user_msg=QUESTIONS[1], memory=kv)
    probe.report("ReActAgent (action + answer)")
    assert len(parser.outputs) == 2 and len(sent) == 2
    assert all(h is not None and h.user_id == user_id for h, _, _ in sent)
    assert probe.kv_requests == 2 and llm.counters["injected"] == 2
    assert kv.turns[0]["content"] == QUESTIONS[1]
    assert str(result.response.content) == parser.outputs[-1]


def test_llm_entry_points_read_handles_everywhere(memory, user_id, probe, sent):
    memory.add(user_id=user_id, texts=FACTS[:2])
    handle = memory.search(user_id=user_id, query=QUESTIONS[0], k=2).handle
    kv = KVMemory(user_id=user_id, k=2)
    carrier = kv.get(QUESTIONS[0])[0]
    assert MARKER_RE.fullmatch(carrier.content) and carrier.additional_kwargs[HANDLES_KEY]
    llm = InferScaleLLM(max_tokens=MAX_TOKENS)
    question = ChatMessage(role="user", content=QUESTIONS[0])
    llm.chat([carrier, question])  # additional_kwargs (+ marker)
    llm.complete(f"{carrier.content}\n{QUESTIONS[0]}")  # marker in text only
    llm.chat([question], kv_handles=[handle])  # call kwargs
    pieces = [r.delta for r in llm.stream_chat([carrier, question])]
    done = asyncio.run(llm.achat([carrier, question]))
    assert [h for h, _, _ in sent] == [handle] * 5
    assert "".join(pieces) == done.message.content  # greedy: same answer
    probe.report("InferScaleLLM chat/complete/kwargs/stream/achat")
    assert llm.counters["injected"] == 5 and probe.injected_tokens > 0
