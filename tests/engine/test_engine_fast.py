"""The Engine's bookkeeping over FakeRunner (tests/fake_runner.py): no vLLM, ~1 s per test.

Ids, the write path's save requests, the read path's plans, deletes freeing slab entries; the
values of the KV itself are the invariant tests' (tests/invariants), on the real engine.
"""

from __future__ import annotations

import pytest

from inferscale_engine.errors import FactNotFoundError, InvalidFactError
from inferscale_engine.facts import MemoryHandle
from tests.conftest import engine_config
from tests.fake_runner import FakeRunner


@pytest.fixture()
def engine(tiny_models):
    from inferscale_engine.runtime.engine import Engine

    with Engine(engine_config(tiny_models["llama"]), runner=FakeRunner) as eng:
        yield eng


def test_the_engine_numbers_its_facts_and_encodes_each_once(engine):
    runner = engine._runner
    saves_before = len(runner.requests)  # the preamble's save at start-up
    ids = engine.add_facts("ann", ["Ann lives in Lisbon.", "Ann has a cat."])
    assert ids == [1, 2] and engine.add_facts("bo", ["Bo plays chess."]) == [3]
    assert len(runner.requests) - saves_before == 3  # one save request per fact
    assert all(engine.is_resident(i) for i in (1, 2, 3))
    with pytest.raises(InvalidFactError, match="already registered"):
        engine.add_facts("ann", ["Again."], fact_ids=[2])


def test_kv_requests_carry_a_plan_of_resident_facts(engine):
    ids = engine.add_facts("ann", ["Ann lives in Lisbon.", "Ann has a cat."])
    handle = MemoryHandle("ann", tuple(ids))
    kv = engine.generate(handle, "Where do I live?")
    text = engine.generate(handle, "Where do I live?", mode="text")
    assert (kv.plan_status, text.plan_status) == ("inject", "none")
    assert kv.num_injected_tokens > 0 and kv.text == FakeRunner.ANSWER
    prompt, plan = engine.prepare_request(handle, "Where do I live?")
    assert plan.num_tokens <= len(prompt.token_ids()) and plan.user_id == "ann"


def test_delete_frees_the_slab_and_forgets_the_fact(engine):
    (fact,) = engine.add_facts("cy", ["Cy likes rain."])
    key = engine._facts[fact].slab_key
    assert key in engine._runner.resident
    engine.delete("cy", [fact])
    assert key not in engine._runner.resident
    with pytest.raises(FactNotFoundError):
        engine.is_resident(fact)
