"""KVMemoryBlock in LlamaIndex's block-based Memory, on the real engine (tiny model).

Memory.from_defaults(memory_blocks=[KVMemoryBlock(...)]) puts one marker in the system message;
InferScaleLLM injects the user's top-k facts as KV (sync and async reads, a FunctionAgent run);
a put remembers the user and assistant turns as facts; as_text contributes the facts' text.
"""

from __future__ import annotations

import time

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.memory import Memory as LlamaMemory
from llama_index.core.tools import FunctionTool

from inferscale_integrations import KVMemoryBlock
from inferscale_integrations.handles import MARKER_RE, RECENT_HANDLES
from tests.conftest import FACTS, QUESTIONS
from tests.integrations.conftest import MAX_TOKENS
from tests.integrations.scripted import ScriptedInferScaleLLM

pytestmark = pytest.mark.vllm


def lookup(query: str) -> str:
    """Look something up in the user's notes."""
    return f"notes about {query!r}: nothing new"


def _system_text(messages) -> str:
    return "\n".join(str(m.content) for m in messages if m.role == MessageRole.SYSTEM)


async def test_the_block_puts_one_marker_in_the_system_message(memory, user_id):
    memory.add(user_id=user_id, texts=FACTS[:3])
    block = KVMemoryBlock(user_id=user_id, k=2)
    chat = LlamaMemory.from_defaults(session_id=user_id, memory_blocks=[block])
    await chat.aput(ChatMessage(role=MessageRole.USER, content=QUESTIONS[0]))
    system = _system_text(await chat.aget())
    assert len(MARKER_RE.findall(system)) == 1 and "<kv_memory>" in system
    assert FACTS[0] not in system  # the facts travel as KV, not as text
    sync = _system_text(chat.get())  # LlamaIndex's sync path runs the async block
    assert len(MARKER_RE.findall(sync)) == 1
    texts = KVMemoryBlock(user_id=user_id, k=3, as_text=True).get(
        [ChatMessage(role=MessageRole.USER, content=QUESTIONS[0])])
    assert sorted(line[2:] for line in texts.splitlines()) == sorted(FACTS[:3])


async def test_a_function_agent_with_the_block_answers_from_injected_kv(memory, user_id, probe,
                                                                        sent):
    facts = {r.fact_id for r in memory.add(user_id=user_id, texts=FACTS[:3])}
    chat = LlamaMemory.from_defaults(session_id=user_id,
                                     memory_blocks=[KVMemoryBlock(user_id=user_id, k=2)])
    llm = ScriptedInferScaleLLM(max_tokens=MAX_TOKENS)
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(lookup)], llm=llm,
                          system_prompt="Use the tools.")
    await agent.run(user_msg=QUESTIONS[0], memory=chat)
    probe.report("FunctionAgent with KVMemoryBlock")
    assert len(sent) == 2 and all(h is not None and h.user_id == user_id
                                  and set(h.fact_ids) <= facts and len(h.fact_ids) == 2
                                  for h, _, _ in sent)
    assert all(not MARKER_RE.search(str(m["content"])) for _, chat_, _ in sent for m in chat_)
    assert probe.kv_requests == 2 and probe.injected_tokens > 0


async def test_a_put_remembers_turns_as_facts(memory, user_id):
    block = KVMemoryBlock(user_id=user_id)
    await block.aput([ChatMessage(role=MessageRole.USER, content="I moved to Lisbon last year."),
                      ChatMessage(role=MessageRole.ASSISTANT, content="Lisbon is lovely."),
                      ChatMessage(role=MessageRole.SYSTEM, content="not a fact")])
    assert [f.text for f in memory.get_all(user_id=user_id)] == [
        "I moved to Lisbon last year.", "Lisbon is lovely."]
    block.put([ChatMessage(role=MessageRole.USER, content="My sister is called Ana.")])
    assert len(memory.get_all(user_id=user_id)) == 3


async def test_a_read_before_the_first_user_message_gets_the_latest_facts(memory, user_id):
    """No user text to search with (an empty chat, an opening greeting): the user's k most
    recent facts; without_query="none" (or a user without facts) contributes nothing."""
    ids = [r.fact_id for r in memory.add(user_id=user_id, texts=FACTS[:4])]
    block = KVMemoryBlock(user_id=user_id, k=2)
    chat = LlamaMemory.from_defaults(session_id=user_id, memory_blocks=[block])
    (marker,) = MARKER_RE.findall(_system_text(await chat.aget()))  # nothing put yet
    assert RECENT_HANDLES.resolve(marker).fact_ids == tuple(ids[2:])
    greeting = [ChatMessage(role=MessageRole.SYSTEM, content="Be brief."),
                ChatMessage(role=MessageRole.ASSISTANT, content="Hello! How can I help?")]
    (marker,) = MARKER_RE.findall(block.get(greeting))
    assert RECENT_HANDLES.resolve(marker).fact_ids == tuple(ids[2:])
    assert KVMemoryBlock(user_id=user_id, k=2, as_text=True).get([]) == (
        f"- {FACTS[2]}\n- {FACTS[3]}")
    assert KVMemoryBlock(user_id=user_id, without_query="none").get(greeting) == ""
    assert KVMemoryBlock(user_id=user_id + "-new").get([]) == ""
    await chat.aput(ChatMessage(role=MessageRole.USER, content=QUESTIONS[0]))  # then: search
    (marker,) = MARKER_RE.findall(_system_text(await chat.aget()))
    handle = RECENT_HANDLES.resolve(marker)
    assert handle.fact_ids[0] == ids[0] and len(handle.fact_ids) == 2  # Alice, for her question


def test_a_put_with_expire_after_minutes_writes_expiring_facts(memory, user_id):
    block = KVMemoryBlock(user_id=user_id, expire_after_minutes=30)
    before = time.time()
    block.put([ChatMessage(role=MessageRole.USER, content="My train leaves at nine.")])
    (record,) = memory.records(user_id=user_id)
    assert before + 30 * 60 <= record.expires_at <= time.time() + 30 * 60
    with pytest.raises(ValueError):
        KVMemoryBlock(user_id="someone", expire_after_minutes=0)


def test_bad_settings_are_refused(memory):
    with pytest.raises(ValueError, match="user_id is empty"):
        KVMemoryBlock(user_id="")
    with pytest.raises(ValueError):
        KVMemoryBlock(user_id="someone", k=-1)
    with pytest.raises(ValueError):
        KVMemoryBlock(user_id="someone", without_query="all")
