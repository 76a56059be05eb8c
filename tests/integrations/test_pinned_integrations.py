"""Pinned facts from the frameworks: LlamaIndex's KVStaticBlock (a StaticMemoryBlock as KV),
KVMemoryBlock's reads (pinned first, k others), LangGraph's KVMemoryStore.put(pinned=...)
and KVMemoryMiddleware, on the real engine (tiny model)."""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole

from inferscale_engine.errors import InvalidRequestError
from inferscale_integrations import KVMemoryBlock, KVMemoryStore
from inferscale_integrations.handles import MARKER_RE, RECENT_HANDLES
from inferscale_integrations.langchain.store import scope_of
from inferscale_integrations.llamaindex import KVStaticBlock
from tests.conftest import FACTS, QUESTIONS

pytestmark = pytest.mark.vllm


def _handle(text: str):
    (marker,) = MARKER_RE.findall(text)
    return RECENT_HANDLES.resolve(marker)


def test_a_static_block_pins_its_facts_once_and_the_memory_block_serves_them_first(
        memory, user_id):
    (stored,) = [r.fact_id for r in memory.add(user_id=user_id, texts=[FACTS[0]])]
    memory.add(user_id=user_id, texts=FACTS[1:4])
    static = KVStaticBlock(user_id=user_id, static_content=(FACTS[0], FACTS[4]))
    first = _handle(static.get())
    pinned = memory.pinned(user_id=user_id)
    assert first.fact_ids == tuple(pinned) and pinned[0] == stored and len(pinned) == 2
    assert _handle(asyncio.run(static.aget())).fact_ids == tuple(pinned)
    assert len(memory.records(user_id=user_id)) == 5  # the repeated fact was pinned, not added
    assert FACTS[4] not in static.get()  # a marker, not the text
    assert KVStaticBlock(user_id=user_id, as_text=True).get().splitlines() == [
        f"- {FACTS[0]}", f"- {FACTS[4]}"]
    read = KVMemoryBlock(user_id=user_id, k=2).get(
        [ChatMessage(role=MessageRole.USER, content=QUESTIONS[1])])
    handle = _handle(read)
    assert handle.fact_ids[:2] == tuple(pinned) and len(handle.fact_ids) == 4
    assert not set(handle.fact_ids[2:]) & set(pinned)  # k others, the pinned not repeated


def test_a_store_put_pins_and_unpins_an_item(memory):
    store = KVMemoryStore(memory)
    namespace = ("profiles", "pin-test")
    scope = scope_of(namespace)
    store.put(namespace, "diet", {"text": "The user is vegetarian."}, pinned=True)
    store.put(namespace, "bike", {"text": "The user's bike is blue."})
    (diet,) = memory.pinned(user_id=scope)
    assert memory.get(user_id=scope, fact_id=diet).text == "The user is vegetarian."
    handle = memory.handle_for(user_id=scope, query="What colour is the bike?", k=1)
    assert handle.fact_ids[0] == diet and len(handle.fact_ids) == 2
    store.put(namespace, "diet", {"text": "The user is vegan."})  # an edit keeps the pin
    assert memory.pinned(user_id=scope) == [diet]
    with pytest.raises(InvalidRequestError, match="pinned"):
        store.put(namespace, "car", {"text": "The user has no car."}, pinned="yes")
    assert store.get(namespace, "car") is None
    asyncio.run(store.aput(namespace, "diet", {"text": "The user is vegan."}, pinned=False))
    assert memory.pinned(user_id=scope) == []
