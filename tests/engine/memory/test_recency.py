"""Recency (memory/search/recency.py) over FakeRunner with a table embedder.

Off by default; with a weight, newer facts win among relevant ones in both search modes, in
what a request is served with too; an irrelevant new fact is never brought in; ages count from
the newest candidate, not the clock; bad settings are ConfigErrors.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from inferscale_engine.errors import ConfigError
from inferscale_engine.memory.search import recency
from tests.conftest import engine_config
from tests.engine.memory.memory_support import TableEmbedder

OLD, NEW, FAR = "I play the cello.", "I play the oboe.", "The weather is mild."
QUERY = "Which instrument do I play?"


TABLE = {OLD: [0.8, 0.6, 0.0], NEW: [0.7, 0.71, 0.0], FAR: [0.0, 0.0, 1.0],
         QUERY: [1.0, 0.0, 0.0]}
"""OLD a little closer to the query than NEW; FAR orthogonal to it."""


def filled(engine, path, **options):
    from inferscale_engine.memory import Memory

    memory = Memory(engine, path, TableEmbedder(TABLE), progress_bar=False,
                    dedupe_threshold=None, **options)
    memory.add(user_id="u", texts=[FAR], timestamp=datetime(2022, 6, 1, tzinfo=UTC))
    memory.add(user_id="u", texts=[OLD], timestamp=datetime(2023, 1, 1, tzinfo=UTC))
    memory.add(user_id="u", texts=[NEW], timestamp=datetime(2023, 3, 1, tzinfo=UTC))
    return memory


@pytest.mark.parametrize("mode", ["vector", "hybrid"])
def test_newer_relevant_facts_win_only_with_a_weight(fake_engine, tmp_path, mode):
    with filled(fake_engine, tmp_path / "off.db") as memory:  # the default: relevance alone
        (hit,) = memory.search(user_id="u", query=QUERY, k=1, search_mode=mode).facts
        assert hit.text == OLD
    with filled(fake_engine, tmp_path / "on.db", recency_weight=0.3,
                recency_half_life_days=30) as memory:
        # cosines 0.80 (OLD) and 0.70 (NEW, two months newer): 0.80 * (1 + 0.3 * 0.26) < 0.70
        # * (1 + 0.3)
        (hit,) = memory.search(user_id="u", query=QUERY, k=1, search_mode=mode).facts
        assert hit.text == NEW
        hits = memory.search(user_id="u", query=QUERY, k=2, search_mode=mode)
        assert [f.text for f in hits.facts] == [OLD, NEW]  # reported in cosine order
        handle = memory.handle_for(user_id="u", query=QUERY, k=1)  # what a request is served
        assert [memory.get(user_id="u", fact_id=f).text for f in handle.fact_ids] == [NEW]
    with filled(fake_engine, tmp_path / "weak.db", recency_weight=0.05) as memory:
        (hit,) = memory.search(user_id="u", query=QUERY, k=1, search_mode=mode).facts
        assert hit.text == OLD  # a small weight does not outweigh the relevance gap


def test_ages_count_from_the_newest_candidate_not_the_clock():
    times = {1: 0.0, 2: 30 * 86400.0, 3: None}
    bonus = recency.bonus_of(times.get, 0.4, 30.0)
    assert bonus is not None
    got = bonus([1, 2, 3])
    assert got[2] == pytest.approx(0.4) and got[1] == pytest.approx(0.2) and 3 not in got
    shifted = recency.bonus_of(lambda f: None if times[f] is None else times[f] + 1e9, 0.4, 30)
    assert shifted([1, 2, 3]) == pytest.approx(got)  # years later: the same bonuses
    assert recency.bonus_of(times.get, 0.0, 30.0) is None
    # a fact of no relevance gains nothing, however new
    assert recency.raised(0.0, 0.4) == 0.0 and recency.raised(-0.2, 0.4) == -0.2
    assert recency.raised(0.5, 0.4) == pytest.approx(0.7)


@pytest.mark.parametrize("weight, half_life", [(-0.1, 30), (float("nan"), 30), ("1", 30),
                                               (True, 30), (0.1, 0), (0.1, -5),
                                               (0.1, float("inf"))])
def test_bad_recency_settings_are_refused(fake_engine, tmp_path, tiny_models, weight, half_life):
    from inferscale_engine.memory import Memory, MemoryConfig

    with pytest.raises(ConfigError, match="recency"):
        Memory(fake_engine, tmp_path / "m.db", TableEmbedder(TABLE), recency_weight=weight,
               recency_half_life_days=half_life)
    with pytest.raises(ConfigError, match="recency"):
        MemoryConfig(engine=engine_config(tiny_models["qwen2"]), recency_weight=weight,
                     recency_half_life_days=half_life)
