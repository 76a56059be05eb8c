"""Runs of facts (contexts.RunContext): facts added together are encoded in ONE save request
per run, and each fact's stored KV equals encoding it alone after the same context tokens;
a run injected where it was encoded reproduces a plain prefill of the same prompt (fp32)."""

from __future__ import annotations

import pytest
import torch

from inferscale_engine.errors import ConfigError, InvalidFactError
from inferscale_engine.facts import MemoryHandle
from inferscale_engine.prompting.contexts import RunContext, run_contexts
from tests.conftest import (
    ARCHS,
    FACTS,
    QUESTIONS,
    engine_config,
    greedy,
    max_abs_diff,
    running_engine,
)

pytestmark = pytest.mark.vllm
TOLERANCE = 1e-5
WINDOW, RUN = 16, 40


@pytest.fixture(scope="module", params=ARCHS)
def engine(request, tiny_models):
    with running_engine(tiny_models[request.param], context_window_tokens=WINDOW,
                        context_run_tokens=RUN) as eng:
        yield eng


def contexts_of(engine, earlier, texts):
    lengths = [len(engine.tokenize_fact(t)) for t in texts]
    return run_contexts(earlier, texts, lengths, run_tokens=RUN, lead_facts=4)


def stored(engine, fact_id):
    (keys, values, _), = engine.workers.read_entry(engine._facts[fact_id].slab_key)
    return keys, values


def test_a_run_is_one_save_request_and_equals_facts_encoded_alone(engine):
    texts = FACTS
    contexts = contexts_of(engine, ["Dave owns a red bicycle.", "Eve sings."], texts)
    runs = sum(1 for c in contexts if not c.facts)
    assert 1 < runs < len(texts)  # FACTS are 9-15 tokens: RUN = 40 holds 2 to 4 of them
    before = engine.stats().counters
    ids = engine.add_facts("runs", texts, contexts)
    after = engine.stats().counters
    assert after["save_requests"] - before.get("save_requests", 0) == runs
    assert after["encoded_facts"] - before.get("encoded_facts", 0) == 5
    alone = [engine.add_facts("alone", [t], [c])[0] for t, c in zip(texts, contexts)]
    assert engine.stats().counters["save_requests"] - after["save_requests"] == 5
    worst = 0.0
    for run_id, alone_id, context in zip(ids, alone, contexts):
        record = engine._facts[run_id]
        assert record.context_ids == engine._facts[alone_id].context_ids
        lead = min(WINDOW, len(engine.prompts.encode(context.lead)))
        assert len(record.context_ids) == lead + sum(
            len(engine.tokenize_fact(t)) for t in context.facts)
        (k1, v1), (k2, v2) = stored(engine, run_id), stored(engine, alone_id)
        worst = max(worst, float((k1 - k2).abs().max()), float((v1 - v2).abs().max()))
    print(f"\n[{engine.config.model}] run vs alone: max |dK|, |dV| = {worst:.3e}")
    assert worst <= TOLERANCE


def test_a_run_injected_where_it_was_encoded_is_a_plain_prefill(engine):
    # No lead: the run's prompt is [preamble][fact 1][fact 2][fact 3], the memory block of a
    # handle of these facts in this order, so every fact sits after what it was encoded after.
    texts = FACTS[:3]
    contexts = contexts_of(engine, [], texts)
    assert contexts[0] == RunContext(None) and len(contexts[2].facts) == 2
    ids = engine.add_facts("exact", texts, contexts)
    handle = MemoryHandle("exact", tuple(ids))
    for question in QUESTIONS:
        kv = engine.generate(handle, question, greedy(8), mode="kv")
        text = engine.generate(handle, question, greedy(8), mode="text")
        assert kv.plan_status == "inject" and kv.token_ids == text.token_ids
        diff = max_abs_diff(kv.logprobs, text.logprobs)
        assert diff <= TOLERANCE, diff


def test_runs_survive_eviction_and_bad_run_contexts_are_refused(engine):
    texts = FACTS[:3]
    ids = engine.add_facts("evict", texts, contexts_of(engine, [], texts))
    first = stored(engine, ids[2])
    engine._writer.free_records([engine._facts[i] for i in ids])  # as LRU eviction does
    engine._writer.make_resident([engine._facts[i] for i in ids], engine.prompts.preamble(),
                                 set(ids))  # re-encoded from the same context tokens
    again = stored(engine, ids[2])
    assert torch.allclose(first[0], again[0], atol=TOLERANCE) and torch.allclose(
        first[1], again[1], atol=TOLERANCE)
    too_long = RunContext(None, tuple(FACTS) * 2)
    count = engine.stats().num_facts
    with pytest.raises(InvalidFactError, match="longer than context_window_tokens"):
        engine.add_facts("evict", ["one more"], [too_long])
    with pytest.raises(InvalidFactError, match="RunContext or None"):
        engine.add_facts("evict", ["one more"], [3])
    assert engine.stats().num_facts == count


def test_run_settings_are_checked():
    for bad in (-1, True, 1.5):
        with pytest.raises(ConfigError, match="context_run_tokens"):
            engine_config("unused", context_run_tokens=bad)
    with pytest.raises(ConfigError, match=r"\(256 \+ 0 \+ 256\) must be below max_model_len"):
        engine_config("unused", max_model_len=512, max_fact_tokens=256, context_run_tokens=256,
                      context_window_tokens=0)
    assert RunContext.from_json(RunContext("x", ("a",)).to_json()) == RunContext("x", ("a",))
    with pytest.raises(InvalidFactError, match="malformed run context"):
        RunContext.from_json({"lead": 1, "facts": []})
