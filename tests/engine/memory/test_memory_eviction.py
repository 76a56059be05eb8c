"""Slab pressure: a slab sized for 100 facts serves requests over 1,000 facts. Evicted facts stay
durable and, with no lower KV tier (host_tier_bytes=0; tiers: test_tiers.py), are re-encoded on
demand; the outputs equal those of an engine whose slab never
evicts (same database, restarted, each fact encoded on first use), and the counters add up with
the worker's."""

from __future__ import annotations

import math
import random
import time

import pytest

from inferscale_engine.facts import MemoryHandle
from inferscale_engine.memory import Memory
from inferscale_engine.model.check import kv_bytes_per_token as _kv_bytes_per_token
from tests.conftest import engine_config, greedy, max_abs_diff, running_engine
from tests.engine.memory.memory_support import SHORT_SYSTEM_PROMPT, HashEmbedder, crash_texts

pytestmark = pytest.mark.vllm

NUM_FACTS = 1_000
SLAB_FACTS = 100
NUM_REQUESTS = 40
K = 5
PAGE_TOKENS = 16  # every fact of crash_texts fits one page


def slab_bytes(model, num_facts: int) -> int:
    """A slab of exactly `num_facts` one-page facts plus the preamble."""
    from transformers import AutoConfig, AutoTokenizer

    from inferscale_engine.prompting.prompt import PromptBuilder

    config = engine_config(model, system_prompt=SHORT_SYSTEM_PROMPT)
    preamble = PromptBuilder(AutoTokenizer.from_pretrained(str(model)),
                             SHORT_SYSTEM_PROMPT).preamble()
    pages = num_facts + math.ceil(len(preamble) / PAGE_TOKENS)
    return pages * PAGE_TOKENS * _kv_bytes_per_token(AutoConfig.from_pretrained(str(model)),
                                                      config)


def ask(memory, subset):
    return memory.generate(user_id="u", query="What do you know about me?",
                           handle=MemoryHandle("u", subset), sampling=greedy(4))


def test_small_slab_serves_many_facts_exactly_and_counts_every_eviction(tiny_models, tmp_path):
    model, db = tiny_models["qwen2"], tmp_path / "evict.db"
    rng = random.Random(11)
    settings = dict(system_prompt=SHORT_SYSTEM_PROMPT, max_model_len=2048, host_tier_bytes=0)
    start = time.perf_counter()
    with running_engine(model, slab_capacity_bytes=slab_bytes(model, SLAB_FACTS),
                        **settings) as engine:
        memory = Memory(engine, db, HashEmbedder(), dedupe_threshold=None, progress_bar=False)
        texts = crash_texts(NUM_FACTS)
        ids = [r.fact_id for lo in range(0, NUM_FACTS, 50)
               for r in memory.add(user_id="u", texts=texts[lo:lo + 50])]
        assert memory.stats().engine.counters["evicted_facts"] == NUM_FACTS - SLAB_FACTS
        requests = [tuple(rng.sample(ids, K)) for _ in range(NUM_REQUESTS)]
        small, expected_reencodes = [], 0
        for subset in requests:
            expected_reencodes += sum(not engine.is_resident(i) for i in subset)
            small.append(ask(memory, subset))
            assert small[-1].plan_status == "inject"
        before_fallback = memory.stats()
        assert before_fallback.num_resident == SLAB_FACTS
        # More facts than the slab can hold at once: served in text mode, counted, and
        # nothing is evicted for a request that cannot fit anyway.
        too_many = ask(memory, tuple(ids[:SLAB_FACTS + 1]))
        assert too_many.mode == "text" and too_many.token_ids
        stats = memory.stats()
        assert stats.engine.counters["evicted_facts"] == (
            before_fallback.engine.counters["evicted_facts"])
        memory.close()
    counters, worker = stats.engine.counters, stats.engine.workers[0]
    assert before_fallback.engine.counters["evicted_facts"] == (
        NUM_FACTS - SLAB_FACTS + expected_reencodes)  # a full slab: one out per one in
    assert counters["reencoded_facts"] == expected_reencodes
    assert counters["encoded_facts"] == 1 + NUM_FACTS + expected_reencodes  # 1: the preamble
    # Every encoded fact is either resident or was evicted exactly once.
    assert counters["evicted_facts"] == counters["encoded_facts"] - 1 - stats.num_resident
    assert worker["captures"] == counters["encoded_facts"]
    assert worker["num_entries"] == stats.num_resident + 1  # evicted entries were freed
    assert counters["requests_kv"] == NUM_REQUESTS and counters["fallback_text_evicted"] == 1
    assert stats.num_facts == NUM_FACTS and stats.num_indexed == NUM_FACTS
    small_s = time.perf_counter() - start

    with running_engine(model, slab_capacity_bytes=slab_bytes(model, NUM_FACTS + 8),
                        **settings) as engine:
        # The reference: each fact encoded on demand, in a slab that never evicts.
        memory = Memory(engine, db, HashEmbedder(), startup="lazy", progress_bar=False)
        worst = 0.0
        for subset, expected in zip(requests, small, strict=True):
            out = ask(memory, subset)
            assert out.plan_status == "inject" and out.token_ids == expected.token_ids
            worst = max(worst, max_abs_diff(out.logprobs, expected.logprobs))
        big = memory.stats().engine.counters
        memory.close()
    assert worst <= 1e-5
    assert "evicted_facts" not in big and big["encoded_facts"] == 1 + len(
        {i for subset in requests for i in subset})
    print(f"\n[eviction] slab of {SLAB_FACTS} facts, {NUM_FACTS} facts, {NUM_REQUESTS} requests "
          f"of {K}: evicted {counters['evicted_facts']}, re-encoded "
          f"{counters['reencoded_facts']}, encoded {counters['encoded_facts']} (worker "
          f"captures {worker['captures']}), text fallbacks {counters['fallback_text_evicted']}; "
          f"vs a slab that never evicts: max |dlogprob| {worst:.1e} ({small_s:.0f} s + "
          f"{time.perf_counter() - start - small_s:.0f} s)")
