"""Classic LangChain chains with KVMemory swapped in for ConversationBufferMemory.

ConversationChain (string template: the marker carries the handle), LLMChain (MessagesPlaceholder:
additional_kwargs; llm_kwargs: call kwargs) and AgentExecutor (tool-calling agent), sync and
async. The engine's counters prove the answers were served with injected KV.
"""

from __future__ import annotations

import pytest
from langchain_classic.agents import AgentExecutor, create_tool_calling_agent
from langchain_classic.chains import ConversationChain, LLMChain
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.tools import tool

from inferscale_integrations import ChatInferScale, KVMemory
from inferscale_integrations.handles import HANDLES_KEY, MARKER_RE, RECENT_HANDLES
from tests.conftest import FACTS, QUESTIONS
from tests.integrations.conftest import MAX_TOKENS
from tests.integrations.scripted import ScriptedChatInferScale

pytestmark = pytest.mark.vllm


@tool
def lookup(query: str) -> str:
    """Look something up in the user's notes."""
    return f"notes about {query!r}: nothing new"


def _fact_ids(kv: KVMemory) -> list[int]:
    return [f for t in kv.turns for f in t["fact_ids"]]


def test_conversation_chain_serves_from_injected_kv(memory, user_id, probe, sent):
    facts = [r.fact_id for r in memory.add(user_id=user_id, texts=FACTS[:3])]
    llm = ChatInferScale(max_tokens=MAX_TOKENS)
    kv = KVMemory(user_id=user_id, k=2, recent_turns=4)
    chain = ConversationChain(llm=llm, memory=kv)

    first = chain.invoke({"input": QUESTIONS[0]})
    second = chain.invoke({"input": QUESTIONS[1]})

    probe.report("ConversationChain x2")
    assert probe.kv_requests == 2 and probe.injected_tokens > 0
    assert llm.counters["injected"] == 2 and "fallback_text" not in llm.counters
    # The string template carried only the marker; the model saw no marker.
    assert MARKER_RE.fullmatch(first["history"]) and MARKER_RE.fullmatch(second["history"])
    assert all("[[inferscale:" not in m["content"] for _, msgs, _ in sent for m in msgs)
    # The second handle: top-k facts, then the first exchange's turns in order.
    handle = sent[1][0]
    assert handle.user_id == user_id and list(handle.fact_ids[-2:]) == _fact_ids(kv)[:2]
    assert handle.fact_ids[:-2] and set(handle.fact_ids[:-2]) <= set(facts)
    assert [(t["role"], t["content"]) for t in kv.turns] == [
        ("user", QUESTIONS[0]), ("assistant", first["response"]),
        ("user", QUESTIONS[1]), ("assistant", second["response"])]
    assert [t.content for t in memory.turns(user_id=user_id)] == [t["content"] for t in kv.turns]


async def test_conversation_chain_async(memory, user_id, probe):
    memory.add(user_id=user_id, texts=FACTS[:2])
    llm = ChatInferScale(max_tokens=MAX_TOKENS)
    kv = KVMemory(user_id=user_id, k=2)
    chain = ConversationChain(llm=llm, memory=kv)
    out = await chain.ainvoke({"input": QUESTIONS[0]})
    probe.report("ConversationChain.ainvoke")
    assert probe.injected_tokens > 0 and llm.counters["injected"] == 1
    assert [t["content"] for t in kv.turns] == [QUESTIONS[0], out["response"]]


def test_llm_chain_with_messages_placeholder_and_llm_kwargs(memory, user_id, probe, sent):
    memory.add(user_id=user_id, texts=FACTS[:3])
    prompt = ChatPromptTemplate.from_messages([
        ("system", "Answer briefly."), MessagesPlaceholder("chat_history"),
        ("human", "{question}")])
    llm = ChatInferScale(max_tokens=MAX_TOKENS)
    kv = KVMemory(user_id=user_id, k=3, memory_key="chat_history", return_messages=True)
    chain = LLMChain(llm=llm, prompt=prompt, memory=kv)
    out = chain.invoke({"question": QUESTIONS[2]})
    (message,) = kv.load_memory_variables({"question": "x"})["chat_history"]
    assert message.type == "human" and MARKER_RE.fullmatch(message.content)
    assert message.additional_kwargs[HANDLES_KEY][0]["user_id"] == user_id
    assert sent[-1][0] is not None and len(sent[-1][0].fact_ids) == 3
    assert [m["role"] for m in sent[-1][1]] == ["system", "user"]  # carrier dropped
    assert kv.turns[-1]["content"] == out["text"]

    # The same chain with the handle in llm_kwargs (call kwargs) and no memory.
    handle = memory.search(user_id=user_id, query=QUESTIONS[0], k=2).handle
    bare = LLMChain(llm=llm, prompt=ChatPromptTemplate.from_messages([("human", "{question}")]),
                    llm_kwargs={"kv_handles": [handle.to_dict()]})
    bare.invoke({"question": QUESTIONS[0]})
    assert sent[-1][0] == handle
    probe.report("LLMChain (placeholder + llm_kwargs)")
    assert probe.kv_requests == 2 and llm.counters["injected"] == 2


async def test_llm_chain_async_keeps_the_turns(memory, user_id, probe, sent):
    memory.add(user_id=user_id, texts=FACTS[:2])
    prompt = ChatPromptTemplate.from_messages([
        MessagesPlaceholder("history"), ("human", "{question}")])
    llm = ChatInferScale(max_tokens=MAX_TOKENS)
    kv = KVMemory(user_id=user_id, k=2, return_messages=True)
    chain = LLMChain(llm=llm, prompt=prompt, memory=kv)
    first = await chain.ainvoke({"question": QUESTIONS[0]})
    second = await chain.ainvoke({"question": QUESTIONS[1]})
    probe.report("LLMChain.ainvoke x2")
    assert probe.kv_requests == 2 and probe.injected_tokens > 0 and llm.counters["injected"] == 2
    assert [t["content"] for t in kv.turns] == [QUESTIONS[0], first["text"], QUESTIONS[1],
                                                second["text"]]
    # The second request's handle ends with the first exchange, in order.
    assert list(sent[1][0].fact_ids[-2:]) == [f for t in kv.turns[:2] for f in t["fact_ids"]]


def _agent(llm, kv):
    prompt = ChatPromptTemplate.from_messages([
        ("system", "You are a helpful assistant."), MessagesPlaceholder("chat_history"),
        ("human", "{input}"), MessagesPlaceholder("agent_scratchpad")])
    agent = create_tool_calling_agent(llm, [lookup], prompt)
    return AgentExecutor(agent=agent, tools=[lookup], memory=kv, max_iterations=3)


def test_agent_executor_calls_the_tool_and_answers_with_memory(memory, user_id, probe, sent):
    memory.add(user_id=user_id, texts=FACTS[:3])
    llm = ScriptedChatInferScale(max_tokens=MAX_TOKENS)
    kv = KVMemory(user_id=user_id, k=2, memory_key="chat_history", return_messages=True)
    out = _agent(llm, kv).invoke({"input": QUESTIONS[0]})
    probe.report("AgentExecutor (tool call + answer)")
    assert len(sent) == 2 and all(h is not None and h.user_id == user_id for h, _, _ in sent)
    assert [m["role"] for m in sent[1][1]][-2:] == ["assistant", "tool"]
    assert "<tool_call>" in sent[1][1][-2]["content"]  # the call, as the model would write it
    assert sent[1][1][-1]["content"].startswith("notes about")
    assert probe.kv_requests == 2 and probe.injected_tokens > 0 and llm.counters["injected"] == 2
    assert [t["content"] for t in kv.turns] == [QUESTIONS[0], out["output"]]


async def test_agent_executor_async(memory, user_id, probe):
    memory.add(user_id=user_id, texts=FACTS[:2])
    llm = ScriptedChatInferScale(max_tokens=MAX_TOKENS)
    kv = KVMemory(user_id=user_id, k=2, memory_key="chat_history", return_messages=True)
    out = await _agent(llm, kv).ainvoke({"input": QUESTIONS[1]})
    probe.report("AgentExecutor.ainvoke")
    assert probe.kv_requests == 2 and llm.counters["injected"] == 2
    assert [t["content"] for t in kv.turns] == [QUESTIONS[1], out["output"]]


def test_marker_from_history_resolves_to_the_handle(memory, user_id):
    memory.add(user_id=user_id, texts=FACTS[:2])
    kv = KVMemory(user_id=user_id, k=2)
    marker = kv.load_memory_variables({"input": QUESTIONS[0]})["history"]
    handle = RECENT_HANDLES.resolve(MARKER_RE.fullmatch(marker).group(1))
    assert handle == memory.search(user_id=user_id, query=QUESTIONS[0], k=2).handle
