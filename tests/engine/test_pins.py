"""Pinned facts in the engine (runtime/pins.py): never evicted, first in the prompt, capped.

Over FakeRunner (no vLLM): the slab's bookkeeping, the prompt's order and the caps. The KV a
pinned fact injects is the same as any fact's (tests/engine/memory/test_pinned.py compares it
with a plain prefill on the real engine).
"""

from __future__ import annotations

import pytest

from inferscale_engine.errors import FactNotFoundError, HandleError, InvalidRequestError
from inferscale_engine.facts import Fact, FactId, MemoryHandle
from inferscale_engine.prompting.layout import Layout
from inferscale_engine.runtime.residency import FactRecord, Residency, SlabAllocator
from inferscale_engine.runtime.tier_manager import HostResidency
from tests.conftest import engine_config
from tests.fake_runner import FakeRunner

PAGE_TOKENS = 16
SLAB_PAGES = 40


def _engine(tiny_models, **overrides):
    from transformers import AutoConfig

    from inferscale_engine.model.check import kv_bytes_per_token
    from inferscale_engine.runtime.engine import Engine

    model = tiny_models["llama"]
    per_token = kv_bytes_per_token(AutoConfig.from_pretrained(str(model)), engine_config(model))
    return Engine(engine_config(model, slab_capacity_bytes=SLAB_PAGES * PAGE_TOKENS * per_token,
                                slab_page_tokens=PAGE_TOKENS, host_tier_bytes=0, **overrides),
                  runner=FakeRunner)


@pytest.fixture()
def engine(tiny_models):
    with _engine(tiny_models) as eng:
        yield eng


def _fill(engine, user: str, count: int) -> list[FactId]:
    return [f for i in range(count)
            for f in engine.add_facts(user, [f"{user} note {i}: room {i} is booked at {i}."])]


def test_a_pinned_fact_stays_in_the_slab_under_other_users_pressure_until_unpinned(engine):
    pinned, other = engine.add_facts("ann", ["Ann is vegetarian.", "Ann has a cat."])
    engine.pin("ann", [pinned])
    engine.pin("ann", [pinned])  # again: nothing changes
    assert engine.pinned_facts("ann") == [pinned] and engine.pinned_facts("bo") == []
    _fill(engine, "bo", 3 * SLAB_PAGES)  # far more than the slab holds
    assert engine.stats().counters["evicted_facts"] > SLAB_PAGES
    assert engine.is_resident(pinned) and not engine.is_resident(other)
    assert engine.unpin("ann", [pinned, other]) == [pinned]
    _fill(engine, "cy", 3 * SLAB_PAGES)
    assert not engine.is_resident(pinned)
    engine._shards[0].residency.check()


def test_pinned_facts_come_first_and_are_never_repaired_as_text(engine):
    a, b, c = engine.add_facts("ann", ["Ann lives in Lisbon.", "Ann has a cat.",
                                       "Ann is vegetarian."])
    engine.pin("ann", [c])
    handle = MemoryHandle("ann", (a, b, c), (0.9, 0.8, 0.1))
    prompt = engine.render_prompt(handle, "What do I eat?")
    assert prompt.facts == tuple(engine._facts[f].fact.token_ids for f in (c, a, b))
    repairing = Layout(repair_facts=2, repair_placement="memory")
    prompt = engine.render_prompt(handle, "What do I eat?", layout=repairing)
    assert prompt.facts == (engine._facts[c].fact.token_ids,)  # a and b repaired, c injected
    assert prompt.repaired == tuple(engine._facts[f].fact.token_ids for f in (a, b))
    out = engine.generate(handle, "What do I eat?", layout=repairing)
    assert out.plan_status == "inject" and out.num_repaired_facts == 2


def test_the_per_user_cap_refuses_with_numbers_and_pins_nothing(tiny_models):
    with _engine(tiny_models, max_pinned_tokens=40) as engine:
        ids = engine.add_facts("ann", ["Ann lives in Lisbon with her two cats and a dog.",
                                       "Ann is a vegetarian who cooks on Sundays for friends."])
        engine.pin("ann", ids[:1])
        with pytest.raises(InvalidRequestError, match=r"over the cap of 40 .*max_pinned_tokens"):
            engine.pin("ann", ids[1:])
        assert engine.pinned_facts("ann") == ids[:1]
        with pytest.raises(InvalidRequestError, match="max_pinned_tokens"):
            engine.check_pins("ann", [15])
        engine.check_pins("bo", [15])  # another user's cap is its own


def test_the_slab_cap_bounds_every_users_pins_together(tiny_models):
    with _engine(tiny_models, max_pinned_slab_fraction=0.1) as engine:  # 4 of 40 pages
        ids = [engine.add_facts(u, [f"{u} likes tea."])[0] for u in ("a", "b", "c", "d", "e")]
        for user, fact in zip("abcd", ids, strict=False):
            engine.pin(user, [fact])
        with pytest.raises(InvalidRequestError, match=r"hold 5 of the slab's 40 pages, over 4"):
            engine.pin("e", [ids[4]])
        engine.delete("a", [ids[0]])  # a deleted fact is unpinned: its pages are free again
        engine.pin("e", [ids[4]])
        assert engine.pinned_facts("a") == [] and engine.pinned_facts("e") == [ids[4]]


def test_pinning_needs_the_users_own_known_facts(engine):
    (mine,) = engine.add_facts("ann", ["Ann has a cat."])
    (theirs,) = engine.add_facts("bo", ["Bo has a dog."])
    with pytest.raises(HandleError):
        engine.pin("ann", [mine, theirs])
    with pytest.raises(FactNotFoundError):
        engine.pin("ann", [10**6])
    with pytest.raises(HandleError):
        engine.unpin("bo", [mine])
    assert engine.pinned_facts("ann") == [] and engine.pinned_facts("bo") == []


def test_zero_max_pinned_tokens_turns_pinning_off(tiny_models):
    with _engine(tiny_models, max_pinned_tokens=0) as engine:
        (fact,) = engine.add_facts("ann", ["Ann has a cat."])
        with pytest.raises(InvalidRequestError, match="cap of 0"):
            engine.pin("ann", [fact])


def _record(fact_id: int, tokens: int = 4) -> FactRecord:
    return FactRecord(Fact(FactId(fact_id), "u", "x", (1,) * tokens), ())


def test_residency_and_the_host_tier_pass_over_held_facts():
    held = {FactId(1)}
    residency = Residency(SlabAllocator(2, 4), held=held)
    for rec in (_record(1), _record(2)):
        pages, _ = residency.allocate(4, set(), evict=False)
        residency.admit(rec, residency.next_slab_key(), pages)
    assert not residency.can_fit([4, 4], set(), evict=True)  # fact 1 cannot make room
    _, evicted = residency.allocate(4, set(), evict=True)
    assert [r.fact.fact_id for r in evicted] == [2]
    host = HostResidency(2, 4, held)
    keys = iter(range(100, 200))
    one, two, three = _record(1), _record(2), _record(3)
    for rec in (one, two, three):
        rec.slab_key = 7
    host.demote([one, two], keys)
    moves, dropped = host.demote([three], keys)
    assert dropped == [101] and one.host_key == 100 and three.host_key is not None
    assert len(moves) == 1
    moves, dropped = host.demote([_record(5, 8)], keys)  # needs both pages: 1 is held
    assert (moves, dropped) == ([], [])
