"""Invariant 7: chunked prefill, preemption and aborts.

Injected requests whose prompts are split over many steps (small token budget) and that are
preempted (tiny paged cache, many concurrent requests) produce the same outputs as isolated
runs; aborted requests leave no state in the connector.
"""

from __future__ import annotations

import pytest

from inferscale_engine.facts import MemoryHandle
from tests.conftest import ARCHS, FACTS, QUESTIONS, greedy, max_abs_diff, running_engine

pytestmark = pytest.mark.vllm
TOLERANCE = 1e-5


def scheduler_half(engine):
    """The scheduler-side connector object (MP=0: same process)."""
    return engine.llm.llm_engine.engine_core.engine_core.scheduler.connector.scheduler


@pytest.fixture(scope="module", params=ARCHS)
def engine(request, tiny_models):
    # 32-token blocks, 48-token steps and room for 24 blocks: prompts of ~180 tokens take 4+
    # steps and 8 concurrent requests cannot all fit. Prefix caching off, so a preempted
    # request cannot get its injected blocks back from the cache: it must be re-injected.
    with running_engine(tiny_models[request.param], block_size=32, max_model_len=512,
                        enable_prefix_caching=False,
                        max_num_batched_tokens=48, max_num_seqs=8,
                        kv_cache_memory_bytes=3 * 2**20, context_window_tokens=32) as eng:
        yield eng


def test_chunked_and_preempted_requests_match_isolated_runs(engine):
    users = [f"u{i}" for i in range(8)]
    handles = []
    for i, user in enumerate(users):
        facts = [FACTS[(i + j) % len(FACTS)] for j in range(4)]
        handles.append(MemoryHandle(user, tuple(engine.add_facts(user, facts))))
    requests = [(h, QUESTIONS[i % len(QUESTIONS)]) for i, h in enumerate(handles)]
    sampling = greedy(24)
    isolated = [engine.generate(h, q, sampling) for h, q in requests]
    scheduler = engine.llm.llm_engine.engine_core.engine_core.scheduler
    preempt, preemptions = scheduler._preempt_request, []

    def counting_preempt(request, *args, **kwargs):
        preemptions.append(request.request_id)
        return preempt(request, *args, **kwargs)

    scheduler._preempt_request = counting_preempt
    resumed_before = scheduler_half(engine).counters["resumed"]
    try:
        together = engine.generate_many(requests, sampling)
    finally:
        scheduler._preempt_request = preempt
    resumed = scheduler_half(engine).counters["resumed"] - resumed_before
    pairs = list(zip(isolated, together))
    print(f"\n[{engine.config.model}] 8 concurrent injected requests: {len(preemptions)} "
          f"preemptions, {resumed} re-injections after resumption, worst |dlogprob| vs "
          f"isolated {max(max_abs_diff(a.logprobs, b.logprobs) for a, b in pairs):.2e}")
    assert preemptions and resumed > 0, "the test did not trigger preemption + re-injection"
    for alone, batched in zip(isolated, together):
        assert batched.plan_status == "inject"
        assert batched.token_ids == alone.token_ids
        assert max_abs_diff(batched.logprobs, alone.logprobs) <= TOLERANCE
    assert scheduler_half(engine).num_tracked_requests() == 0


def test_aborted_requests_leave_no_connector_state(engine):
    from vllm import TokensPrompt

    handle = MemoryHandle("abort-user", tuple(engine.add_facts("abort-user", FACTS[:3])))
    llm_engine = engine.llm.llm_engine
    request_ids = []
    for i in range(12):  # more than max_num_seqs: some are still waiting when aborted
        prompt, plan = engine.prepare_request(
            handle, [{"role": "user", "content": QUESTIONS[i % 3]}])
        sampling = greedy(40)
        sampling.extra_args = {"kv_transfer_params": plan.to_params()}
        request_id = f"abort-{i}"
        llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=prompt.token_ids(),
                                                        cache_salt=plan.cache_salt), sampling)
        request_ids.append(request_id)
    for _ in range(3):
        llm_engine.step()
    assert scheduler_half(engine).num_tracked_requests() > 0
    llm_engine.abort_request(request_ids)
    while llm_engine.has_unfinished_requests():
        llm_engine.step()
    assert scheduler_half(engine).num_tracked_requests() == 0
    out = engine.generate(handle, QUESTIONS[0], greedy(4))
    assert out.plan_status == "inject"
