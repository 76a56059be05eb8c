"""A save plan writes once, for the prompt and the slab allocation it was issued for.

A leaked save plan replayed later (same prompt, another prefix, after its fact was deleted,
after another user's fact took its slab pages) must not change any stored KV: the replay is
refused by the scheduler (MAC over the whole prompt) or by the worker (the slab key is not
newer than the pages' last capture), and every user's kv answer stays bit-identical.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from vllm import SamplingParams, TokensPrompt

from inferscale_engine.facts import MemoryHandle
from inferscale_engine.protocol.plan import cache_salt
from inferscale_engine.runtime.generation import RESULT_KEY
from tests.conftest import greedy, max_abs_diff, running_engine

pytestmark = pytest.mark.vllm

CAROL = "Caroline plays chess and has a rabbit."
DAVE = "Melanie loves pottery and went to Lima."


@pytest.fixture(scope="module")
def engine(tiny_models):
    with running_engine(tiny_models["qwen2"]) as eng:
        yield eng


def add_recording(engine, monkeypatch, user_id, text):
    """Add one fact; returns its id and the (plan, prompt) of its save request."""
    recorded = []
    original = engine._writer.run_saves

    def spy(plans, prompts):
        recorded.extend(zip(plans, prompts, strict=True))
        return original(plans, prompts)

    monkeypatch.setattr(engine._writer, "run_saves", spy)
    (fact_id,) = engine.add_facts(user_id, [text])
    monkeypatch.setattr(engine._writer, "run_saves", original)
    return fact_id, recorded[-1]


def replay(engine, plan, prompt):
    """Send a save plan with a prompt, as an attacker holding a copy would; its verdict."""
    params = SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": plan.to_params()})
    (out,) = engine.llm.generate([TokensPrompt(prompt_token_ids=list(prompt))], [params],
                                 use_tqdm=False)
    return (out.kv_transfer_params or {}).get(RESULT_KEY, {}).get("status")


def other_prefix(engine, plan, prompt):
    prefix = list(engine.prompts.encode("Bob hates everything. " * 100))[:plan.spans[0].start]
    return prefix + list(prompt[plan.spans[0].start:])


def answers(engine, user_id, fact_id):
    handle = MemoryHandle(user_id, (fact_id,))
    kv = engine.generate(handle, "What do you know?", greedy(6), mode="kv")
    text = engine.generate(handle, "What do you know?", greedy(6), mode="text")
    assert kv.plan_status == "inject"
    return kv, text


def refused(engine):
    return sum(w.get("captures_refused_stale", 0) for w in engine.stats().workers)


def test_replay_of_a_live_fact_is_refused_and_changes_nothing(engine, monkeypatch):
    fact_id, (plan, prompt) = add_recording(engine, monkeypatch, "carol", CAROL)
    kv, text = answers(engine, "carol", fact_id)
    assert max_abs_diff(kv.logprobs, text.logprobs) == 0.0  # same positions: exact
    before = refused(engine)
    assert replay(engine, plan, other_prefix(engine, plan, prompt)) == "rejected"
    assert replay(engine, plan, prompt) == "save"  # authentic, but single use:
    assert refused(engine) == before + 1           # the worker refuses the second capture
    again, _ = answers(engine, "carol", fact_id)
    assert again.token_ids == kv.token_ids and max_abs_diff(again.logprobs, kv.logprobs) == 0.0
    engine.delete("carol", [fact_id])


def test_replay_after_page_reuse_leaves_the_new_owner_exact(engine, monkeypatch):
    carol, (plan, prompt) = add_recording(engine, monkeypatch, "carol", CAROL)
    engine.delete("carol", [carol])
    assert replay(engine, plan, prompt) == "save"  # after delete, before reuse: refused too
    key = plan.spans[0].slab_key
    assert engine.llm.collective_rpc("inferscale_resident", args=([key],)) == [[False]]
    dave = engine.add_facts("dave", [DAVE])[0]
    assert engine._facts[dave].pages == plan.spans[0].pages  # dave's KV sits in carol's old pages
    kv, text = answers(engine, "dave", dave)
    assert max_abs_diff(kv.logprobs, text.logprobs) == 0.0
    before = refused(engine)
    assert replay(engine, plan, prompt) == "save"
    assert replay(engine, plan, other_prefix(engine, plan, prompt)) == "rejected"
    assert refused(engine) == before + 1
    after, _ = answers(engine, "dave", dave)
    assert after.token_ids == kv.token_ids
    assert max_abs_diff(after.logprobs, text.logprobs) == 0.0  # was 0.86 before the fix
    engine.delete("dave", [dave])


def test_cache_salt_is_keyed_by_the_process_secret(engine):
    (fact_id,) = engine.add_facts("erin", [CAROL])
    _, plan = engine.prepare_request(MemoryHandle("erin", (fact_id,)), "hi")
    keys = list(plan.slab_keys)
    assert plan.cache_salt == cache_salt(engine._secret, "erin", keys)
    assert plan.cache_salt != cache_salt(b"another secret!!", "erin", keys)
    import hashlib  # the old, derivable salt
    assert plan.cache_salt != hashlib.sha256(f"erin|{keys}".encode()).hexdigest()[:32]
    engine.delete("erin", [fact_id])


def test_each_process_draws_its_own_secret():
    env = {k: v for k, v in os.environ.items() if k != "INFERSCALE_PLAN_SECRET"}
    code = ("from inferscale_engine.config import plan_secret; "
            "from inferscale_engine.protocol.plan import cache_salt; "
            "print(cache_salt(plan_secret(), 'erin', [1, 2]))")
    salts = {subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, check=True).stdout.strip() for _ in range(2)}
    assert len(salts) == 2 and all(len(s) == 32 for s in salts)
