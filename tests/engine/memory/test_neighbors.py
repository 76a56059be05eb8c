"""Neighbors (memory/search/neighbors.py) over FakeRunner with a table embedder.

Off by default; with a share, a search's best facts bring the facts added right after and
before them into the k (in what a request is served with too), marked 'neighbor'; neighbors
are the same user's, never a deleted fact, never a skipped one; bad settings are ConfigErrors.
"""

from __future__ import annotations

import pytest

from inferscale_engine.errors import ConfigError
from inferscale_engine.memory.search import neighbors
from tests.engine.memory.memory_support import TableEmbedder

ASKED = "Did you go to the support group?"
ANSWER = "Yes, last Friday, and it was so powerful."
BEFORE = "Caroline: I went to a support group."
OTHER = "Melanie paints landscapes."
FAR = "The weather is mild."
QUERY = "When did Caroline go to the support group?"
TABLE = {ASKED: [0.9, 0.1, 0.0], BEFORE: [0.8, 0.0, 0.2], ANSWER: [-0.3, 0.2, 0.93],
         OTHER: [0.02, 1.0, 0.0], FAR: [0.05, 0.3, 0.95], QUERY: [1.0, 0.0, 0.0]}
"""ASKED and BEFORE match the query; ANSWER (said right after ASKED) does not, and ranks below
FAR, which was said long before."""


def filled(engine, path, **options):
    from inferscale_engine.memory import Memory

    memory = Memory(engine, path, TableEmbedder(TABLE), progress_bar=False,
                    dedupe_threshold=None, search_mode="vector", **options)
    memory.add(user_id="u", texts=[FAR, OTHER, BEFORE])
    memory.add(user_id="other", texts=["Someone else's fact."])  # between the user's ids
    memory.add(user_id="u", texts=[ASKED])
    memory.add(user_id="u", texts=[ANSWER])
    return memory


def test_the_fact_said_right_after_a_best_fact_joins_the_k_only_with_a_share(fake_engine,
                                                                            tmp_path):
    with filled(fake_engine, tmp_path / "off.db") as memory:  # the default: relevance alone
        found = memory.search(user_id="u", query=QUERY, k=4)
        assert [f.text for f in found.facts] == [ASKED, BEFORE, FAR, OTHER]
        assert set(found.found_by) == {"embedding"}
    with filled(fake_engine, tmp_path / "on.db", neighbor_share=0.5) as memory:
        found = memory.search(user_id="u", query=QUERY, k=4)
        # anchors ASKED, BEFORE; ASKED's next (ANSWER: the other user's fact between them is
        # not a neighbor) and previous (BEFORE: chosen already); BEFORE's previous (OTHER)
        assert [f.text for f in found.facts] == [ASKED, BEFORE, OTHER, ANSWER]  # cosine order
        assert found.found_by == ("embedding", "embedding", "neighbor", "neighbor")
        assert memory.stats().counters["neighbors_added"] == 2
        handle = memory.handle_for(user_id="u", query=QUERY, k=4)  # what a request is served
        assert ANSWER in [memory.get(user_id="u", fact_id=f).text for f in handle.fact_ids]
        assert all(memory.get(user_id="u", fact_id=f) for f in handle.fact_ids)
        answer_id = next(f.fact_id for f in found.facts if f.text == ANSWER)
        skipped = memory.search(user_id="u", query=QUERY, k=4, exclude=[answer_id])
        assert ANSWER not in [f.text for f in skipped.facts] and len(skipped.facts) == 4
        memory.delete(user_id="u", fact_ids=[answer_id])
        found = memory.search(user_id="u", query=QUERY, k=4)
        assert ANSWER not in [f.text for f in found.facts]
        assert [f.text for f in found.facts] == [ASKED, BEFORE, FAR, OTHER]
        assert memory.search(user_id="other", query=QUERY, k=4).facts[0].text == (
            "Someone else's fact.")


def test_neighbors_fill_then_the_next_best_facts():
    ranked = [(10, 0.9), (20, 0.8), (30, 0.7), (40, 0.6)]
    beside = {10: (11, 9), 20: (21, 19)}

    def adjacent(anchors):
        return {a: beside[a] for a in anchors if a in beside}

    assert neighbors.with_neighbors(ranked, 4, 0.5, adjacent, ()) == ([10, 20, 11, 9], [11, 9])
    assert neighbors.with_neighbors(ranked, 4, 0.5, adjacent, {11}) == ([10, 20, 9, 21],
                                                                       [9, 21])
    assert neighbors.with_neighbors(ranked, 4, 0.25, adjacent, ()) == ([10, 20, 30, 11], [11])
    assert neighbors.with_neighbors(ranked, 4, 0.5, lambda a: {}, ()) == ([10, 20, 30, 40], [])
    assert neighbors.with_neighbors(ranked, 4, 0.0, adjacent, ()) == ([10, 20, 30, 40], [])
    assert neighbors.with_neighbors(ranked, 1, 0.5, adjacent, ()) == ([10], [])


@pytest.mark.parametrize("bad", [-0.1, 1.0, 2, float("nan"), "0.3", True, None])
def test_bad_shares_are_config_errors(fake_engine, tmp_path, bad):
    from inferscale_engine.memory import Memory, MemoryConfig

    with pytest.raises(ConfigError, match="neighbor_share"):
        Memory(fake_engine, tmp_path / "m.db", TableEmbedder(TABLE), progress_bar=False,
               neighbor_share=bad)
    with pytest.raises(ConfigError, match="neighbor_share"):
        MemoryConfig(engine=fake_engine.config, db_path="m.db", neighbor_share=bad)
