"""Paired bootstrap and the per-arm summary of benchmarks/locomo_report.py."""

from __future__ import annotations

import math
import random

import pytest

from benchmarks.locomo_arms import parse_arms
from benchmarks.locomo_report import markdown, paired_bootstrap, summarize


def test_bootstrap_of_a_constant_difference_is_that_difference():
    got = paired_bootstrap([0.7, 0.2, 0.9, 0.4], [0.5, 0.0, 0.7, 0.2], resamples=500)
    assert got["mean"] == pytest.approx(0.2)
    assert got["lo"] == pytest.approx(0.2) and got["hi"] == pytest.approx(0.2)
    assert got["n"] == 4
    assert paired_bootstrap([], []) is None


def test_bootstrap_matches_the_binomial_interval():
    # 120 of 400 differences are 1, the rest 0: the resampled mean is Binomial(400, 0.3) / 400,
    # whose 2.5% / 97.5% quantiles are 0.3 -/+ 1.96 * sqrt(0.3 * 0.7 / 400) = 0.255 / 0.345
    diffs = [1.0] * 120 + [0.0] * 280
    got = paired_bootstrap(diffs, [0.0] * 400, resamples=4000, seed=3)
    half = 1.96 * math.sqrt(0.3 * 0.7 / 400)
    assert got["mean"] == pytest.approx(0.3)
    assert got["lo"] == pytest.approx(0.3 - half, abs=0.008)
    assert got["hi"] == pytest.approx(0.3 + half, abs=0.008)
    assert paired_bootstrap(diffs, [0.0] * 400, seed=3) == paired_bootstrap(
        diffs, [0.0] * 400, seed=3)
    assert paired_bootstrap(diffs, [0.0] * 400, seed=3) != paired_bootstrap(
        diffs, [0.0] * 400, seed=4)


def test_bootstrap_is_paired():
    # per-question scores vary wildly, but the arm is always 0.02 above its baseline: a paired
    # interval is tight around 0.02 (an unpaired one would span about +-0.08)
    rng = random.Random(0)
    baseline = [rng.random() for _ in range(300)]
    arm = [b + 0.02 + rng.uniform(-0.005, 0.005) for b in baseline]
    got = paired_bootstrap(arm, baseline, seed=0)
    assert 0.015 < got["lo"] < got["mean"] < got["hi"] < 0.025


def answer(text, logprobs=((1, -0.1), (2, -2.5))):
    return {"answer": text, "first_token_logprobs": [list(p) for p in logprobs],
            "first_token": logprobs[0][0], "from_cache": False, "seconds": 1.0}


def test_summary_per_category_best_text_and_paired_deltas():
    arms = parse_arms("kv-w64,text,text-user4")
    questions, answers = [], {}
    golds = {1: "Adoption agencies", 2: "7 May 2023", 4: "Pepper"}
    for i in range(30):
        category = (1, 2, 4)[i % 3]
        questions.append({"conversation": "conv-26", "index": i, "category": category,
                          "gold": golds[category], "recall": 1.0 if i % 2 else None})
        answers[("conv-26", i)] = {
            "text": answer(golds[category]),  # always right
            "text-user4": answer(golds[category] if i % 3 else "no idea"),
            "kv-w64": answer("wrong words entirely", ((2, -0.1), (1, -2.5))),
        }
    questions.append({"conversation": "conv-26", "index": 99, "category": 4, "gold": "x",
                      "recall": None})
    answers[("conv-26", 99)] = {"text": answer("x")}  # not answered by every arm: left out
    result = summarize(questions, answers, arms, seed=0, resamples=500)
    assert result["num_incomplete"] == 1
    assert result["best_text_mode"] == "text"
    summary = result["summary"]
    assert list(summary) == ["1", "2", "4", "overall"]
    overall = summary["overall"]
    assert overall["n"] == 30 and overall["n_with_evidence"] == 15
    assert overall["f1_text"] == 1.0 and overall["gold_recall_text"] == 1.0
    assert overall["f1_text-user4"] == pytest.approx(20 / 30)
    assert summary["1"]["f1_text-user4"] == 0.0 and summary["2"]["f1_text-user4"] == 1.0
    assert overall["f1_kv-w64"] == 0.0 and overall["words_kv-w64"] == 3.0
    assert overall["kl_kv-w64"] > 1.0 and overall["same_first_token_kv-w64"] == 0.0
    delta = overall["delta_f1_kv-w64_vs_text"]
    assert delta["mean"] == -1.0 and delta["lo"] == delta["hi"] == -1.0
    assert overall["delta_f1_text-user4_vs_text"]["mean"] == pytest.approx(-1 / 3)
    assert "delta_f1_text_vs_text" not in overall
    assert result["comparisons"]["kv-w64"]["layout_text"] == "text"
    table = markdown(result, arms)
    assert "| kv-w64 | -100.0 [-100.0, -100.0] |" in table and "best text arm: text" in table


def test_kv_arm_of_a_layout_is_compared_with_its_layout_twin_and_the_best_text():
    arms = parse_arms("text,text-user4,kv-w64-user4")
    questions = [{"conversation": "c", "index": i, "category": 4, "gold": "red car", "recall": None}
                 for i in range(4)]
    answers = {("c", i): {"text": answer("red"), "text-user4": answer("red car"),
                          "kv-w64-user4": answer("car")} for i in range(4)}
    result = summarize(questions, answers, arms, resamples=200)
    assert result["best_text_mode"] == "text-user4"
    row = result["summary"]["overall"]
    assert set(k for k in row if k.startswith("delta_f1_kv")) == {
        "delta_f1_kv-w64-user4_vs_text-user4"}
    assert row["delta_f1_text_vs_text-user4"]["mean"] == pytest.approx(2 / 3 - 1)
