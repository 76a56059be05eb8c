"""Facts that change: superseded, not overwritten; time on every fact; reads as of a date.

A superseded fact stays in the store (history keeps the chain) and leaves what search and
answers serve, its KV with it; an as-of read finds what was true then and answers with it as
KV, exactly as a plain prefill of the same prompt would. On SQLite and PostgreSQL, the real
engine (vLLM CPU build, a tiny random model).
"""

from __future__ import annotations

import datetime as dt

import pytest

from inferscale_engine.errors import FactNotFoundError, InvalidFactError, InvalidRequestError
from tests.conftest import greedy
from tests.engine.memory.memory_support import HashEmbedder

pytestmark = pytest.mark.vllm

JAN_2023 = dt.datetime(2023, 1, 1, tzinfo=dt.UTC)
JAN_2024 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


@pytest.fixture(params=["sqlite", "postgres"])
def store_target(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "memory.db")
    return request.getfixturevalue("postgres_url")


@pytest.fixture()
def memory(module_engine, store_target):
    from inferscale_engine.memory import Memory

    with Memory(module_engine, store_target, HashEmbedder(), progress_bar=False) as mem:
        yield mem


def test_a_superseded_fact_is_kept_with_its_chain_and_served_only_as_of_its_time(
        memory, module_engine):
    (old,) = memory.add(user_id="tim", texts=["Tim lives in Boston."], timestamp=JAN_2023)
    memory.add(user_id="tim", texts=["Tim likes green tea."], timestamp="2023-02-01")
    assert module_engine.is_resident(old.fact_id)
    new = memory.supersede(user_id="tim", fact_id=old.fact_id, text="Tim moved to Lisbon.",
                           timestamp=JAN_2024)
    assert new is not None and new.event == "UPDATE" and new.supersedes == (old.fact_id,)
    # the present: only the newer fact is served, and the old one's KV left the slab
    found = memory.search(user_id="tim", query="Where does Tim live?", k=5)
    assert old.fact_id not in found.handle.fact_ids and new.fact_id in found.handle.fact_ids
    assert module_engine.tiers_of([old.fact_id]) == {}  # in no tier: the engine forgot it
    assert {r.text for r in memory.records(user_id="tim")} == {"Tim moved to Lisbon.",
                                                                "Tim likes green tea."}
    everything = {r.fact_id: r for r in memory.records(user_id="tim", include_superseded=True)}
    assert everything[old.fact_id].valid_to == JAN_2024.timestamp()
    assert everything[old.fact_id].superseded_by == new.fact_id
    assert everything[old.fact_id].valid_from == JAN_2023.timestamp()
    item = everything[old.fact_id].to_item()
    assert (item.valid_to, item.superseded_by) == (JAN_2024.timestamp(), new.fact_id)
    assert [(e.event, e.new_text) for e in memory.history(user_id="tim", fact_id=old.fact_id)
            ] == [("ADD", "Tim lives in Boston."), ("SUPERSEDE", "Tim moved to Lisbon.")]
    # as of mid-2023: the Boston fact (and the tea), not Lisbon
    then = {r.text for r in memory.records(user_id="tim", as_of="2023-06-01")}
    assert then == {"Tim lives in Boston.", "Tim likes green tea."}
    assert [f.text for f in memory.get_all(user_id="tim", as_of=dt.date(2022, 6, 1))] == []
    past = memory.search(user_id="tim", query="Where does Tim live?", k=5, as_of="2023-06-01")
    assert old.fact_id in past.handle.fact_ids and new.fact_id not in past.handle.fact_ids
    answer = memory.generate(user_id="tim", query="Where does Tim live?", k=5,
                             as_of="2023-06-01", sampling=greedy(6))
    assert answer.plan_status == "inject"
    text = memory.generate(user_id="tim", query="Where does Tim live?", k=5,
                           as_of="2023-06-01", sampling=greedy(6), mode="text")
    assert answer.token_ids == text.token_ids  # the old fact's KV is the plain prefill's
    # ... and a search of the present still does not see it
    assert old.fact_id not in memory.search(user_id="tim", query="Boston", k=5).handle.fact_ids


def test_supersede_without_text_ends_a_fact_and_refuses_twice_foreign_and_bad_input(memory):
    (fact,) = memory.add(user_id="ann", texts=["Ann works at Acme."])
    (other,) = memory.add(user_id="bob", texts=["Bob works at Initech."])
    with pytest.raises(FactNotFoundError):
        memory.supersede(user_id="ann", fact_id=other.fact_id, text="x")
    with pytest.raises(InvalidRequestError, match="timestamp"):
        memory.supersede(user_id="ann", fact_id=fact.fact_id, timestamp="next tuesday")
    assert memory.supersede(user_id="ann", fact_id=fact.fact_id) is None
    assert memory.records(user_id="ann") == []
    assert memory.search(user_id="ann", query="Acme", k=3).handle.fact_ids == ()
    with pytest.raises(FactNotFoundError, match="already superseded"):
        memory.supersede(user_id="ann", fact_id=fact.fact_id, text="Ann works at Globex.")
    assert [r.text for r in memory.records(user_id="bob")] == ["Bob works at Initech."]


def test_timestamps_are_stored_and_bad_times_store_nothing(memory):
    (fact,) = memory.add(user_id="cy", texts=["Cy adopted a cat."], timestamp=1_600_000_000)
    assert memory.get(user_id="cy", fact_id=fact.fact_id).valid_from == 1_600_000_000.0
    for bad in ("soon", float("inf"), True, [1.0]):
        with pytest.raises(InvalidFactError, match="timestamp"):
            memory.add(user_id="cy", texts=["Cy adopted a dog."], timestamp=bad)
    assert [r.text for r in memory.records(user_id="cy")] == ["Cy adopted a cat."]
    with pytest.raises(InvalidRequestError, match="not both"):
        memory.records(user_id="cy", as_of="2020-01-01", include_superseded=True)


def test_a_supersede_threshold_lets_a_newer_similar_fact_replace_an_older_one(
        module_engine, tmp_path):
    from inferscale_engine.memory import Memory

    with Memory(module_engine, tmp_path / "t.db", HashEmbedder(), progress_bar=False,
                supersede_threshold=0.6) as memory:
        (old,) = memory.add(user_id="dee", texts=["Dee's favourite colour is blue."])
        (kept,) = memory.add(user_id="dee", texts=["Dee plays the cello on Sundays."])
        (new,) = memory.add(user_id="dee", texts=["Dee's favourite colour is now red."])
        current = {r.fact_id for r in memory.records(user_id="dee")}
        assert current == {kept.fact_id, new.fact_id}
        (stored,) = [r for r in memory.records(user_id="dee", include_superseded=True)
                     if r.fact_id == old.fact_id]
        assert stored.superseded_by == new.fact_id
        assert memory.stats().counters["superseded"] == 1
    with pytest.raises(Exception, match="supersede_threshold"):
        Memory(module_engine, tmp_path / "u.db", HashEmbedder(), supersede_threshold=1.5)
