"""MP=1: capture and injection work when vLLM's EngineCore runs in its own process."""

from __future__ import annotations

import pytest

from inferscale_engine.facts import MemoryHandle
from tests.conftest import FACTS, QUESTIONS, greedy, max_abs_diff, running_engine

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("arch", ["llama"])
def test_capture_and_injection_across_processes(tiny_models, arch):
    with running_engine(tiny_models[arch], multiprocessing=True) as engine:
        assert engine._planner.handoff is None  # plans cross the process boundary signed
        (fact_id,) = engine.add_facts("u1", [FACTS[0]])
        handle = MemoryHandle("u1", (fact_id,))
        kv = engine.generate(handle, QUESTIONS[0], greedy(8), mode="kv")
        text = engine.generate(handle, QUESTIONS[0], greedy(8), mode="text")
        stats = engine.stats().workers[0]
        diff = max_abs_diff(kv.logprobs, text.logprobs)
        print(f"\nMP=1: same-position max |dlogprob| {diff:.2e}, worker stats {stats}")
        assert kv.plan_status == "inject" and kv.token_ids == text.token_ids
        assert diff <= 1e-5
        assert stats["captures"] == 2 and stats["injected_requests"] == 1


@pytest.mark.timeout(300)  # a hang is the failure this test guards against
def test_a_request_that_cannot_be_submitted_leaves_the_engine_serving(tiny_models):
    """A value vLLM cannot serialize for its engine process (a lone surrogate) fails the call,
    in any field, and the next call is served: no orphan request, no hang."""
    from vllm import SamplingParams

    bad = "\ud800"
    fields = {"stop": [bad], "extra_args": {"note": bad}, "bad_words": [bad]}
    with running_engine(tiny_models["llama"], multiprocessing=True) as engine:
        (fact_id,) = engine.add_facts("u1", [FACTS[0]])
        handle = MemoryHandle("u1", (fact_id,))
        reference = engine.generate(handle, QUESTIONS[0], greedy(4))
        for name, value in fields.items():
            sampling = SamplingParams(max_tokens=4, temperature=0.0, logprobs=1,
                                      **{name: value})
            for mode in ("kv", "text"):
                try:
                    engine.generate(handle, QUESTIONS[0], sampling, mode=mode)
                except Exception:  # noqa: BLE001 - refused: what matters is what follows
                    pass
                states = engine.llm.llm_engine.output_processor.request_states
                assert not states, (name, mode, list(states))
                again = engine.generate(handle, QUESTIONS[0], greedy(4))
                assert again.token_ids == reference.token_ids, (name, mode)
