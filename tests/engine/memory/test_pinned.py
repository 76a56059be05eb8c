"""Pinned facts through Memory (memory/pinning.py) over FakeRunner: no vLLM, seconds per test.

A pinned fact is in every answer of its user, first (after the preamble), outside k and not
repeated among the retrieved; its KV is never evicted while pinned; the flag survives a
restart; superseding, expiry and deletion unpin; no user's pins reach another's request; bad
input and full caps are refused with nothing stored. The KV it injects is checked against a
plain prefill on the real engine in test_pinned_kv.py.
"""

from __future__ import annotations

import time

import pytest

from inferscale_engine.errors import FactNotFoundError, InvalidRequestError
from inferscale_engine.facts import MemoryHandle
from tests.conftest import engine_config
from tests.engine.memory.memory_support import HashEmbedder
from tests.fake_runner import FakeRunner

FACTS = ["Ann lives in Lisbon.", "Ann has a cat named Mio.", "Ann plays the violin.",
         "Ann works as a nurse.", "Ann likes green tea."]


def _engine(tiny_models, **overrides):
    from inferscale_engine.runtime.engine import Engine

    return Engine(engine_config(tiny_models["qwen2"], host_tier_bytes=0, **overrides),
                  runner=FakeRunner)


def _memory(engine, path):
    from inferscale_engine.memory import Memory

    return Memory(engine, path, HashEmbedder(), progress_bar=False)


@pytest.fixture()
def engine(tiny_models):
    with _engine(tiny_models) as eng:
        yield eng


@pytest.fixture()
def memory(engine, tmp_path):
    with _memory(engine, tmp_path / "m.db") as mem:
        yield mem


def test_pinned_facts_come_first_in_every_answer_outside_k_and_are_not_repeated(memory, engine):
    ids = [r.fact_id for r in memory.add(user_id="ann", texts=FACTS)]
    (pin,) = [r.fact_id for r in memory.add(user_id="ann", texts=["Ann is vegetarian."],
                                            pinned=True)]
    assert memory.pinned(user_id="ann") == [pin] and memory.get(user_id="ann", fact_id=pin).pinned
    handle = memory.handle_for(user_id="ann", query="Is Ann vegetarian?", k=3)
    assert handle.fact_ids[0] == pin and pin not in handle.fact_ids[1:]
    assert len(handle.fact_ids) == 4 and set(handle.fact_ids[1:]) <= set(ids)  # k new facts
    blank = memory.handle_for(user_id="ann", query=None, k=3)
    assert blank.fact_ids == (pin,)
    memory.generate(user_id="ann", query="Where do I live?", k=2)
    sent = engine._runner.requests[-1][0]["prompt_token_ids"]
    pinned_tokens = list(engine._facts[pin].fact.token_ids)
    preamble = list(engine.prompts.preamble())
    assert sent[:len(preamble) + len(pinned_tokens)] == preamble + pinned_tokens
    assert sent == engine.render_prompt(
        memory.handle_for(user_id="ann", query="Where do I live?", k=2),
        "Where do I live?").token_ids()


def test_other_users_facts_never_evict_a_pinned_fact_until_it_is_unpinned(tiny_models, tmp_path):
    from tests.engine.test_pins import SLAB_PAGES
    from tests.engine.test_pins import _engine as small_engine

    with small_engine(tiny_models) as engine, _memory(engine, tmp_path / "m.db") as memory:
        (pin, other) = [r.fact_id for r in memory.add(
            user_id="ann", texts=["Ann is vegetarian.", "Ann has a cat."])]
        memory.pin(user_id="ann", fact_ids=[pin])
        for user in ("bo", "cy"):
            if user == "cy":
                assert memory.unpin(user_id="ann", fact_ids=[pin]) == [pin]
            for i in range(3 * SLAB_PAGES):  # another user's facts, far beyond the slab
                memory.add(user_id=user, texts=[f"{user} note {i}: room {i} is booked at {i}."])
            assert engine.stats().counters["evicted_facts"] > SLAB_PAGES
            assert engine.is_resident(pin) == (user == "bo") and not engine.is_resident(other)


def test_pins_survive_a_restart_and_follow_updates(engine, tmp_path):
    path = tmp_path / "m.db"
    with _memory(engine, path) as memory:
        pin, other = [r.fact_id for r in memory.add(user_id="ann", texts=FACTS[:2])]
        memory.pin(user_id="ann", fact_ids=[pin])
    assert engine.pinned_facts("ann") == []  # the closed Memory's facts left the engine
    with _memory(engine, path) as memory:
        assert memory.pinned(user_id="ann") == [pin] and engine.is_resident(pin)
        memory.update(user_id="ann", fact_id=pin, text="Ann lives in Porto.")
        assert memory.pinned(user_id="ann") == [pin]  # an edit keeps the pin
        assert memory.handle_for(user_id="ann", query="x", k=1).fact_ids[0] == pin


def test_superseded_expired_and_deleted_pinned_facts_are_no_longer_served(memory):
    a, b, c = [r.fact_id for r in memory.add(user_id="ann", texts=FACTS[:3], pinned=True,
                                            expiration_date=time.time() + 3600)]
    assert memory.pinned(user_id="ann") == [a, b, c]
    new = memory.supersede(user_id="ann", fact_id=a, text="Ann moved to Porto.")
    assert new is not None and memory.pinned(user_id="ann") == [b, c, new.fact_id]
    assert not memory.records(user_id="ann", include_superseded=True)[0].pinned
    assert memory.get(user_id="ann", fact_id=new.fact_id).pinned  # the newer one keeps it
    assert memory.supersede(user_id="ann", fact_id=new.fact_id) is None  # no longer true
    assert memory.pinned(user_id="ann") == [b, c]
    memory.delete(user_id="ann", fact_ids=[b])
    assert memory.pinned(user_id="ann") == [c]
    memory._served.expire_due(now=time.time() + 7200)  # c's expiry has passed
    assert memory.pinned(user_id="ann") == []
    assert c not in memory.handle_for(user_id="ann", query="Where?", k=5).fact_ids
    with pytest.raises(FactNotFoundError, match="superseded or have expired"):
        memory.pin(user_id="ann", fact_ids=[a])


def test_one_users_pins_never_reach_another_users_request(memory):
    (pin,) = [r.fact_id for r in memory.add(user_id="ann", texts=["Ann's PIN is 4321."],
                                            pinned=True)]
    memory.add(user_id="bo", texts=["Bo's PIN is 1234.", "Bo has a dog."])
    for query in ("What is the PIN?", None):
        assert pin not in memory.handle_for(user_id="bo", query=query, k=5).fact_ids
    assert memory.pinned(user_id="bo") == []
    with pytest.raises(FactNotFoundError):
        memory.pin(user_id="bo", fact_ids=[pin])
    with pytest.raises(FactNotFoundError):
        memory.unpin(user_id="bo", fact_ids=[pin])
    assert memory.pinned(user_id="ann") == [pin]


def test_bad_pinned_input_and_full_caps_are_refused_with_nothing_stored(tiny_models, tmp_path):
    with _engine(tiny_models, max_pinned_tokens=24) as engine, \
            _memory(engine, tmp_path / "m.db") as memory:
        for bad in ({"pinned": "yes"}, {"pinned": True, "wait": False},
                    {"pinned": True, "infer": True}):
            with pytest.raises(InvalidRequestError, match="pinned"):
                memory.add(user_id="ann", texts=["Ann is vegetarian."], **bad)
        memory.add(user_id="ann", texts=["Ann is vegetarian."], pinned=True)
        with pytest.raises(InvalidRequestError, match=r"pinned tokens, over the cap of 24"):
            memory.add(user_id="ann", texts=["Ann plays the violin every Sunday morning."],
                       pinned=True)
        assert len(memory.records(user_id="ann")) == 1
        (long,) = [r.fact_id for r in memory.add(
            user_id="ann", texts=["Ann plays the violin every Sunday morning."])]
        with pytest.raises(InvalidRequestError, match="cap of 24"):
            memory.pin(user_id="ann", fact_ids=[long])
        (pin,) = memory.pinned(user_id="ann")
        with pytest.raises(InvalidRequestError, match="cap of 24"):
            memory.update(user_id="ann", fact_id=pin,
                          text="Ann is vegetarian and cooks every Sunday for all her friends.")
        assert memory.get(user_id="ann", fact_id=pin).text == "Ann is vegetarian."
        assert not memory.get(user_id="ann", fact_id=long).pinned
        before = len(memory.records(user_id="ann", include_superseded=True))
        with pytest.raises(InvalidRequestError, match="cap of 24"):  # its newer fact would be
            memory.supersede(user_id="ann", fact_id=pin,       # pinned: over the cap
                             text="Ann is vegetarian and cooks every Sunday for all her friends.")
        assert memory.pinned(user_id="ann") == [pin]  # nothing changed
        assert len(memory.records(user_id="ann", include_superseded=True)) == before
        with pytest.raises(FactNotFoundError):
            memory.pin(user_id="ann", fact_ids=[10**6])


def test_a_pinned_add_that_repeats_a_stored_fact_pins_that_fact(memory):
    (stored,) = [r.fact_id for r in memory.add(user_id="ann", texts=["Ann is vegetarian."])]
    (again,) = memory.add(user_id="ann", texts=["Ann is vegetarian."], pinned=True)
    assert (again.event, again.fact_id) == ("DUPLICATE", stored)
    assert memory.pinned(user_id="ann") == [stored]


def test_a_handle_naming_a_pinned_fact_late_still_serves_it_first(memory, engine):
    a, b = [r.fact_id for r in memory.add(user_id="ann", texts=FACTS[:2])]
    memory.pin(user_id="ann", fact_ids=[b])
    prompt = engine.render_prompt(MemoryHandle("ann", (a, b)), "Hi")
    assert prompt.facts[0] == engine._facts[b].fact.token_ids


def test_an_automatic_supersession_moves_the_pin_to_the_newer_fact(engine, tmp_path):
    from inferscale_engine.memory import Memory
    from tests.engine.memory.memory_support import TableEmbedder

    old, new, other = "Ann's diet: vegetarian.", "Ann's diet: vegan.", "Ann plays chess."
    table = TableEmbedder({old: [1.0, 0.0, 0.0], new: [0.98, 0.2, 0.0], other: [0.0, 1.0, 0.0]})
    with Memory(engine, tmp_path / "m.db", table, progress_bar=False,
                supersede_threshold=0.9) as memory:
        (pinned,) = memory.add(user_id="ann", texts=[old], pinned=True)
        memory.add(user_id="ann", texts=[other])
        (newer,) = memory.add(user_id="ann", texts=[new])
        assert memory.get(user_id="ann", fact_id=pinned.fact_id).superseded_by == newer.fact_id
        assert memory.pinned(user_id="ann") == [newer.fact_id]
        handle = memory.handle_for(user_id="ann", query="What does Ann play?", k=1)
        assert handle.fact_ids[0] == newer.fact_id  # in every answer, first
