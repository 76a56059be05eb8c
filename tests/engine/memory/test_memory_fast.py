"""Memory's and the Engine's own logic over FakeRunner: no vLLM starts, each test takes ~1 s.

What these check is bookkeeping (ids, results, turns, ownership, the version cache), not KV:
the tests that run the real engine check the KV itself.
"""

from __future__ import annotations

import pytest

from inferscale_engine.errors import ConfigError, InvalidRequestError, InvalidUserIdError
from tests.conftest import engine_config
from tests.engine.memory.memory_support import HashEmbedder
from tests.fake_runner import FakeRunner


@pytest.fixture()
def engine(tiny_models):
    from inferscale_engine.runtime.engine import Engine

    with Engine(engine_config(tiny_models["qwen2"], context_window_tokens=32),
                runner=FakeRunner) as eng:
        yield eng


@pytest.fixture()
def memory(engine, tmp_path):
    from inferscale_engine.memory import Memory

    with Memory(engine, tmp_path / "m.db", HashEmbedder(), progress_bar=False) as mem:
        yield mem


def test_add_results_name_the_message_each_fact_came_from(memory):
    results = memory.add(user_id="ann", session_id="s", messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "I live in Lisbon."},
        {"role": "assistant", "content": "   "},
        {"role": "assistant", "content": "Noted: Lisbon."}])
    assert [(r.event, r.turn) for r in results] == [("ADD", 1), ("ADD", 3)]
    again = memory.add(user_id="ann", messages=[{"role": "user", "content": "I live in Lisbon."}])
    assert [(r.event, r.turn, r.fact_id) for r in again] == [
        ("DUPLICATE", 0, results[0].fact_id)]
    texts = memory.add(user_id="ann", texts=["Ann has a cat."])
    assert texts[0].turn is None and texts[0].event == "ADD"


def test_a_fact_repeated_in_one_call_names_the_first(memory):
    first, second = memory.add(user_id="bo", texts=["Bo plays chess.", "Bo plays chess."])
    assert (first.event, second.event) == ("ADD", "DUPLICATE")
    assert second.fact_id == first.fact_id
    assert [f.text for f in memory.get_all(user_id="bo")] == ["Bo plays chess."]


def test_bad_input_is_refused_before_anything_is_stored(memory):
    with pytest.raises(InvalidUserIdError):
        memory.add(user_id="a\nb", texts=["x"])
    with pytest.raises(InvalidRequestError, match="exactly one"):
        memory.add(user_id="cy", texts=["x"], messages=[{"role": "user", "content": "y"}])
    assert memory.stats().num_facts == 0


def test_search_and_generate_go_through_the_served_facts(memory, engine):
    (added,) = memory.add(user_id="di", texts=["Di's sister is called Eva."])
    found = memory.search(user_id="di", query="sister", k=3)
    assert found.handle.fact_ids == (added.fact_id,)
    out = memory.generate(user_id="di", query="Who is my sister?", k=3)
    assert out.text == FakeRunner.ANSWER and out.plan_status == "inject"
    assert memory.search(user_id="someone-else", query="sister", k=3).facts == []


def test_a_memory_owns_its_engines_fact_ids(memory, engine, tmp_path):
    from inferscale_engine.memory import Memory

    with pytest.raises(InvalidRequestError, match="Memory owns this Engine's fact ids"):
        engine.add_facts("ed", ["Ed likes tea."])
    with pytest.raises(ConfigError, match="another open Memory owns"):
        Memory(engine, tmp_path / "other.db", HashEmbedder(), progress_bar=False)
    memory.close()  # the claim ends with the Memory
    assert engine.add_facts("ed", ["Ed likes tea."])


def test_async_twins_return_what_their_verbs_return(memory):
    import asyncio

    async def run():
        await memory.aadd(user_id="fay", texts=["Fay runs marathons."])
        return await memory.asearch(user_id="fay", query="running", k=1)

    found = asyncio.run(run())
    assert [f.text for f in found.facts] == ["Fay runs marathons."]
    assert memory.asearch.__name__ == "asearch" and "search()" in (memory.asearch.__doc__ or "")


def test_one_fact_shape_for_memory_and_client(memory):
    from inferscale_engine.memory.types import MemoryItem
    from inferscale_integrations.client import RemoteFact, _fact

    (added,) = memory.add(user_id="gus", texts=["Gus speaks Basque."], metadata={"lang": "eu"},
                          agent_id="tutor")
    (item,) = memory.search(user_id="gus", query="Basque", k=1).items
    assert isinstance(item, MemoryItem) and item.fact_id == added.fact_id and item.score
    stored = memory.get(user_id="gus", fact_id=added.fact_id).to_item()
    assert (stored.text, stored.metadata, stored.agent_id) == (
        "Gus speaks Basque.", {"lang": "eu"}, "tutor")
    remote = _fact({"id": 7, "user_id": "gus", "memory": "x", "score": 0.5})
    assert isinstance(remote, MemoryItem) and RemoteFact is MemoryItem
