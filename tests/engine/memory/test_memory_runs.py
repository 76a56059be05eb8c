"""Memory with runs of facts (EngineConfig.context_run_tokens): facts added together are
encoded in one save request per run, stored with their run context, and rebuilt after a
restart from exactly the same tokens, in as many requests."""

from __future__ import annotations

import pytest
import torch

from inferscale_engine.facts import MemoryHandle
from inferscale_engine.memory import Memory
from inferscale_engine.memory.store.reserved import CONTEXT_KEY
from inferscale_engine.prompting.contexts import RunContext
from tests.conftest import FACTS, greedy, max_abs_diff, running_engine
from tests.engine.memory.memory_support import HashEmbedder

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def engine(tiny_models):
    with running_engine(tiny_models["qwen2"], context_window_tokens=16,
                        context_run_tokens=40) as eng:
        yield eng


def saves(engine) -> int:
    return engine.stats().counters.get("save_requests", 0)


def kv(engine, fact_id):
    (keys, values, _), = engine.workers.read_entry(engine._facts[fact_id].slab_key)
    return keys, values


def test_runs_are_stored_and_rebuilt_exactly(engine, tmp_path):
    db = str(tmp_path / "runs.db")
    with Memory(engine, db, HashEmbedder(), progress_bar=False, context_turns=4) as mem:
        before = saves(engine)
        first = [r.fact_id for r in mem.add(user_id="rita", texts=FACTS)]
        contexts = [RunContext.from_json(f.metadata[CONTEXT_KEY])
                    for f in mem._store.get(user_id="rita", fact_ids=first[1:])]
        runs = 1 + sum(1 for c in contexts if not c.facts)
        assert 1 < runs < len(FACTS) and saves(engine) - before == runs
        later = [r.fact_id for r in mem.add(user_id="rita", texts=["Rita paints owls.",
                                                                  "Rita swims at dawn."])]
        stored = mem._store.get(user_id="rita", fact_ids=later)
        lead = RunContext.from_json(stored[0].metadata[CONTEXT_KEY]).lead
        assert lead == "".join(f"- {t}\n" for t in FACTS[-4:])  # the user's last 4 facts
        assert RunContext.from_json(stored[1].metadata[CONTEXT_KEY]).facts == (
            "Rita paints owls.",)
        assert saves(engine) - before == runs + 1
        ids = first + later
        original = {i: kv(engine, i) for i in ids}
        handle = MemoryHandle("rita", tuple(ids))
        answer = mem.generate(user_id="rita", query="Who paints?", handle=handle,
                              sampling=greedy(4))
    assert answer.plan_status == "inject"
    start = saves(engine)
    with Memory(engine, db, HashEmbedder(), startup="encode", progress_bar=False) as mem:
        assert saves(engine) - start == runs + 1  # the same runs, one request each
        for i in ids:
            keys, values = kv(engine, i)
            assert torch.equal(keys, original[i][0]) and torch.equal(values, original[i][1])
        again = mem.generate(user_id="rita", query="Who paints?", handle=handle,
                             sampling=greedy(4))
    assert again.token_ids == answer.token_ids
    assert max_abs_diff(again.logprobs, answer.logprobs) <= 1e-5
