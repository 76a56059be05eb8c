"""add(infer=True, wait=False): the user's messages stored at once, the model's work queued.

The tiny random model answers (held to the schemas), so what it decides varies; what is
checked is what every decision must leave: the messages served as text until the job ran,
then gone, their status naming what was done, and nothing lost to a restart.
"""

from __future__ import annotations

import pytest

from inferscale_engine.errors import FactNotFoundError
from inferscale_engine.memory import Memory
from inferscale_engine.memory.infer import EVENTS
from inferscale_engine.memory.store.fact_store import FactStore
from tests.conftest import FACTS
from tests.engine.memory.memory_support import HashEmbedder
from tests.engine.memory.test_async_adds import WAIT_S, GatedEmbedder, close_mid_job

pytestmark = pytest.mark.vllm

CHAT = [{"role": "user", "content": "I moved to Lisbon last month."},
        {"role": "assistant", "content": "Lisbon is lovely."},
        {"role": "user", "content": "My dog is called Pepper."}]


def _check_done(memory: Memory, ids: list[int]) -> None:
    """The job ran: the message rows are gone and their statuses say what was done."""
    statuses = [memory.add_status(user_id="u", fact_id=i) for i in ids]
    assert {(s.status, s.event) for s in statuses} == {("SUCCEEDED", "INFER")}
    assert len({s.inferred for s in statuses}) == 1  # one job, one answer
    stored = {f.fact_id for f in memory.records(user_id="u")}
    assert not set(ids) & stored
    for result in statuses[0].inferred:
        assert result.event in EVENTS
        if result.event in ("ADD", "UPDATE"):
            assert result.fact_id in stored
    for fact_id in ids:  # the message was stored, then deleted
        assert [e.event for e in memory.history(user_id="u", fact_id=fact_id)] == [
            "ADD", "DELETE"]


def test_the_messages_are_stored_at_once_served_as_text_then_inferred(module_engine,
                                                                      tmp_path):
    embedder = GatedEmbedder()
    with Memory(module_engine, tmp_path / "m.db", embedder, progress_bar=False) as memory:
        memory.add(user_id="u", texts=[FACTS[0]], wait=False)  # holds the worker at the gate
        assert embedder.entered.wait(WAIT_S)
        calls = memory.counters["infer_calls"]
        queued = memory.add(user_id="u", messages=CHAT, infer=True, wait=False,
                            metadata={"source": "chat"}, agent_id="helper")
        # one row per user message (the assistant's is context the model may read, not kept)
        assert [(r.text, r.status) for r in queued] == [
            (CHAT[0]["content"], "PENDING"), (CHAT[2]["content"], "PENDING")]
        ids = [r.fact_id for r in queued]
        assert all(memory.add_status(user_id="u", fact_id=i).status == "PENDING" for i in ids)
        assert set(ids) <= set(memory.handle_for(user_id="u", query=None).fact_ids)
        embedder.gate.set()
        assert memory.wait_adds(WAIT_S)
        assert memory.counters["infer_calls"] == calls + 1
        assert memory.counters["inferred_adds"] == 1
        _check_done(memory, ids)
        assert not set(ids) & set(memory.handle_for(user_id="u", query=None).fact_ids)
        for result in memory.add_status(user_id="u", fact_id=ids[0]).inferred:
            if result.event == "ADD":  # the add's scope and metadata reach the new facts
                record = memory.get(user_id="u", fact_id=result.fact_id)
                assert record.agent_id == "helper" and record.metadata == {"source": "chat"}


def test_a_restart_before_the_model_ran_loses_no_message(module_engine, tmp_path):
    db = tmp_path / "m.db"
    embedder = GatedEmbedder()
    memory = Memory(module_engine, db, embedder, progress_bar=False)
    memory.add(user_id="u", texts=[FACTS[1]], wait=False)  # the running job, held
    assert embedder.entered.wait(WAIT_S)
    ids = [r.fact_id for r in memory.add(user_id="u", messages=CHAT, infer=True, wait=False)]
    close_mid_job(memory, embedder)
    with FactStore(db) as store:
        assert set(ids) <= {f.fact_id for f in store.pending_facts()}
    with Memory(module_engine, db, HashEmbedder(), progress_bar=False) as memory:
        assert memory.wait_adds(WAIT_S)
        assert memory.counters["inferred_adds"] == 1
        _check_done(memory, ids)
    with FactStore(db) as store:
        assert store.pending_facts() == []


def test_nothing_said_by_the_user_stores_nothing(fresh_memory):
    assert fresh_memory.add(user_id="u", infer=True, wait=False, messages=[
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "   "}]) == []
    assert fresh_memory.records(user_id="u") == []
    with pytest.raises(FactNotFoundError):
        fresh_memory.add_status(user_id="u", fact_id=1)


def test_messages_that_expire_while_queued_are_dropped_not_retried(module_engine, tmp_path):
    import time

    embedder = GatedEmbedder()
    with Memory(module_engine, tmp_path / "m.db", embedder, progress_bar=False,
                expiry_sweep_s=None) as memory:
        memory.add(user_id="u", texts=[FACTS[0]], wait=False)  # holds the worker at the gate
        assert embedder.entered.wait(WAIT_S)
        calls = memory.counters["infer_calls"]
        ids = [r.fact_id for r in memory.add(user_id="u", messages=CHAT, infer=True,
                                             wait=False, expiration_date=time.time() + 1.5)]
        time.sleep(2.0)  # the messages expire before the model could read them
        embedder.gate.set()
        assert memory.wait_adds(WAIT_S)
        assert memory.counters["infer_calls"] == calls  # no model call for expired messages
        assert memory.counters["infer_expired"] == 1
        for fact_id in ids:  # done, not failed: nothing inferred, nothing to retry
            status = memory.add_status(user_id="u", fact_id=fact_id)
            assert (status.status, status.event, status.inferred) == ("SUCCEEDED", "INFER", ())
    with FactStore(tmp_path / "m.db") as store:
        assert store.pending_facts() == []
