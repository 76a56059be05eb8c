"""A request without facts whose preamble is in vLLM's prefix cache but for a few tokens runs no
load: vLLM computes those tokens (the same KV as a plain prefill of the preamble), because a
load's fixed cost (indices, upload, launch) is worth more than computing fewer than 16 tokens.
On the H200 that load was ~5% of a k=0 request's TTFT (benchmarks/gpu/floor_probe.py, kv-noload).
A preamble whose uncached tail is longer is still injected.
"""

from __future__ import annotations

import pytest

from inferscale_engine.connector.scheduler import COMPUTE_BELOW_TOKENS
from inferscale_engine.facts import MemoryHandle
from tests.conftest import greedy, max_abs_diff, plain_prefill, running_engine

pytestmark = pytest.mark.vllm


def _system_prompt(engine, block_size: int, tail: range) -> tuple[list[dict[str, str]], int]:
    """A chat whose preamble spans at least one whole block and ends `tail` tokens into the next."""
    for words in range(20, 400):
        messages = [{"role": "system", "content": " ".join(f"rule{j}" for j in range(words))},
                    {"role": "user", "content": "What are the rules?"}]
        n = len(engine.render_prompt(MemoryHandle("u", ()), messages).preamble)
        if n > block_size and n % block_size in tail:
            return messages, n
    raise AssertionError(f"no system prompt with a preamble tail in {tail}")


def test_a_cached_preamble_with_a_short_tail_is_computed_not_loaded(tiny_models):
    with running_engine(tiny_models["llama"]) as engine:
        block_size = engine.llm.llm_engine.vllm_config.cache_config.block_size
        empty = MemoryHandle("u", ())
        for tail, loads_again in ((range(1, COMPUTE_BELOW_TOKENS), False),
                                  (range(COMPUTE_BELOW_TOKENS, block_size), True)):
            messages, n = _system_prompt(engine, block_size, tail)
            first = engine.generate(empty, messages, greedy(4), mode="kv")
            assert first.plan_status == "inject" and first.num_injected_tokens == n  # none cached
            before = engine.stats().worker_totals["injected_requests"]
            again = engine.generate(empty, messages, greedy(4), mode="kv")
            loads = engine.stats().worker_totals["injected_requests"] - before
            assert again.plan_status == "inject" and not again.fallback
            assert again.num_cached_tokens == n - n % block_size + again.num_injected_tokens
            assert again.num_injected_tokens == (n % block_size if loads_again else 0)
            assert loads == loads_again
            ids = list(engine.render_prompt(empty, messages).token_ids())
            reference = plain_prefill(engine, ids, greedy(4))
            assert again.token_ids == reference.token_ids
            assert max_abs_diff(again.logprobs, reference.logprobs) <= 1e-5
