"""Many distinct system prompts (agents, chat engines with retrieved context) must not fill the
slab: extra preambles are kept least recently used and evicted, never the configured one."""

from __future__ import annotations

import pytest

from inferscale_engine.facts import MemoryHandle
from tests.conftest import FACTS, QUESTIONS, greedy, max_abs_diff, running_engine

pytestmark = pytest.mark.vllm


def test_distinct_system_prompts_are_evicted_not_accumulated(tiny_models):
    # 8 MiB slab: ~125 pages of 16 tokens of tiny-model KV. 40 system prompts of ~7 pages would
    # need 280; even MAX_PREAMBLES of them do not fit, so both the cap and the slab evict.
    with running_engine(tiny_models["qwen2"], slab_capacity_bytes=8 * 2**20) as engine:
        ids = engine.add_facts("u", FACTS[:3])
        handle = MemoryHandle("u", tuple(ids))
        free_start = engine.stats().num_free_pages
        worst = 0.0
        for i in range(40):
            system = f"Context {i}: " + " ".join(f"item{i}-{j}" for j in range(10))
            messages = [{"role": "system", "content": system},
                        {"role": "user", "content": QUESTIONS[i % 3]}]
            kv = engine.generate(handle, messages, greedy(4), mode="kv")
            assert kv.mode == "kv" and kv.plan_status == "inject", (i, kv.plan_status)
            # the facts' KV was encoded after the configured preamble, so only a request
            # without facts must equal text mode exactly: its whole preamble is injected
            alone = engine.generate(MemoryHandle("u", ()), messages, greedy(4), mode="kv")
            text = engine.generate(MemoryHandle("u", ()), messages, greedy(4), mode="text")
            assert alone.plan_status == "inject" and alone.num_injected_tokens > 0
            worst = max(worst, max_abs_diff(alone.logprobs, text.logprobs))
        stats = engine.stats()
        kept, cap = len(engine._preambles), engine._preambles.MAX_PREAMBLES + 1
        print(f"\n40 system prompts: {stats.counters['evicted_preambles']} preambles evicted, "
              f"{kept} kept (cap {cap}); free pages {stats.num_free_pages} "
              f"(start {free_start}); max |dlogprob| kv vs text {worst:.2e}")
        assert kept <= cap
        assert stats.counters["evicted_preambles"] == 40 - (kept - 1)
        assert stats.counters["requests_kv"] == 80
        assert stats.counters.get("fallback_text_evicted", 0) == 0
        assert worst <= 1e-5
        # the configured preamble was never evicted: a plain question still injects
        out = engine.generate(handle, QUESTIONS[0], greedy(4), mode="kv")
        assert out.plan_status == "inject"
        # all extra preambles' pages come back when they are evicted
        engine._preambles.evict(0)
        assert engine.stats().num_free_pages == free_start
