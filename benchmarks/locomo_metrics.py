"""LoCoMo answer metrics: token F1, exact match, gold-token recall, answer length, first-token KL.

F1 and EM follow snap-research/locomo task_eval/evaluation.py: normalize = lowercase, drop
commas and punctuation, drop the words a/an/the/and, collapse spaces; F1 = token F1 over
Porter-stemmed tokens. Category 1 (multi-hop) splits the gold answer and the prediction on
commas and averages, over gold parts, the best F1 of any predicted part. Category 3 keeps the
gold answer up to its first ';'. EM is LoCoMo's: the normalized (unstemmed) token sets are equal.
Gold-token recall (ours): the fraction of the gold answer's normalized, stemmed tokens found in
the prediction (multiset), which long answers cannot lose the way they lose F1.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Mapping

from nltk.stem import PorterStemmer

_STEMMER = PorterStemmer()
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """LoCoMo's normalization."""
    text = text.replace(",", "").lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the|and)\b", " ", text)
    return " ".join(text.split())


def _stemmed_tokens(text: str) -> list[str]:
    return [_STEMMER.stem(w) for w in normalize_answer(text).split()]


def token_f1(prediction: str, gold: str) -> float:
    """Token F1 of Porter-stemmed normalized tokens."""
    pred, truth = _stemmed_tokens(prediction), _stemmed_tokens(gold)
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


def gold_token_recall(prediction: str, answer: str, category: int) -> float:
    """Fraction of the gold answer's normalized, stemmed tokens present in the prediction.

    Tokens count with multiplicity (gold 'New New York' needs 'new' twice). Category 3 scores
    the gold answer up to its first ';', as F1 does; 0.0 when the gold has no tokens.
    """
    gold = _stemmed_tokens(gold_answer(answer, category))
    if not gold:
        return 0.0
    found = Counter(gold) & Counter(_stemmed_tokens(prediction))
    return sum(found.values()) / len(gold)


def answer_words(prediction: str) -> int:
    """Length of an answer in words (whitespace-separated, as the model wrote it)."""
    return len(prediction.split())


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
