"""Recency (optional, off by default): newer facts get a bonus in what a search chooses.

With Memory(recency_weight=w, recency_half_life_days=h) a present search chooses its k facts by
score * (1 + w * 0.5 ** (age / h)): the cosine (vector mode) or the fused cosine + keyword
score (hybrid mode, hybrid.py), raised by up to a factor 1 + w for the newest fact, a raise
that halves every h days of age. The raise is a factor, so a fact with no relevance (a score
<= 0) gains nothing: recency reorders what is relevant, it does not bring in what is not. A
fact's age is counted back from the newest fact among the search's candidates (the time each
became true: timestamp, else when it was added), not from the clock, so a memory of
conversations that ended long ago is weighed as of its own last day. The candidates are the
RECENCY_CANDIDATES best by the score alone (and hybrid's keyword matches). As in hybrid mode,
the chosen facts are ordered by and reported with their cosine. Reads as of a date rank by
cosine alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from inferscale_engine.errors import ConfigError
from inferscale_engine.facts import FactId

DEFAULT_RECENCY_WEIGHT = 0.0
DEFAULT_HALF_LIFE_DAYS = 30.0
RECENCY_CANDIDATES = 100
"""Facts ranked by relevance alone that recency may reorder (at least k)."""

Bonus = Callable[[Sequence[FactId]], dict[FactId, float]]
"""Fact ids -> the recency bonus of each (relative to the newest of them): a score s is
chosen by as raised(s, bonus)."""


def raised(score: float, bonus: float) -> float:
    """A score with its recency bonus: s * (1 + bonus) when s > 0, else s."""
    return score * (1.0 + bonus) if score > 0 else score


def check_recency(weight: object, half_life_days: object) -> tuple[float, float]:
    """recency_weight (>= 0) and recency_half_life_days (> 0), checked (ConfigError)."""
    for name, value, low in (("recency_weight", weight, 0.0),
                             ("recency_half_life_days", half_life_days, None)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
                value) or value < 0 or (low is None and value <= 0):
            raise ConfigError(f"{name}={value!r} must be a finite number "
                              f"{'>= 0' if low is not None else '> 0 (days)'}")
    return float(weight), float(half_life_days)  # type: ignore[arg-type]


def bonus_of(since: Callable[[FactId], float | None], weight: float, half_life_days: float
             ) -> Bonus | None:
    """The bonus function of these settings; None when recency is off (weight 0)."""
    if not weight:
        return None
    half_life_s = half_life_days * 86400.0

    def bonus(fact_ids: Sequence[FactId]) -> dict[FactId, float]:
        times = {f: since(f) for f in fact_ids}
        known = [t for t in times.values() if t is not None]
        if not known:
            return {}
        newest = max(known)
        return {f: weight * 0.5 ** ((newest - t) / half_life_s)
                for f, t in times.items() if t is not None}

    return bonus


def rechosen(hits: list[tuple[FactId, float]], bonus: Bonus, k: int
             ) -> list[tuple[FactId, float]]:
    """The k best (fact id, cosine) by the raised cosine, best first (vector mode)."""
    extra = bonus([f for f, _ in hits])
    order = sorted(range(len(hits)), key=lambda i: (-raised(hits[i][1],
                                                            extra.get(hits[i][0], 0.0)), i))
    return [hits[i] for i in order[:k]]
