"""peers.py's numbers, recomputed from its JSONL records (a metric change never needs a model).

Quality is scored on the questions every arm answered; an answer that failed (HTTP error,
timeout, failed retrieval) scores 0 and is counted in `failures`, never dropped. Per arm:
  f1, em, gold_recall      the data source's metrics (LoCoMo: locomo_metrics.py), x1
  evidence_recall          fraction of a question's gold evidence turns cited by the recalled
                           memories (questions with evidence; mem0-infer: a memory cites the
                           turns of the add call that made it, so its recall is generous)
  delta_*_vs_REF           paired-bootstrap mean difference and 95% interval (locomo_report)
  ttft / answer            ms per question as the asker sees it: the arm's retrieval, then the
                           first token / the whole answer (kv: retrieval is inside the server)
  prefilled                prompt tokens minus those served from cache (prefix or injected KV)
Per store (an arm's memory; inferscale-kv and -text share one): add calls, ms per input item
(call time / items: facts, or turns for mem0-infer) p50/p99, items per second, failures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from benchmarks.common import summarize as percentiles
from benchmarks.locomo_report import paired_bootstrap


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def _ms(values: Sequence[float | None]) -> dict[str, float] | None:
    kept = [1e3 * v for v in values if v is not None]
    return {k: v for k, v in percentiles(kept).items() if k in ("median_ms", "p99_ms", "n",
                                                                "mean_ms")} if kept else None


def prefilled(answer: Mapping[str, Any]) -> int | None:
    """Prompt tokens the model computed: prompt - cached (vLLM counts injected KV as cached)."""
    if answer.get("num_prompt_tokens") is None:
        return None
    return int(answer["num_prompt_tokens"]) - int(answer.get("num_cached_tokens") or 0)


def add_stats(calls: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Add latency and failures of one store's add calls."""
    timed = [c for c in calls if c["num_inputs"]]
    seconds = sum(c["seconds"] for c in timed)
    inputs = sum(c["num_inputs"] for c in timed)
    llm = [x for c in calls for x in c.get("llm_calls", [])]
    return {
        "num_calls": len(calls), "num_inputs": inputs,
        "num_stored": sum(c.get("num_stored", 0) for c in calls),
        "events": _sum_counts([c.get("events", {}) for c in calls]),
        "seconds": seconds, "inputs_per_s": inputs / seconds if seconds else None,
        "ms_per_input": _ms([c["seconds"] / c["num_inputs"] for c in timed]),
        "ms_per_call": _ms([c["seconds"] for c in timed]),
        "num_failed_calls": sum(1 for c in calls if c.get("error")),
        # ERROR lines of calls that returned normally (mem0 answers an extraction it cannot
        # parse with an empty result); a failed call's own ERROR line is not counted twice
        "num_silent_errors": sum(1 for c in calls if not c.get("error")
                                 for line in c.get("logged", [])
                                 if line.startswith(("ERROR", "CRITICAL"))),
        "num_llm_calls": len(llm), "num_llm_failures": sum(1 for x in llm if not x.get("ok")),
        "llm_ms": _ms([x.get("seconds") for x in llm]),
        "errors": sorted({str(c["error"])[:160] for c in calls if c.get("error")})[:5]}


def _sum_counts(counts: Sequence[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for count in counts:
        for key, value in count.items():
            out[key] = out.get(key, 0) + value
    return out


def summarize(questions: Sequence[Mapping[str, Any]],
              answers: Mapping[tuple[str, int], Mapping[str, Mapping[str, Any]]],
              arms: Sequence[str], stores: Mapping[str, str],
              calls: Mapping[str, Sequence[Mapping[str, Any]]],
              score: Callable[[str, Mapping[str, Any]], dict[str, float]],
              metrics: Sequence[str], *, reference: str, seed: int, resamples: int
              ) -> dict[str, Any]:
    """Per arm: quality, intervals against `reference`, latency, tokens, failures, add stats.

    `metrics` are score()'s keys, the headline first: its deltas and per-category means are
    reported (LoCoMo: f1).
    """
    headline = metrics[0]
    complete = [q for q in questions
                if all(a in answers.get((q["episode"], q["index"]), {}) for a in arms)]
    rows: dict[str, dict[str, Any]] = {}
    scored: dict[str, list[dict[str, float]]] = {}
    for arm in arms:
        mine = [answers[(q["episode"], q["index"])][arm] for q in complete]
        scored[arm] = [{**score(a["answer"] if not a.get("error") else "", q),
                        "evidence_recall": a.get("evidence_recall")}
                       for a, q in zip(mine, complete, strict=True)]
        by_category: dict[str, list[float]] = {}
        for q, s in zip(complete, scored[arm], strict=True):
            by_category.setdefault(str(q["category"]), []).append(s[headline])
        rows[arm] = {
            "n": len(mine), "store": stores[arm],
            **{m: _mean([s.get(m) for s in scored[arm]]) for m in (*metrics, "evidence_recall")},
            "by_category": {c: _mean(v) for c, v in sorted(by_category.items())},
            "num_failures": sum(1 for a in mine if a.get("error")),
            "failures": sorted({str(a["error"])[:160] for a in mine if a.get("error")})[:5],
            "num_memories": _mean([a.get("num_memories") for a in mine]),
            "ttft": _ms([a.get("question_ttft_s") for a in mine]),
            "answer": _ms([a.get("question_total_s") for a in mine]),
            "model_ttft": _ms([a.get("ttft_s") for a in mine]),
            "retrieve": _ms([a.get("retrieve_s") for a in mine]),
            "prompt_tokens": _mean([a.get("num_prompt_tokens") for a in mine]),
            "prefilled_tokens": _mean([prefilled(a) for a in mine]),
            "add": add_stats(calls.get(stores[arm], []))}
    for arm in arms:
        if arm == reference or reference not in scored:
            continue
        for metric in (headline, "evidence_recall"):
            pairs = [(s[metric], r[metric]) for s, r in zip(scored[arm], scored[reference],
                                                            strict=True)
                     if s[metric] is not None and r[metric] is not None]
            rows[arm][f"delta_{metric}_vs_{reference}"] = paired_bootstrap(
                [p[0] for p in pairs], [p[1] for p in pairs], resamples=resamples, seed=seed)
    return {"arms": rows, "reference": reference, "headline": headline,
            "num_questions": len(complete),
            "num_incomplete": len(questions) - len(complete)}


def markdown(result: Mapping[str, Any]) -> str:
    """The side-by-side table, then F1 by category and add details."""
    rows, ref, metric = result["arms"], result["reference"], result["headline"]
    lines = [f"n = {result['num_questions']} questions answered by every arm; intervals: "
             f"paired bootstrap 95%, against {ref}", "",
             f"| arm | {metric} | Δ{metric} vs ref | evidence recall@k | Δrecall vs ref | "
             "TTFT p50 / p99 ms | answer p50 / p99 ms | prefilled tok/q | "
             "add ms/item p50 / p99 | items/s | failures (answer / add) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, row in rows.items():
        add = row["add"]
        lines.append(
            f"| {arm} | {_pct(row[metric])} | {_delta(row.get(f'delta_{metric}_vs_{ref}'))} | "
            f"{_pct(row['evidence_recall'])} | "
            f"{_delta(row.get(f'delta_evidence_recall_vs_{ref}'))} | {_pair(row['ttft'])} | "
            f"{_pair(row['answer'])} | {_num(row['prefilled_tokens'], 0)} | "
            f"{_pair(add['ms_per_input'])} | {_num(add['inputs_per_s'], 1)} | "
            f"{row['num_failures']} / {add['num_failed_calls'] + add['num_silent_errors']} |")
    categories = sorted({c for row in rows.values() for c in row["by_category"]})
    lines += ["", "| arm | " + " | ".join(f"{metric} cat {c}" for c in categories) + " |",
              "|---|" + "---|" * len(categories)]
    for arm, row in rows.items():
        lines.append(f"| {arm} | " + " | ".join(_pct(row["by_category"].get(c))
                                                 for c in categories) + " |")
    lines += ["", "| store | add calls | items | memories stored | events | LLM calls "
              "(failed) | LLM ms p50 |", "|---|---|---|---|---|---|---|"]
    seen = set()
    for row in rows.values():
        if row["store"] in seen:
            continue
        seen.add(row["store"])
        add = row["add"]
        llm = add["llm_ms"]["median_ms"] if add["llm_ms"] else None
        lines.append(f"| {row['store']} | {add['num_calls']} | {add['num_inputs']} | "
                     f"{add['num_stored']} | {add['events']} | {add['num_llm_calls']} "
                     f"({add['num_llm_failures']}) | {_num(llm, 0)} |")
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pair(stats: Mapping[str, float] | None) -> str:
    return "-" if not stats else f"{stats['median_ms']:.0f} / {stats['p99_ms']:.0f}"


def _delta(found: Mapping[str, float] | None) -> str:
    if not found:
        return "-"
    return f"{100 * found['mean']:+.1f} [{100 * found['lo']:+.1f}, {100 * found['hi']:+.1f}]"
