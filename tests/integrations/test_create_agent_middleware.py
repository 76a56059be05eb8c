"""LangChain 1.x create_agent with KVMemoryMiddleware, sync and async, on the real engine."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool

from inferscale_engine.errors import InvalidRequestError
from inferscale_integrations import KVMemoryMiddleware
from tests.conftest import FACTS, QUESTIONS
from tests.integrations.conftest import MAX_TOKENS
from tests.integrations.scripted import ScriptedChatInferScale

pytestmark = pytest.mark.vllm


@tool
def lookup(query: str) -> str:
    """Look something up in the user's notes."""
    return f"notes about {query!r}: nothing new"


@dataclass
class UserContext:
    user_id: str


def test_create_agent_attaches_handles_and_saves_the_exchange(memory, user_id, probe, sent):
    facts = {r.fact_id for r in memory.add(user_id=user_id, texts=FACTS[:3])}
    middleware = KVMemoryMiddleware(user_id=user_id, k=2)
    llm = ScriptedChatInferScale(max_tokens=MAX_TOKENS)
    agent = create_agent(llm, tools=[lookup], middleware=[middleware])
    state = agent.invoke({"messages": [HumanMessage(QUESTIONS[0])]})
    probe.report("create_agent (tool call + answer), sync")
    assert len(sent) == 2 and all(set(h.fact_ids) <= facts and len(h.fact_ids) == 2
                                  for h, _, _ in sent)
    assert sent[1][1][-1]["role"] == "tool"
    assert probe.kv_requests == 2 and llm.counters["injected"] == 2
    assert middleware.counters == {"handles_attached": 2, "facts_attached": 4,
                                   "exchanges_saved": 1}
    turns = memory.turns(user_id=user_id)
    assert [(t.role, t.content) for t in turns] == [
        ("user", QUESTIONS[0]), ("assistant", state["messages"][-1].text)]


async def test_create_agent_async_with_the_user_from_context(memory, user_id, probe, sent):
    memory.add(user_id=user_id, texts=FACTS[:2])
    middleware = KVMemoryMiddleware(k=2)
    llm = ScriptedChatInferScale(max_tokens=MAX_TOKENS)
    agent = create_agent(llm, tools=[lookup], middleware=[middleware],
                         context_schema=UserContext)
    await agent.ainvoke({"messages": [HumanMessage(QUESTIONS[1])]},
                        context=UserContext(user_id=user_id))
    probe.report("create_agent (tool call + answer), async")
    assert probe.kv_requests == 2 and all(h.user_id == user_id for h, _, _ in sent)
    assert [t.role for t in memory.turns(user_id=user_id)] == ["user", "assistant"]


def test_a_missing_user_is_an_error(memory):
    agent = create_agent(ScriptedChatInferScale(max_tokens=MAX_TOKENS), tools=[lookup],
                         middleware=[KVMemoryMiddleware()])
    with pytest.raises(InvalidRequestError, match="user_id"):
        agent.invoke({"messages": [HumanMessage("hi")]})
