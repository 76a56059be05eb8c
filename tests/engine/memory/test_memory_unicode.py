"""Unicode at the memory layer: no fact lost to the embedder, no invisible fact, one user per
NFC name (the real MiniLM embedder and the real engine)."""

from __future__ import annotations

import pytest

from inferscale_engine.errors import InvalidFactError, InvalidUserIdError
from inferscale_engine.memory import Memory
from inferscale_engine.memory.search.embedder import Embedder
from tests.conftest import running_engine

pytestmark = pytest.mark.vllm

EMOJI = ["🎉🎉", "🚀🚀", "🐍", "😀"]


@pytest.fixture(scope="module")
def engine(tiny_models):
    with running_engine(tiny_models["qwen2"]) as eng:
        yield eng


@pytest.fixture(scope="module")
def embedder():
    return Embedder()  # all-MiniLM-L6-v2, offline


@pytest.fixture()
def memory(engine, embedder, tmp_path):
    with Memory(engine, str(tmp_path / "u.db"), embedder, progress_bar=False) as mem:
        yield mem


def test_emoji_only_facts_are_all_stored(memory, embedder):
    vectors = embedder.encode(EMOJI)
    assert float((vectors @ vectors.T).min()) > 0.95  # the embedder cannot tell them apart
    results = memory.add(user_id="u", texts=EMOJI)
    assert [r.event for r in results] == ["ADD"] * 4
    assert sorted(f.text for f in memory.get_all(user_id="u")) == sorted(EMOJI)
    again = memory.add(user_id="u", texts=["🚀🚀", " 🐍 "])  # true duplicates still are
    assert [r.event for r in again] == ["DUPLICATE", "DUPLICATE"]
    assert [r.fact_id for r in again] == [results[1].fact_id, results[2].fact_id]
    assert len(memory.get_all(user_id="u")) == 4


def test_same_words_in_another_format_are_duplicates_but_other_numbers_are_not(memory):
    first = memory.add(user_id="u", texts=["Alice is 31 and lives in Lisbon."])
    results = memory.add(user_id="u", texts=["alice is 31 and lives in lisbon",
                                              "Alice is 32 and lives in Lisbon."])
    assert [r.event for r in results] == ["DUPLICATE", "ADD"]
    assert results[0].fact_id == first[0].fact_id


@pytest.mark.parametrize("text", ["\u200b", "\u200d", "\ufeff", "\u200b\u200b\u200b\u200c"])
def test_invisible_only_facts_are_refused_and_nothing_is_stored(memory, text):
    memory.add(user_id="u", texts=["A visible fact."])
    with pytest.raises(InvalidFactError, match="no visible character"):
        memory.add(user_id="u", texts=["Another fact.", text])
    with pytest.raises(InvalidFactError, match="no visible character"):
        memory.engine.add_facts("u", [text])
    assert [f.text for f in memory.get_all(user_id="u")] == ["A visible fact."]


def test_nfc_and_nfd_spellings_are_one_user(memory):
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    (added,) = memory.add(user_id=nfd, texts=["The café user likes tea."])
    assert [f.fact_id for f in memory.get_all(user_id=nfc)] == [added.fact_id]
    found = memory.search(user_id=nfc, query="tea", k=3)
    assert found.handle.user_id == nfc and [f.fact_id for f in found.facts] == [added.fact_id]
    out = memory.generate(user_id=nfd, query="What do I like?", k=3)
    assert out.plan_status == "inject"
    assert memory.reset(user_id=nfd) == 1 and memory.get_all(user_id=nfc) == []


@pytest.mark.parametrize("user_id", ["user\x00x", "a\nb", "\x1b[31m"])
def test_control_characters_in_user_ids_are_refused(memory, user_id):
    with pytest.raises(InvalidUserIdError, match="control character"):
        memory.add(user_id=user_id, texts=["x"])
    with pytest.raises(InvalidUserIdError, match="control character"):
        memory.engine.add_facts(user_id, ["x"])
    assert memory.stats().num_facts == 0
