"""Keyword context (search/lexical.py): a fact's keyword document also holds the texts of the
CONTEXT_FACTS facts of the same user and session indexed right before it, and never a fact
that is gone.
"""

from __future__ import annotations

import pytest
import torch

from inferscale_engine.memory.search import lexical
from inferscale_engine.memory.search.index import RetrievalIndex

TURNS = ["Did you go to the Zanzibar lantern festival?", "Yes, last Friday with my sister.",
         "The weather was lovely.", "I bought a new kayak."]


def ids_of(hits):
    return [f for f, _ in hits]


def test_a_facts_context_is_the_texts_of_the_facts_before_it():
    index = lexical.LexicalIndex(2)
    index.add("ann", [10, 11, 12, 13], TURNS)
    assert index.context("ann", 10) == ""
    assert index.context("ann", 11) == TURNS[0]
    assert index.context("ann", 13) == f"{TURNS[1]} {TURNS[2]}"  # CONTEXT_FACTS = 2
    assert index.context("ann", 99) is None and index.context("bob", 10) is None
    index.add("ann", [14], ["Kayaks are fun."])  # a later add reads the earlier facts
    assert index.context("ann", 14) == f"{TURNS[2]} {TURNS[3]}"


def test_a_reply_is_found_by_the_words_of_the_question_before_it_own_words_first():
    index = lexical.LexicalIndex(2)
    index.add("ann", [1, 2, 3, 4], TURNS)
    hits = index.search("ann", "When did she go to the lantern festival?", 10)
    assert ids_of(hits) == [1, 2, 3]  # the question, its reply, then the turn after
    assert hits[0][1] > hits[1][1] > hits[2][1] > 0
    assert ids_of(index.search("ann", "kayak", 10)) == [4]  # nothing after it yet


def test_removing_or_rewriting_a_fact_rewrites_the_contexts_that_held_it():
    index = lexical.LexicalIndex(2)
    index.add("ann", [1, 2, 3, 4], TURNS)
    index.remove("ann", [2])
    assert index.context("ann", 3) == TURNS[0]
    assert index.context("ann", 4) == f"{TURNS[0]} {TURNS[2]}"
    assert index.search("ann", "sister Friday", 10) == []  # in no text and no context
    index.add("ann", [1], ["Did you see the Oslo marathon?"])  # re-indexed: new text
    assert index.search("ann", "Zanzibar", 10) == []
    assert ids_of(index.search("ann", "Oslo marathon", 10)) == [1, 3, 4]
    index.add("ann", [0], ["Hello there."])  # an id below the others: their contexts move
    assert index.context("ann", 1) == "Hello there."
    assert index.context("ann", 3) == f"Hello there. {'Did you see the Oslo marathon?'}"
    index.remove("ann", [0, 1, 3, 4, 5])  # 5 was never indexed: skipped
    assert index.count("ann") == 0 and index.search("ann", "Hello", 5) == []


def test_contexts_never_cross_users():
    index = RetrievalIndex(device="cpu", context_facts=2)
    vectors = torch.eye(4)
    index.add(user_id="ann", fact_ids=[1], embeddings=vectors[:1], texts=[TURNS[0]])
    index.add(user_id="bob", fact_ids=[2], embeddings=vectors[1:2],
              texts=["Bob fixed the Zanzibar lantern."])
    index.add(user_id="ann", fact_ids=[3], embeddings=vectors[2:3], texts=[TURNS[1]])
    index.add(user_id="bob", fact_ids=[4], embeddings=vectors[3:], texts=["Bob naps."])
    assert ids_of(index.keyword_search(user_id="ann", query="Zanzibar", k=5)) == [1, 3]
    assert ids_of(index.keyword_search(user_id="bob", query="Zanzibar", k=5)) == [2, 4]
    assert ids_of(index.keyword_search(user_id="bob", query="festival sister", k=5)) == []
    index.add(user_id="ann", fact_ids=[3], embeddings=vectors[2:3])  # re-indexed, no text
    assert ids_of(index.keyword_search(user_id="ann", query="sister", k=5)) == []


def test_contexts_stay_in_their_session():
    index = lexical.LexicalIndex(2)
    index.add("ann", [1, 2, 3], ["Ann's profile: she likes quinces.", TURNS[0], TURNS[1]],
              groups=[None, "s1", "s1"])
    index.add("ann", [4, 5], ["A new chat.", "About kayaks."], groups=["s2", "s2"])
    assert index.context("ann", 2) == "" and index.context("ann", 3) == TURNS[0]
    assert index.context("ann", 4) == "" and index.context("ann", 5) == "A new chat."
    assert ids_of(index.search("ann", "quinces", 10)) == [1]
    index.add("ann", [6], ["No session either."])  # the sessionless facts are one session
    assert index.context("ann", 6) == "Ann's profile: she likes quinces."
    index.add("ann", [3], [TURNS[1]], groups=["s2"])  # re-indexed into another session
    assert index.context("ann", 3) == "" and index.context("ann", 4) == TURNS[1]
    assert index.context("ann", 5) == f"{TURNS[1]} A new chat."
    index.remove("ann", [4])
    assert index.context("ann", 5) == TURNS[1] and index.count("ann") == 5


def test_the_memory_keeps_each_session_apart(memory_engine, tmp_path):
    from inferscale_engine.memory import Memory
    from tests.engine.memory.memory_support import HashEmbedder

    with Memory(memory_engine, tmp_path / "m.db", HashEmbedder(), progress_bar=False,
                keyword_context=True) as memory:
        (profile,) = memory.add(user_id="ann", texts=["Ann collects zorblax stamps."])
        chat = memory.add(user_id="ann", session_id="chat-1",
                          texts=["Hello.", "Where did you go?", "To the lake."])
        assert memory._index._keywords.context("ann", chat[0].fact_id) == ""
        assert memory._index._keywords.context("ann", chat[2].fact_id) == "Hello. Where did you go?"
        found = memory._index.keyword_search(user_id="ann", query="zorblax", k=5)
        assert ids_of(found) == [profile.fact_id]
    with Memory(memory_engine, tmp_path / "m.db", HashEmbedder(), progress_bar=False,
                keyword_context=True) as memory:
        assert memory._index._keywords.context("ann", chat[2].fact_id) == (
            "Hello. Where did you go?")  # rebuilt from the store at start-up


@pytest.mark.parametrize("context_facts", [2, 0])
def test_context_off_or_weighted_zero_matches_own_texts_only(monkeypatch, context_facts):
    if context_facts:
        monkeypatch.setattr(lexical, "CONTEXT_WEIGHT", 0)
    index = lexical.LexicalIndex(context_facts)
    index.add("ann", [1, 2, 3, 4], TURNS)
    hits = index.search("ann", "lantern festival", 10)
    assert ids_of(hits) == [1] and hits[0][1] > 0
    assert index.context("ann", 2) == (TURNS[0] if context_facts else "")


def test_keyword_context_is_off_by_default_and_checked(memory_engine, tmp_path):
    from inferscale_engine.errors import ConfigError
    from inferscale_engine.memory import Memory, MemoryConfig
    from tests.engine.memory.memory_support import HashEmbedder

    with Memory(memory_engine, tmp_path / "m.db", HashEmbedder(), progress_bar=False) as memory:
        memory.add(user_id="ann", texts=TURNS[:2])
        assert ids_of(memory._index.keyword_search(user_id="ann", query="lantern", k=5)) == [1]
    for bad in ("yes", 1, None):
        with pytest.raises(ConfigError, match="keyword_context=.*True or False"):
            Memory(memory_engine, tmp_path / "x.db", HashEmbedder(), progress_bar=False,
                   keyword_context=bad)
        with pytest.raises(ConfigError, match="keyword_context"):
            MemoryConfig(engine=memory_engine.config, keyword_context=bad)
    with pytest.raises(ConfigError, match="keyword context of -1 facts"):
        lexical.LexicalIndex(-1)


def test_gone_facts_leave_every_context(memory_engine, tmp_path):
    from inferscale_engine.memory import Memory
    from tests.engine.memory.memory_support import HashEmbedder

    with Memory(memory_engine, tmp_path / "m.db", HashEmbedder(), progress_bar=False,
                keyword_context=True) as memory:
        def keyword_ids(query):
            return set(ids_of(memory._index.keyword_search(user_id="ann", query=query, k=50)))

        (gone,) = memory.add(user_id="ann", texts=["Ann's locker code is quokka-7."])
        (old,) = memory.add(user_id="ann", texts=["Ann drives a marmalade Vespa."])
        (edited,) = memory.add(user_id="ann", texts=["Ann's cat is called Pumpernickel."])
        (kept,) = memory.add(user_id="ann", texts=["Ann grows tomatoes."])
        assert keyword_ids("quokka") == {gone.fact_id, old.fact_id, edited.fact_id}
        memory.delete(user_id="ann", fact_ids=[gone.fact_id])
        new = memory.supersede(user_id="ann", fact_id=old.fact_id, text="Ann drives a tram.")
        memory.update(user_id="ann", fact_id=edited.fact_id, text="Ann's cat is called Miso.")
        for stale in ("quokka", "marmalade Vespa", "Pumpernickel"):
            assert keyword_ids(stale) == set()  # in no text and no context
        assert keyword_ids("Miso") == {edited.fact_id, kept.fact_id, new.fact_id}
        memory.delete_all(user_id="ann")
        assert keyword_ids("tomatoes") == set()


def test_the_postings_budget_counts_context_matches(monkeypatch):
    index = lexical.LexicalIndex(2)
    texts = [f"Caroline talks about day {n}." for n in range(30)] + ["Caroline paints owls."]
    index.add("u", list(range(len(texts))), texts)
    monkeypatch.setattr(lexical, "MAX_POSTINGS", 10)  # 'caroline': 31 facts, over the budget
    assert ids_of(index.search("u", "Caroline owls", 50)) == [30]
    index.add("u", [31, 32], ["Nothing here.", "Still nothing."])  # 'owls' in their context
    assert sorted(ids_of(index.search("u", "Caroline owls", 50))) == [30, 31, 32]


@pytest.fixture()
def memory_engine(tiny_models):
    """An Engine over FakeRunner: Memory's bookkeeping runs, no model does."""
    from inferscale_engine.runtime.engine import Engine
    from tests.conftest import engine_config
    from tests.fake_runner import FakeRunner

    engine = Engine(engine_config(tiny_models["qwen2"]), runner=FakeRunner)
    yield engine
    engine.close()
