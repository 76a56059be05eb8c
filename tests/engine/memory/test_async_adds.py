"""add(wait=False) on the real engine: facts stored at once, embedded and encoded in the
background queue (memory/background.py); served as text until their KV is ready, then as KV;
a restart mid-queue loses nothing; a full queue refuses the add (AddQueueFullError).

The background's embedder is held at a gate (GatedEmbedder) so that a test decides when the
queue may go on; every other part (store, engine, vLLM, the index) is the real one.
"""

from __future__ import annotations

import threading
import time

import pytest

from inferscale_engine.errors import (
    AddQueueFullError,
    FactNotFoundError,
    InvalidRequestError,
    InvalidTurnError,
)
from inferscale_engine.memory import Memory
from inferscale_engine.memory.store.fact_store import FactStore
from tests.conftest import FACTS, greedy
from tests.engine.memory.memory_support import HashEmbedder

pytestmark = pytest.mark.vllm

WAIT_S = 120.0
"""A bound on waiting for the queue on a loaded machine, not a speed requirement."""


class GatedEmbedder(HashEmbedder):
    """HashEmbedder whose calls from the add queue's threads wait until `gate` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()
        """Set when a queue thread is waiting at the gate."""

    def encode(self, texts):
        if threading.current_thread().name.startswith("inferscale-adds"):
            self.entered.set()
            assert self.gate.wait(WAIT_S), "the test never opened the gate"
        return super().encode(texts)


def close_mid_job(memory: Memory, embedder: GatedEmbedder) -> None:
    """Close `memory` while its queue's running job waits at the embedder's gate: the gate
    opens only once the Memory is closing, so that job ends with its facts still pending."""
    def open_gate_once_closing() -> None:
        while not memory._background._closed:
            time.sleep(0.01)
        embedder.gate.set()

    opener = threading.Thread(target=open_gate_once_closing)
    opener.start()
    memory.close()
    opener.join()


def _in_prompt(token_ids: list[int], fact_ids: tuple[int, ...]) -> bool:
    """True if `fact_ids` appear in `token_ids` as one run."""
    n = len(fact_ids)
    return any(tuple(token_ids[i:i + n]) == fact_ids for i in range(len(token_ids) - n + 1))


def test_a_pending_fact_is_served_as_text_then_as_kv(module_engine, tmp_path):
    embedder = GatedEmbedder()
    with Memory(module_engine, tmp_path / "m.db", embedder, progress_bar=False) as memory:
        memory.add(user_id="u", texts=FACTS[1:3])  # earlier facts, KV ready
        (added,) = memory.add(user_id="u", texts=[FACTS[0]], wait=False)
        assert (added.event, added.status) == ("ADD", "PENDING")
        assert memory.add_status(user_id="u", fact_id=added.fact_id).status in (
            "PENDING", "RUNNING")
        assert memory.engine.tokenize_fact(FACTS[0]) == memory.get(
            user_id="u", fact_id=added.fact_id).token_ids  # durable before the KV
        assert added.fact_id not in [f.fact_id for f in memory.search(
            user_id="u", query=FACTS[0], k=5).facts]  # no embedding yet: not ranked

        before = memory.counters["pending_served_as_text"]
        prepared = memory.prepare(user_id="u", query="What does Alice like?", k=1,
                                  messages=[{"role": "user", "content": "What does Alice like?"}])
        assert added.fact_id in prepared.handle.fact_ids and prepared.plan is not None
        fact = memory.get(user_id="u", fact_id=added.fact_id)
        assert _in_prompt(prepared.token_ids, fact.token_ids)  # the pending fact, as text
        assert len(prepared.plan.slab_keys) >= 2  # the preamble and the ready fact, injected
        answer = memory.generate(user_id="u", query="What does Alice like?", k=1,
                                 sampling=greedy(2))
        assert answer.mode == "kv" and answer.plan_status == "inject"
        assert answer.num_injected_tokens > 0 and answer.num_repaired_facts >= 1
        text = memory.generate(user_id="u", query="What does Alice like?", k=1,
                               sampling=greedy(2), mode="text")
        assert text.mode == "text" and text.num_injected_tokens == 0
        assert memory.counters["pending_served_as_text"] == before + 3

        embedder.gate.set()
        assert memory.wait_adds(WAIT_S)
        status = memory.add_status(user_id="u", fact_id=added.fact_id)
        assert (status.status, status.event) == ("SUCCEEDED", "ADD")
        assert added.fact_id in [f.fact_id for f in memory.search(
            user_id="u", query=FACTS[0], k=3).facts]  # embedded: searchable now
        prepared = memory.prepare(user_id="u", query=FACTS[0], k=3,
                                  messages=[{"role": "user", "content": "What does Alice like?"}])
        assert added.fact_id in prepared.handle.fact_ids and prepared.plan is not None
        answer = memory.generate(user_id="u", query=FACTS[0], k=3, sampling=greedy(2))
        assert answer.mode == "kv" and answer.num_injected_tokens > 0
        assert answer.plan_status == "inject"
        assert memory.counters["pending_served_as_text"] == before + 3  # no text any more


def test_a_user_whose_only_fact_is_pending_is_answered_with_the_default_layout(
        module_engine, tmp_path):
    embedder = GatedEmbedder()
    with Memory(module_engine, tmp_path / "m.db", embedder, progress_bar=False) as memory:
        (added,) = memory.add(user_id="solo", texts=[FACTS[0]], wait=False)
        answer = memory.generate(user_id="solo", query="What does Alice like?", k=5,
                                 sampling=greedy(2))  # the default repairs 2 of 1 fact
        assert answer.finished and answer.num_repaired_facts == 1
        prepared = memory.prepare(user_id="solo", query="What does Alice like?", k=5,
                                  messages=[{"role": "user", "content": "What does Alice like?"}])
        assert prepared.handle.fact_ids == (added.fact_id,)
        embedder.gate.set()
        assert memory.wait_adds(WAIT_S)


def test_a_restart_mid_queue_loses_nothing(module_engine, tmp_path):
    db = tmp_path / "m.db"
    embedder = GatedEmbedder()
    memory = Memory(module_engine, db, embedder, progress_bar=False)
    running = memory.add(user_id="u", texts=FACTS[:2], wait=False)  # held at the gate
    assert embedder.entered.wait(WAIT_S)
    queued = memory.add(user_id="u", messages=[  # waits behind it
        {"role": "user", "content": FACTS[2]}, {"role": "assistant", "content": FACTS[3]}],
        session_id="s", wait=False)
    ids = [r.fact_id for r in running + queued]
    close_mid_job(memory, embedder)
    with FactStore(db) as store:
        assert [(f.fact_id, f.pending) for f in store.pending_facts()] == [(i, True) for i in ids]
        assert len(store.recent_turns(user_id="u", session_id="s")) == 2

    with Memory(module_engine, db, HashEmbedder(), progress_bar=False) as memory:
        assert memory.counters["resumed_adds"] == 4
        handle = memory.handle_for(user_id="u", query=None)  # pending or done: served
        assert set(ids) <= set(handle.fact_ids)
        assert memory.wait_adds(WAIT_S)
        for fact_id in ids:
            assert memory.add_status(user_id="u", fact_id=fact_id).status == "SUCCEEDED"
        assert {f.fact_id for f in memory.search(user_id="u", query=FACTS[2], k=10).facts} == (
            set(ids))
        assert all(module_engine.is_resident(i) for i in ids)
    with FactStore(db) as store:
        assert store.pending_facts() == [] and store.count(user_id="u") == 4


def test_a_full_queue_refuses_the_add_and_stores_nothing(module_engine, tmp_path):
    embedder = GatedEmbedder()
    with Memory(module_engine, tmp_path / "m.db", embedder, progress_bar=False,
                max_queued_facts=2) as memory:
        memory.add(user_id="u", texts=FACTS[:2], wait=False)
        with pytest.raises(AddQueueFullError, match="max_queued_facts=2"):
            memory.add(user_id="u", texts=[FACTS[2]], wait=False)
        assert len(memory.records(user_id="u")) == 2 and memory.counters[
            "async_add_refusals"] == 1
        assert len(memory.add(user_id="u", texts=[FACTS[3]])) == 1  # wait=True is not queued
        embedder.gate.set()
        assert memory.wait_adds(WAIT_S)
        (later,) = memory.add(user_id="u", texts=[FACTS[2]], wait=False)  # room again
        assert memory.wait_adds(WAIT_S)
        assert memory.add_status(user_id="u", fact_id=later.fact_id).status == "SUCCEEDED"
        assert len(memory.records(user_id="u")) == 4


def test_duplicates_are_found_in_the_background(fresh_memory):
    memory = fresh_memory
    (original,) = memory.add(user_id="u", texts=[FACTS[0]])
    first, second = memory.add(user_id="u", texts=[FACTS[0], FACTS[1]], wait=False)
    assert first.event == "ADD" and first.fact_id != original.fact_id  # not known yet
    assert memory.wait_adds(WAIT_S)
    status = memory.add_status(user_id="u", fact_id=first.fact_id)
    assert (status.status, status.event, status.duplicate_of) == (
        "SUCCEEDED", "DUPLICATE", original.fact_id)
    assert memory.add_status(user_id="u", fact_id=second.fact_id).event == "ADD"
    assert [r.fact_id for r in memory.records(user_id="u")] == [original.fact_id,
                                                                second.fact_id]
    assert [e.event for e in memory.history(user_id="u", fact_id=first.fact_id)] == [
        "ADD", "DELETE"]


def test_a_pending_fact_deleted_before_its_turn_is_never_served(module_engine, tmp_path):
    embedder = GatedEmbedder()
    with Memory(module_engine, tmp_path / "m.db", embedder, progress_bar=False) as memory:
        (fact,) = memory.add(user_id="u", texts=[FACTS[4]], wait=False)
        memory.delete(user_id="u", fact_ids=[fact.fact_id])
        assert fact.fact_id not in memory.handle_for(user_id="u", query=None).fact_ids
        embedder.gate.set()
        assert memory.wait_adds(WAIT_S)
        with pytest.raises(FactNotFoundError):
            memory.add_status(user_id="u", fact_id=fact.fact_id)
        assert memory.records(user_id="u") == [] and memory.search(
            user_id="u", query=FACTS[4]).facts == []


def test_a_fact_deleted_while_it_is_embedded_is_not_found_and_never_served(module_engine,
                                                                            tmp_path):
    embedder = GatedEmbedder()
    with Memory(module_engine, tmp_path / "m.db", embedder, progress_bar=False) as memory:
        (fact,) = memory.add(user_id="u", texts=[FACTS[4]], wait=False)
        assert embedder.entered.wait(WAIT_S)  # the worker holds the job
        memory.delete(user_id="u", fact_ids=[fact.fact_id])
        with pytest.raises(FactNotFoundError):  # not RUNNING: the store says it is gone
            memory.add_status(user_id="u", fact_id=fact.fact_id)
        embedder.gate.set()
        assert memory.wait_adds(WAIT_S)
        with pytest.raises(FactNotFoundError):  # and not SUCCEEDED
            memory.add_status(user_id="u", fact_id=fact.fact_id)
        assert memory.records(user_id="u") == [] and memory.search(
            user_id="u", query=FACTS[4]).facts == []
        assert fact.fact_id not in memory.handle_for(user_id="u", query=None).fact_ids


def test_bad_input_to_an_asynchronous_add_stores_nothing(fresh_memory):
    with pytest.raises(InvalidRequestError, match="wait=True"):
        fresh_memory.add(user_id="u", texts=["I live in Oslo."], infer=True, wait=False,
                         pinned=True)
    with pytest.raises(InvalidTurnError):  # a message with no role
        fresh_memory.add(user_id="u", messages=[{"content": "x"}], infer=True, wait=False)
    with pytest.raises(InvalidRequestError):
        fresh_memory.add(user_id="u", texts=["x"], messages=[], wait=False)
    with pytest.raises(FactNotFoundError):
        fresh_memory.add_status(user_id="u", fact_id=12345)
    assert fresh_memory.records(user_id="u") == []
