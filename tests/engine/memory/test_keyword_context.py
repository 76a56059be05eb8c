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
    index = lexical.LexicalIndex()
    index.add("ann", [10, 11, 12, 13], TURNS)
    assert index.context("ann", 10) == ""
    assert index.context("ann", 11) == TURNS[0]
    assert index.context("ann", 13) == f"{TURNS[1]} {TURNS[2]}"  # CONTEXT_FACTS = 2
    assert index.context("ann", 99) is None and index.context("bob", 10) is None
    index.add("ann", [14], ["Kayaks are fun."])  # a later add reads the earlier facts
    assert index.context("ann", 14) == f"{TURNS[2]} {TURNS[3]}"


def test_a_reply_is_found_by_the_words_of_the_question_before_it_own_words_first():
    index = lexical.LexicalIndex()
    index.add("ann", [1, 2, 3, 4], TURNS)
    hits = index.search("ann", "When did she go to the lantern festival?", 10)
    assert ids_of(hits) == [1, 2, 3]  # the question, its reply, then the turn after
    assert hits[0][1] > hits[1][1] > hits[2][1] > 0
    assert ids_of(index.search("ann", "kayak", 10)) == [4]  # nothing after it yet


def test_removing_or_rewriting_a_fact_rewrites_the_contexts_that_held_it():
    index = lexical.LexicalIndex()
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
    index = RetrievalIndex(device="cpu")
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
    index = lexical.LexicalIndex()
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

    with Memory(memory_engine, tmp_path / "m.db", HashEmbedder(), progress_bar=False) as memory:
        (profile,) = memory.add(user_id="ann", texts=["Ann collects zorblax stamps."])
        chat = memory.add(user_id="ann", session_id="chat-1",
                          texts=["Hello.", "Where did you go?", "To the lake."])
        assert memory._index._keywords.context("ann", chat[0].fact_id) == ""
        assert memory._index._keywords.context("ann", chat[2].fact_id) == "Hello. Where did you go?"
        found = memory._index.keyword_search(user_id="ann", query="zorblax", k=5)
        assert ids_of(found) == [profile.fact_id]
    with Memory(memory_engine, tmp_path / "m.db", HashEmbedder(), progress_bar=False) as memory:
        assert memory._index._keywords.context("ann", chat[2].fact_id) == (
            "Hello. Where did you go?")  # rebuilt from the store at start-up


@pytest.mark.parametrize("setting", ["CONTEXT_WEIGHT", "CONTEXT_FACTS"])
def test_context_switched_off_matches_own_texts_only(monkeypatch, setting):
    monkeypatch.setattr(lexical, setting, 0)
    index = lexical.LexicalIndex()
    index.add("ann", [1, 2, 3, 4], TURNS)
    hits = index.search("ann", "lantern festival", 10)
    assert ids_of(hits) == [1] and hits[0][1] > 0


def test_the_postings_budget_counts_context_matches(monkeypatch):
    index = lexical.LexicalIndex()
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
