"""KVMemory's state survives every framework's serialization; the live Memory never travels.

Also: put() is thread-safe, and one KVMemory serves a LangChain chain and a LlamaIndex engine
alternately over the same conversation.
"""

from __future__ import annotations

import pickle
import threading

import pytest
from langchain_classic.chains import ConversationChain
from langchain_core.load import dumpd, load
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.chat_engine import SimpleChatEngine

from inferscale_integrations import ChatInferScale, InferScaleLLM, KVMemory
from inferscale_integrations.langchain import LangChainKVMemory
from inferscale_integrations.llamaindex import LlamaIndexKVMemory
from tests.conftest import FACTS, QUESTIONS
from tests.engine.memory.memory_support import crash_texts
from tests.integrations.conftest import MAX_TOKENS

pytestmark = pytest.mark.vllm

FIELDS = {"k": 3, "recent_turns": 4, "session_id": "s1", "memory_key": "chat_history",
          "return_messages": True, "human_prefix": "User"}


@pytest.fixture()
def talked(memory, user_id) -> KVMemory:
    """A KVMemory with two exchanges (the memory layer knows their facts)."""
    kv = KVMemory(user_id=user_id, **FIELDS)
    kv.save_context({"input": "I live in Oslo."}, {"output": "Nice city."})
    kv.put(ChatMessage(role="user", content="My dog is Rex."))
    kv.put(ChatMessage(role="assistant", content="Good dog."))
    return kv


def _same_state(a: KVMemory, b: KVMemory) -> None:
    assert type(b) is type(a) and b.turns == a.turns and len(b.turns) == 4
    assert b.model_dump() == a.model_dump()
    assert b.handle_for("Where do I live?") == a.handle_for("Where do I live?")


def test_pydantic_dump_and_validate(talked):
    _same_state(talked, KVMemory.model_validate(talked.model_dump()))
    _same_state(talked, KVMemory.model_validate_json(talked.model_dump_json()))


def test_langchain_dumpd_and_load(talked):
    restored = load(dumpd(talked), valid_namespaces=["inferscale_integrations"],
                    allowed_objects=[KVMemory])
    _same_state(talked, restored)


def test_llamaindex_json_and_dict(talked):
    _same_state(talked, KVMemory.from_json(talked.json()))
    _same_state(talked, KVMemory.from_json(talked.to_json()))  # LangChain's dict form too
    _same_state(talked, KVMemory.from_dict(talked.to_dict()))


def test_pickle_keeps_turns_and_resolves_the_memory_by_name(talked, memory):
    restored = pickle.loads(pickle.dumps(talked))
    _same_state(talked, restored)
    assert restored.memory is memory  # found again in the registry by memory_name
    restored.save_context({"input": "And my cat?"}, {"output": "Unknown."})  # keeps working
    assert len(restored.turns) == 6 and len(talked.turns) == 4


def test_framework_only_classes_round_trip(memory, user_id):
    lc = LangChainKVMemory(user_id=user_id, k=2)
    lc.save_context({"input": "a"}, {"output": "b"})
    again = load(dumpd(lc), valid_namespaces=["inferscale_integrations"],
                 allowed_objects=[LangChainKVMemory])
    assert again.turns == lc.turns and pickle.loads(pickle.dumps(lc)).turns == lc.turns
    li = LlamaIndexKVMemory(user_id=user_id)
    li.put(ChatMessage(role="user", content="c"))
    assert LlamaIndexKVMemory.from_json(li.to_json()).turns == li.turns
    assert pickle.loads(pickle.dumps(li)).turns == li.turns


def test_put_is_thread_safe(memory, user_id):
    kv = KVMemory(user_id=user_id)
    start = threading.Barrier(4)
    texts = crash_texts(8)  # distinct enough not to be deduplicated

    def talk(n: int) -> None:
        start.wait()
        for i in range(2):
            kv.put(ChatMessage(role="user", content=texts[2 * n + i]))

    threads = [threading.Thread(target=talk, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    contents = [t["content"] for t in kv.turns]
    assert sorted(contents) == sorted(texts)
    assert len({f for t in kv.turns for f in t["fact_ids"]}) == 8
    # The memory layer recorded the turns in the same order as the KVMemory.
    assert [t.content for t in memory.turns(user_id=user_id)] == contents
    for n in range(4):  # each thread's own order is kept
        assert contents.index(texts[2 * n]) < contents.index(texts[2 * n + 1])


def test_one_memory_serves_langchain_and_llamaindex_alternately(memory, user_id, probe):
    memory.add(user_id=user_id, texts=FACTS[:2])
    kv = KVMemory(user_id=user_id, k=1, recent_turns=6)
    chain = ConversationChain(llm=ChatInferScale(max_tokens=MAX_TOKENS), memory=kv)
    chat_engine = SimpleChatEngine.from_defaults(llm=InferScaleLLM(max_tokens=MAX_TOKENS),
                                                 memory=kv)
    chain.invoke({"input": QUESTIONS[0]})
    from_llamaindex = chat_engine.chat(QUESTIONS[1])
    chain.invoke({"input": QUESTIONS[2]})
    probe.report("ConversationChain / SimpleChatEngine / ConversationChain on one KVMemory")
    assert probe.kv_requests == 3 and probe.injected_tokens > 0
    assert [t["content"] for t in kv.turns][::2] == QUESTIONS[:3]
    assert kv.turns[3]["content"] == from_llamaindex.response
    # Both frameworks see the whole conversation: the last handle holds every turn before it.
    assert set(kv.handle_for(None).fact_ids) == {f for t in kv.turns for f in t["fact_ids"]}
