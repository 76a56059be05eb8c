"""LoCoMo results as numbers and tables: per category and overall, per arm, with paired intervals.

Everything is recomputed from the per-question records (the answers as the model wrote them),
so a change of metric never needs a model run. Per category ('1'..'4') and 'overall':
  f1, em, gold_recall   LoCoMo F1 and EM, gold-token recall (locomo_metrics.py), x1
  words                 mean answer length in words (whitespace-separated)
  kl                    kv arms: first-token KL(reference text arm || arm) from top-N logprobs
  delta_f1_A_vs_R       F1(A) - F1(R) with a paired-bootstrap 95% interval: questions
                        resampled with replacement, the same resamples for every arm
The references of an arm are the text arm of its layout and the best text arm (highest overall
F1); only questions answered by every arm are scored, so all comparisons are paired.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from benchmarks.locomo_arms import Arm, reference_text_arm
from benchmarks.locomo_metrics import (
    answer_words,
    exact_match,
    gold_token_recall,
    locomo_f1,
    top_n_mass,
)
from inferscale_engine.model.calibration import first_token_kl

BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
_METRICS = ("f1", "em", "gold_recall", "words", "top_n_mass")


def paired_bootstrap(values: Sequence[float], baseline: Sequence[float], *,
                     resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0,
                     confidence: float = CONFIDENCE) -> dict[str, float | int] | None:
    """Mean of values - baseline (paired by position) and its percentile bootstrap interval.

    Resamples the pairs with replacement `resamples` times (seeded: the same seed and length
    give the same resamples). None for no pairs.
    """
    diffs = np.asarray(values, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    n = len(diffs)
    if n == 0:
        return None
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    chunk = max(1, 2**22 // n)  # rows of the [chunk, n] index matrix: ~32 MB at most
    for lo in range(0, resamples, chunk):
        rows = min(chunk, resamples - lo)
        means[lo:lo + rows] = diffs[rng.integers(0, n, size=(rows, n))].mean(axis=1)
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return {"mean": float(diffs.mean()), "lo": float(low), "hi": float(high), "n": n}


def score_answer(answer: Mapping[str, Any], question: Mapping[str, Any]) -> dict[str, Any]:
    """Metrics of one arm's answer to one question (record fields of locomo_runner.py)."""
    text, gold, category = answer["answer"], question["gold"], question["category"]
    return {"f1": locomo_f1(text, gold, category), "em": exact_match(text, gold, category),
            "gold_recall": gold_token_recall(text, gold, category), "words": answer_words(text),
            "top_n_mass": top_n_mass(_logprobs(answer)), "logprobs": _logprobs(answer),
            "first_token": answer.get("first_token"), "answer": text}


def _logprobs(answer: Mapping[str, Any]) -> dict[int, float]:
    return {int(t): float(lp) for t, lp in answer.get("first_token_logprobs") or []}


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def best_text_arm(scores: Mapping[str, list[dict]], arms: Sequence[Arm]) -> str | None:
    """The text arm with the highest mean F1 (the first in run order on ties)."""
    texts = [a.name for a in arms if a.kind == "text" and scores[a.name]]
    return max(texts, key=lambda name: _mean([s["f1"] for s in scores[name]]) or 0.0,
               default=None)


def comparisons(arms: Sequence[Arm], best_text: str | None) -> dict[str, dict[str, str | None]]:
    """Per arm: its KL reference and the text arms its F1 is compared with."""
    out = {}
    for arm in arms:
        twin = reference_text_arm(arm, arms)
        layout_text = twin.name if twin is not None and arm.kind == "kv" else None
        refs = [r for r in dict.fromkeys([layout_text, best_text]) if r and r != arm.name]
        out[arm.name] = {"layout_text": layout_text, "best_text": best_text,
                         "kl_reference": (layout_text or best_text) if arm.kind == "kv" else None,
                         "f1_references": refs}
    return out


def summarize(questions: Sequence[Mapping[str, Any]],
              answers: Mapping[tuple[str, int], Mapping[str, Mapping[str, Any]]],
              arms: Sequence[Arm], *, seed: int = 0,
              resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, Any]:
    """Summary of the questions every arm answered.

    Args:
        questions: question records (conversation, index, category, gold, recall).
        answers: (conversation, index) -> arm name -> answer record.

    Returns:
        {"summary": {group: row}, "best_text_mode", "comparisons", "num_incomplete"}.
    """
    names = [a.name for a in arms]
    complete = [q for q in questions
                if all(n in answers.get((q["conversation"], q["index"]), {}) for n in names)]
    scored = [(q, {n: score_answer(answers[(q["conversation"], q["index"])][n], q)
                   for n in names}) for q in complete]
    best = best_text_arm({n: [s[n] for _, s in scored] for n in names}, arms)
    plan = comparisons(arms, best)
    groups: dict[str, list] = {}
    for item in scored:
        groups.setdefault(str(item[0]["category"]), []).append(item)
    groups = dict(sorted(groups.items()))
    groups["overall"] = scored
    summary = {name: _row(group, arms, plan, seed, resamples) for name, group in groups.items()}
    return {"summary": summary, "best_text_mode": best, "comparisons": plan,
            "num_incomplete": len(questions) - len(complete)}


def _row(group: list, arms: Sequence[Arm], plan: Mapping[str, Mapping[str, Any]], seed: int,
         resamples: int) -> dict[str, Any]:
    row: dict[str, Any] = {"n": len(group), "recall": _mean([q["recall"] for q, _ in group]),
                           "n_with_evidence": sum(q["recall"] is not None for q, _ in group)}
    for arm in arms:
        mine = [s[arm.name] for _, s in group]
        for metric in _METRICS:
            row[f"{metric}_{arm.name}"] = _mean([float(m[metric]) for m in mine])
        reference = plan[arm.name]["kl_reference"]
        if reference:
            theirs = [s[reference] for _, s in group]
            row[f"kl_{arm.name}"] = _mean([first_token_kl(t["logprobs"], m["logprobs"])
                                           for t, m in zip(theirs, mine) if t["logprobs"]
                                           and m["logprobs"]])
            row[f"same_first_token_{arm.name}"] = _mean(
                [float(t["first_token"] == m["first_token"]) for t, m in zip(theirs, mine)])
            row[f"same_answer_{arm.name}"] = _mean(
                [float(t["answer"] == m["answer"]) for t, m in zip(theirs, mine)])
        for ref in plan[arm.name]["f1_references"]:
            row[f"delta_f1_{arm.name}_vs_{ref}"] = paired_bootstrap(
                [m["f1"] for m in mine], [s[ref]["f1"] for _, s in group],
                resamples=resamples, seed=seed)
    return row


def timing(answers: Sequence[Mapping[str, Any]], ingests: Sequence[Mapping[str, Any]]
           ) -> dict[str, Any]:
    """Seconds per question by arm (answers computed in this file's runs, batched; cache hits
    excluded) and seconds per fact encoded, by W."""
    out: dict[str, Any] = {}
    for name in dict.fromkeys(a["arm"] for a in answers):
        fresh = [a["seconds"] for a in answers if a["arm"] == name
                 and not a.get("from_cache") and a.get("seconds") is not None]
        out[f"s_per_question_{name}"] = _mean(fresh)
        out[f"n_timed_{name}"] = len(fresh)
    for window in sorted({i["window"] for i in ingests}):
        rows = [i for i in ingests if i["window"] == window]
        out[f"ingest_s_per_fact_w{window}"] = (sum(i["seconds"] for i in rows)
                                               / max(1, sum(i["num_facts"] for i in rows)))
    return out


def markdown(result: Mapping[str, Any], arms: Sequence[Arm]) -> str:
    """Tables: one per metric, rows = arms, columns = categories and overall."""
    summary = result["summary"]
    groups = list(summary)
    head = "| arm | " + " | ".join(f"cat {g}" if g != "overall" else "**overall**"
                                   for g in groups) + " |"
    rule = "|---|" + "---|" * len(groups)
    counts = ", ".join(f"{g}={summary[g]['n']}" for g in groups)
    recall = _pct(summary["overall"]["recall"]) if summary else "-"
    lines = [f"n: {counts}; evidence recall of the retrieved facts: {recall}%; best text arm: "
             f"{result['best_text_mode']}"]

    def table(title: str, cell: Any) -> None:
        lines.extend(["", f"**{title}**", "", head, rule])
        for arm in arms:
            lines.append(f"| {arm.name} | " + " | ".join(cell(arm, summary[g]) for g in groups)
                         + " |")

    for metric, title in (("f1", "F1 (x100)"), ("em", "EM (x100)"),
                          ("gold_recall", "gold-token recall (x100)")):
        table(title, lambda arm, row, m=metric: _pct(row.get(f"{m}_{arm.name}")))
    table("answer length (words)", lambda arm, row: _num(row.get(f"words_{arm.name}"), 1))
    table("first-token KL(reference text || arm)",
          lambda arm, row: _num(row.get(f"kl_{arm.name}"), 4))
    plan = result["comparisons"]
    table("F1(arm) - F1(text arm of its layout), x100, paired-bootstrap 95% CI",
          lambda arm, row: _delta(row, arm.name, plan[arm.name]["layout_text"]))
    table(f"F1(arm) - F1(best text arm: {result['best_text_mode']}), x100, 95% CI",
          lambda arm, row: _delta(row, arm.name, plan[arm.name]["best_text"]))
    return "\n".join(lines)


def _delta(row: Mapping[str, Any], arm: str, reference: str | None) -> str:
    found = row.get(f"delta_f1_{arm}_vs_{reference}") if reference and reference != arm else None
    if not found:
        return "-"
    return f"{100 * found['mean']:+.1f} [{100 * found['lo']:+.1f}, {100 * found['hi']:+.1f}]"


def _pct(value: object) -> str:
    return "-" if value is None else f"{100 * float(value):.1f}"


def _num(value: object, digits: int) -> str:
    return "-" if value is None else f"{float(value):.{digits}f}"
