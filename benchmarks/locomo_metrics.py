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


def top_n_mass(logprobs: Mapping[int, float]) -> float:
    """Probability mass the top-N log-probs cover."""
    return sum(math.exp(lp) for lp in logprobs.values())
