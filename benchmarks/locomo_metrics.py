"""LoCoMo answer metrics (token F1, exact match), first-token KL from top-N log-probs, tables.

F1 and EM follow snap-research/locomo task_eval/evaluation.py: normalize = lowercase, drop
commas and punctuation, drop the words a/an/the/and, collapse spaces; F1 = token F1 over
Porter-stemmed tokens. Category 1 (multi-hop) splits the gold answer and the prediction on
commas and averages, over gold parts, the best F1 of any predicted part. Category 3 keeps the
gold answer up to its first ';'. EM is LoCoMo's: the normalized (unstemmed) token sets are equal.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping

from nltk.stem import PorterStemmer

_STEMMER = PorterStemmer()
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """LoCoMo's normalization."""
    text = text.replace(",", "").lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the|and)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: str, gold: str) -> float:
    """Token F1 of Porter-stemmed normalized tokens."""
    pred = [_STEMMER.stem(w) for w in normalize_answer(prediction).split()]
    truth = [_STEMMER.stem(w) for w in normalize_answer(gold).split()]
    num_same = sum((Counter(pred) & Counter(truth)).values())
    if num_same == 0:
        return 0.0
    precision, recall = num_same / len(pred), num_same / len(truth)
    return 2 * precision * recall / (precision + recall)


def gold_answer(answer: str, category: int) -> str:
    """The gold string LoCoMo scores against (category 3: up to the first ';')."""
    return answer.split(";")[0].strip() if category == 3 else answer


def locomo_f1(prediction: str, answer: str, category: int) -> float:
    """LoCoMo's per-category F1."""
    gold = gold_answer(answer, category)
    if category == 1:
        predictions = [p.strip() for p in prediction.split(",")]
        return sum(max(token_f1(p, g.strip()) for p in predictions)
                   for g in gold.split(",")) / len(gold.split(","))
    return token_f1(prediction, gold)


def exact_match(prediction: str, answer: str, category: int) -> float:
    """LoCoMo's EM: equal sets of normalized tokens."""
    gold = gold_answer(answer, category)
    return float(set(normalize_answer(prediction).split()) == set(normalize_answer(gold).split()))


def first_token_kl(reference: Mapping[int, float], other: Mapping[int, float]) -> float:
    """KL(reference || other) of two next-token distributions known only by their top-N.

    The distributions are coarse-grained onto the union U of both top-N token sets plus one
    bucket for every other token. A token of U missing from one side's top-N gets, on that
    side, the smaller of that side's N-th probability (its upper bound) and an even share of
    the side's leftover mass; the bucket holds what is left, so each side sums to 1. With
    N = vocabulary size this is the exact KL. Otherwise it is an estimate whose error is bounded by
    the mass outside the top-N (reported per answer as top_n_mass; ~0.9+ at N=100 here).
    """
    union = set(reference) | set(other)
    p = _coarse_grained(reference, union)
    q = _coarse_grained(other, union)
    total = 0.0
    for token, p_token in p.items():
        if p_token > 0.0:
            total += p_token * (math.log(p_token) - math.log(max(q[token], 1e-30)))
    return max(total, 0.0)


def _coarse_grained(logprobs: Mapping[int, float], union: set[int]) -> dict[object, float]:
    probs = {int(t): math.exp(lp) for t, lp in logprobs.items()}
    leftover = max(0.0, 1.0 - sum(probs.values()))
    missing = [t for t in union if t not in probs]
    if missing:
        fill = min(min(probs.values()), leftover / (len(missing) + 1))
        for token in missing:
            probs[token] = fill
        leftover -= fill * len(missing)
    probs["rest"] = max(leftover, 0.0)
    return probs


def top_n_mass(logprobs: Mapping[int, float]) -> float:
    """Probability mass the top-N log-probs cover."""
    return sum(math.exp(lp) for lp in logprobs.values())


def _mean(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def summarize_records(records: list[dict], kv_modes: list[str]) -> dict[str, dict]:
    """Per category ('1'..'4') and 'overall' (question-weighted): n, F1/EM per mode, KL, recall."""
    groups: dict[str, list[dict]] = {}
    for record in records:
        groups.setdefault(str(record["category"]), []).append(record)
    groups = dict(sorted(groups.items()))
    groups["overall"] = records
    out = {}
    for name, group in groups.items():
        row: dict[str, object] = {"n": len(group)}
        for mode in ["text", *kv_modes]:
            row[f"f1_{mode}"] = _mean(r["modes"][mode]["f1"] for r in group)
            row[f"em_{mode}"] = _mean(r["modes"][mode]["em"] for r in group)
            row[f"top_n_mass_{mode}"] = _mean(r["modes"][mode]["top_n_mass"] for r in group)
        for mode in kv_modes:
            row[f"kl_{mode}"] = _mean(r["modes"][mode]["kl_vs_text"] for r in group)
            row[f"same_first_token_{mode}"] = _mean(
                float(r["modes"][mode]["first_token"] == r["modes"]["text"]["first_token"])
                for r in group)
            row[f"same_answer_{mode}"] = _mean(
                float(r["modes"][mode]["answer"] == r["modes"]["text"]["answer"]) for r in group)
        row["recall"] = _mean(r["recall"] for r in group)
        row["n_with_evidence"] = sum(r["recall"] is not None for r in group)
        out[name] = row
    return out


def markdown_table(summary: dict[str, dict], kv_modes: list[str],
                   labels: Mapping[str, str]) -> str:
    """Per category: n, F1 and EM per mode (x100), KL per kv mode vs text, evidence recall."""
    modes = ["text", *kv_modes]
    head = (["cat", "n"] + [f"F1 {labels.get(m, m)}" for m in modes]
            + [f"EM {labels.get(m, m)}" for m in modes]
            + [f"KL {labels.get(m, m)}/text" for m in kv_modes] + ["recall"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in summary.items():
        cells = [name, str(row["n"])]
        cells += [_pct(row[f"f1_{m}"]) for m in modes] + [_pct(row[f"em_{m}"]) for m in modes]
        cells += [_num(row[f"kl_{m}"]) for m in kv_modes] + [_pct(row["recall"])]
        if name == "overall":
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _pct(value: object) -> str:
    return "-" if value is None else f"{100 * float(value):.1f}"


def _num(value: object) -> str:
    return "-" if value is None else f"{float(value):.4f}"
