"""A pinned fact's KV on the real engine: served where it was encoded, so exact, and never evicted.

A fact encoded alone after the preamble sits, pinned, right after the preamble in every prompt:
its injected KV is the KV a plain prefill of the same prompt computes (|dlogprob| <= 1e-5, as
tests/invariants/test_same_position_exactness.py). Under another user's slab pressure it stays
resident: the same request is answered again with no fact encoded again.
"""

from __future__ import annotations

import pytest

from tests.conftest import greedy, max_abs_diff, plain_prefill, running_engine
from tests.engine.memory.memory_support import HashEmbedder

pytestmark = pytest.mark.vllm

TOLERANCE = 1e-5


def test_a_pinned_fact_injects_exact_kv_first_and_stays_resident(tiny_models, tmp_path):
    from inferscale_engine.memory import Memory

    slab_bytes = 2 * 2**20  # a few dozen facts of the tiny model
    with running_engine(tiny_models["qwen2"], slab_capacity_bytes=slab_bytes,
                        host_tier_bytes=0) as engine, \
            Memory(engine, tmp_path / "m.db", HashEmbedder(), progress_bar=False) as memory:
        memory.add(user_id="ann", texts=["Ann lives in Lisbon.", "Ann has a cat named Mio."])
        (pin,) = [r.fact_id for r in memory.add(
            user_id="ann", texts=["Ann is vegetarian and never eats fish."], pinned=True)]
        question = "What does Ann eat?"
        kv = memory.generate(user_id="ann", query=question, k=0, sampling=greedy(8))
        handle = memory.handle_for(user_id="ann", query=question, k=0)
        prompt = engine.render_prompt(handle, question).token_ids()
        reference = plain_prefill(engine, prompt, greedy(8))
        assert handle.fact_ids == (pin,) and kv.plan_status == "inject"
        assert kv.num_injected_tokens == len(engine.prompts.preamble()) + len(
            engine._facts[pin].fact.token_ids)
        assert kv.token_ids == reference.token_ids
        assert max_abs_diff(kv.logprobs, reference.logprobs) <= TOLERANCE
        with_top_k = memory.generate(user_id="ann", query=question, k=2, sampling=greedy(8))
        assert with_top_k.plan_status == "inject"
        assert with_top_k.num_injected_tokens > kv.num_injected_tokens
        evicted = engine.stats().counters.get("evicted_facts", 0)
        for i in range(0, 160, 8):  # another user's facts: more than the slab holds
            memory.add(user_id="bo", texts=[f"Bo note {j}: the meeting is in room {j}."
                                            for j in range(i, i + 8)])
        assert engine.stats().counters.get("evicted_facts", 0) > evicted
        assert engine.is_resident(pin)
        encoded = engine.stats().counters["encoded_facts"]
        again = memory.generate(user_id="ann", query=question, k=0, sampling=greedy(8))
        assert engine.stats().counters["encoded_facts"] == encoded  # nothing encoded again
        assert (again.plan_status, again.token_ids) == ("inject", kv.token_ids)
        assert max_abs_diff(again.logprobs, kv.logprobs) <= TOLERANCE
