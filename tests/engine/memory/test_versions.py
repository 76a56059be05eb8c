"""Older versions of a found fact left out of reads about the present (search/versions.py).

The rule over FakeRunner with a table embedder (cosines chosen by the test), and once with the
real default embedder on the kind of facts it exists for.
"""

from __future__ import annotations

import pytest

from inferscale_engine.errors import ConfigError, InvalidRequestError
from inferscale_engine.facts import FactId
from inferscale_engine.memory.search import versions
from inferscale_engine.memory.search.embedder import Embedder
from tests.engine.memory.memory_support import TableEmbedder

OLD, NEW, OTHER = "I live in Denver.", "My new apartment is in Lisbon.", "I like green tea."
NOW, PLAIN = "Which city do I live in now?", "Which city do I live in?"


TABLE = {OLD: [1.0, 0.0, 0.0], NEW: [0.6, 0.8, 0.0], OTHER: [0.0, 0.0, 1.0],
         NOW: [0.8, 0.6, 0.0], PLAIN: [0.8, 0.6, 0.0]}
"""Each known text a fixed direction: OLD and NEW at cosine 0.6, both close to the
    questions, OTHER orthogonal to everything."""


def open_memory(engine, path, embedder=None, **options):
    from inferscale_engine.memory import Memory

    return Memory(engine, path, embedder or TableEmbedder(TABLE), progress_bar=False,
                  dedupe_threshold=None, **options)


def test_asks_about_now():
    for query in ("Which city do I live in now?", "What is my current job?",
                  "Do I still play tennis?", "What car do I drive these days?",
                  "Where do I work at the moment?", "What is my latest phone?"):
        assert versions.asks_about_now(query), query
    for query in ("Which city do I live in?", "When did I move to Lisbon?",
                  "What did Caroline paint in 2022?", "Is it snowing?"):
        assert not versions.asks_about_now(query), query
    # a framework's template around the user's words: the user's question decides
    template = ("The following is a friendly conversation.\n\nCurrent conversation:\n"
                "Human: Hi! Do you remember my dog's name?\nAI:")
    assert not versions.asks_about_now(template)
    assert versions.asks_about_now(template.replace("my dog's name", "my dog's name now"))
    assert versions.asks_about_now("Context: nothing current.\nWhere do I work now")
    assert not versions.asks_about_now("Where do I work now?\nThanks. Where did I grow up?")


def test_older_versions_rule():
    times = {FactId(1): 10.0, FactId(2): 20.0, FactId(3): 30.0, FactId(4): None}
    hits = [(FactId(1), 0.7), (FactId(2), 0.6), (FactId(3), 0.2), (FactId(4), 0.6)]
    sim = [[1.0, 0.5, 0.9, 0.9],
           [0.5, 1.0, 0.1, 0.9],
           [0.9, 0.1, 1.0, 0.1],
           [0.9, 0.9, 0.1, 1.0]]
    # 1 is an older version of 2 (similar, about as relevant); 3 is similar to 1 but much less
    # relevant; 4 has no time and is never compared
    assert versions.older_versions(hits, sim, times.get) == {FactId(1)}
    sim[0][1] = sim[1][0] = 0.29  # below VERSION_SIMILARITY
    assert versions.older_versions(hits, sim, times.get) == set()
    # a question asserts nothing: never the newer version of a fact
    sim[0][1] = sim[1][0] = 0.5
    texts = ["My dog is Rex.", "What is my dog's name?", "x", "y"]
    assert versions.older_versions(hits, sim, times.get, texts) == set()
    # the same time: the larger fact id is the newer (added later in one call)
    same = {FactId(1): 5.0, FactId(2): 5.0}
    pair = [(FactId(1), 0.5), (FactId(2), 0.5)]
    assert versions.older_versions(pair, [[1, 0.8], [0.8, 1]], same.get) == {FactId(1)}


def test_a_question_about_now_leaves_the_older_version_out(fake_engine, tmp_path):
    with open_memory(fake_engine, tmp_path / "m.db") as memory:
        (old,) = memory.add(user_id="ann", texts=[OLD], timestamp="2024-01-01")
        (other,) = memory.add(user_id="ann", texts=[OTHER], timestamp="2024-02-01")
        (new,) = memory.add(user_id="ann", texts=[NEW], timestamp="2024-03-01")
        now = memory.search(user_id="ann", query=NOW, k=3)
        assert [f.fact_id for f in now.facts] == [new.fact_id, other.fact_id]
        assert now.older_versions == (old.fact_id,)
        assert list(now.handle.fact_ids) == [new.fact_id, other.fact_id]
        assert memory.counters["older_versions_left_out"] == 1
        # without a word about the present, every version is found
        plain = memory.search(user_id="ann", query=PLAIN, k=3)
        assert {f.fact_id for f in plain.facts} == {old.fact_id, new.fact_id, other.fact_id}
        assert plain.older_versions == ()
        # per search: never / always
        never = memory.search(user_id="ann", query=NOW, k=3, hide_older_versions="never")
        assert old.fact_id in [f.fact_id for f in never.facts]
        always = memory.search(user_id="ann", query=PLAIN, k=3, hide_older_versions="always")
        assert always.older_versions == (old.fact_id,)
        # a read as of a date keeps what was true then
        then = memory.search(user_id="ann", query=NOW, k=3, as_of="2024-02-15")
        assert old.fact_id in [f.fact_id for f in then.facts]
        assert new.fact_id not in [f.fact_id for f in then.facts]
        # the older fact is still stored and current: only this read left it out
        assert memory.get(user_id="ann", fact_id=old.fact_id).valid_to is None
        with pytest.raises(InvalidRequestError, match="hide_older_versions"):
            memory.search(user_id="ann", query=NOW, k=3, hide_older_versions="sometimes")


def test_the_newer_fact_decides_even_when_added_first_by_id(fake_engine, tmp_path):
    """'Newer' is when a fact became true (timestamp), not the order of the adds."""
    with open_memory(fake_engine, tmp_path / "m.db") as memory:
        (new,) = memory.add(user_id="ann", texts=[NEW], timestamp="2024-03-01")
        (old,) = memory.add(user_id="ann", texts=[OLD], timestamp="2024-01-01")
        now = memory.search(user_id="ann", query=NOW, k=2)
        assert [f.fact_id for f in now.facts] == [new.fact_id]
        assert now.older_versions == (old.fact_id,)


def test_the_setting(fake_engine, tmp_path):
    from inferscale_engine.config import EngineConfig
    from inferscale_engine.memory.config import MemoryConfig

    with open_memory(fake_engine, tmp_path / "a.db", hide_older_versions="never") as memory:
        memory.add(user_id="ann", texts=[OLD], timestamp="2024-01-01")
        memory.add(user_id="ann", texts=[NEW], timestamp="2024-03-01")
        assert len(memory.search(user_id="ann", query=NOW, k=2).facts) == 2
    with pytest.raises(ConfigError, match="hide_older_versions"):
        open_memory(fake_engine, tmp_path / "b.db", hide_older_versions="yes")
    with pytest.raises(ConfigError, match="hide_older_versions"):
        MemoryConfig(engine=EngineConfig(model="x"), hide_older_versions="often")


def test_a_request_is_served_the_newer_version_only(fake_engine, tmp_path):
    """The handle a request is answered with (generate's and the server's) holds the newer
    version only."""
    with open_memory(fake_engine, tmp_path / "m.db") as memory:
        memory.add(user_id="ann", texts=[OLD], timestamp="2024-01-01")
        (new,) = memory.add(user_id="ann", texts=[NEW], timestamp="2024-03-01")
        handle = memory.handle_for(user_id="ann", query=NOW, k=2)
        assert list(handle.fact_ids) == [new.fact_id]
        assert len(memory.handle_for(user_id="ann", query=PLAIN, k=2).fact_ids) == 2


def test_real_embedder_on_changed_facts(fake_engine, tmp_path):
    """The default embedder and constants on the facts the rule is for: the old city is left
    out of a question about now, an unrelated fact is not, and a question without a word
    about the present keeps both cities."""
    from inferscale_engine.memory.config import DEFAULT_EMBEDDING_MODEL

    with open_memory(fake_engine, tmp_path / "m.db", Embedder(DEFAULT_EMBEDDING_MODEL)) as memory:
        (old,) = memory.add(user_id="ann", texts=["I live in Denver."], timestamp="2023-01-09")
        memory.add(user_id="ann", texts=["I drive a Civic.", "My sister is named Maya."],
                   timestamp="2023-02-01")
        (new,) = memory.add(user_id="ann", texts=["We left Denver and relocated to Lisbon."],
                            timestamp="2023-05-27")
        now = memory.search(user_id="ann", query="Which city do I live in now?", k=4)
        assert new.fact_id in [f.fact_id for f in now.facts]
        assert now.older_versions == (old.fact_id,)
        assert len(now.facts) == 3
        plain = memory.search(user_id="ann", query="Which city did I live in?", k=4)
        assert {old.fact_id, new.fact_id} <= {f.fact_id for f in plain.facts}
