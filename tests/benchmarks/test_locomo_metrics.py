"""LoCoMo scoring and data loading (no model): the numbers of benchmarks/locomo.py rest on these."""

from __future__ import annotations

import math

import pytest

from benchmarks.locomo_data import DEFAULT_DATA, load_conversations
from benchmarks.locomo_metrics import (
    answer_words,
    exact_match,
    gold_token_recall,
    locomo_f1,
    normalize_answer,
)
from inferscale_engine.model.calibration import first_token_kl


def test_normalization_and_f1_follow_locomo():
    assert normalize_answer("The Adoption, agencies!") == "adoption agencies"
    assert locomo_f1("adoption agencies", "Adoption agencies", 4) == 1.0
    assert locomo_f1("agencies", "Adoption agencies", 4) == pytest.approx(2 / 3)
    assert locomo_f1("running", "runs", 4) == 1.0  # Porter stems
    assert locomo_f1("nothing alike", "Adoption agencies", 4) == 0.0
    # category 1: gold parts split on commas, each scored by its best predicted part
    assert locomo_f1("chess, yoga", "yoga, chess, painting", 1) == pytest.approx(2 / 3)
    # category 3: only the gold answer before ';' counts
    assert locomo_f1("likely yes", "Likely yes; she said so", 3) == 1.0
    assert exact_match("the Paris", "Paris", 4) == 1.0
    assert exact_match("Paris France", "Paris", 4) == 0.0


def test_first_token_kl_is_exact_on_full_distributions_and_zero_on_equal_ones():
    p = {0: math.log(0.5), 1: math.log(0.3), 2: math.log(0.2)}
    q = {0: math.log(0.2), 1: math.log(0.3), 2: math.log(0.5)}
    exact = sum(math.exp(p[t]) * (p[t] - q[t]) for t in p)
    assert first_token_kl(p, q) == pytest.approx(exact, rel=1e-9)
    assert first_token_kl(p, p) == 0.0
    # top-N with little mass outside it (a long flat tail): close to the exact KL
    vocab = range(400)
    tail = 0.02 / 397
    p_full = {0: 0.6, 1: 0.3, 2: 0.08, **{t: tail for t in vocab if t > 2}}
    q_full = {0: 0.4, 1: 0.45, 2: 0.13, **{t: tail for t in vocab if t > 2}}
    exact = sum(p_full[t] * math.log(p_full[t] / q_full[t]) for t in vocab)
    top = {t: math.log(v) for t, v in p_full.items() if t < 100}
    other = {t: math.log(v) for t, v in q_full.items() if t < 100}
    assert first_token_kl(top, other) == pytest.approx(exact, rel=0.05)


def test_gold_token_recall_ignores_extra_words():
    long = "She researched adoption agencies for months"
    assert gold_token_recall(long, "Adoption agencies", 4) == 1.0
    assert locomo_f1(long, "Adoption agencies", 4) < 0.6
    assert gold_token_recall("agencies", "Adoption agencies", 4) == 0.5
    assert gold_token_recall("researching", "researched", 4) == 1.0  # stemmed
    assert gold_token_recall("new york", "New New York", 4) == pytest.approx(2 / 3)  # multiset
    assert gold_token_recall("new new york", "New New York", 4) == 1.0
    assert gold_token_recall("likely yes", "Likely yes; because she said so", 3) == 1.0
    assert gold_token_recall("nothing", "Adoption agencies", 1) == 0.0
    assert gold_token_recall("anything", "the", 4) == 0.0  # no gold tokens
    assert answer_words("  7 May  2023 ") == 3


@pytest.mark.skipif(not DEFAULT_DATA.exists(), reason="LoCoMo data not on this machine")
def test_locomo_data_loads_facts_contexts_and_questions():
    conversations = load_conversations(DEFAULT_DATA, "observation", "memory")
    assert len(conversations) == 10
    conv = conversations[0]
    assert conv.facts and len(conv.contexts) == len(conv.facts)
    assert conv.contexts[0] in (None, "")  # nothing precedes the first fact
    assert all(f.source_ids for f in conv.facts)
    counts = {c: sum(q.category == c for q in conv.questions) for c in (1, 2, 3, 4)}
    assert all(counts.values()), counts
    turns = load_conversations(DEFAULT_DATA, "turns", "dialogue")[0]
    assert len(turns.facts) > len(conv.facts)
