"""Hybrid search (search/hybrid.py, lexical.py): keywords fused with vectors, over FakeRunner.

The keyword index follows the vector index's lifecycle: what is deleted, superseded, updated
or another user's is found by neither signal.
"""

from __future__ import annotations

import pytest
import torch

from inferscale_engine.errors import (
    ConfigError,
    InvalidFactError,
    InvalidRequestError,
    RetrievalError,
)
from tests.conftest import engine_config
from tests.engine.memory.memory_support import HashEmbedder
from tests.fake_runner import FakeRunner

DISTRACTORS = [f"Where is the invoice from last spring, number {n}?" for n in range(12)]
QUERY = "Where is the zorblax invoice from last spring?"
TARGET = "The zorblax invoice is in the drawer."


@pytest.fixture()
def engine(tiny_models):
    """An Engine over FakeRunner: Memory's bookkeeping runs, no model does."""
    from inferscale_engine.runtime.engine import Engine

    eng = Engine(engine_config(tiny_models["qwen2"]), runner=FakeRunner)
    yield eng
    eng.close()


@pytest.fixture()
def memory(engine, tmp_path):
    """A Memory with the default search mode and the test embedder."""
    from inferscale_engine.memory import Memory

    mem = Memory(engine, tmp_path / "m.db", HashEmbedder(), progress_bar=False)
    yield mem
    mem.close()


def keyword_ids(memory, user_id: str, query: str) -> set[int]:
    """What the keyword signal alone finds for the user (the index the search reads)."""
    return {f for f, _ in memory._index.keyword_search(user_id=user_id, query=query, k=50)}


def test_hybrid_finds_a_fact_by_a_rare_keyword_that_vector_search_ranks_low(memory):
    memory.add(user_id="ann", texts=DISTRACTORS, metadata={"topic": "bills"})
    (target,) = memory.add(user_id="ann", texts=[TARGET], metadata={"topic": "bills"})
    vector = memory.search(user_id="ann", query=QUERY, k=3, search_mode="vector")
    assert target.fact_id not in vector.handle.fact_ids
    everything = memory.search(user_id="ann", query=QUERY, k=20, search_mode="vector")
    assert everything.handle.fact_ids.index(target.fact_id) >= 3
    hybrid = memory.search(user_id="ann", query=QUERY, k=3, search_mode="hybrid")
    assert target.fact_id in hybrid.handle.fact_ids  # the keyword brought it in
    scores = [score for _, score in hybrid.hits]  # ordered by, and scored with, the cosine
    assert scores == sorted(scores, reverse=True) and all(-1 <= s <= 1 for s in scores)
    cosine_of = {f.fact_id: s for f, s in everything.hits}
    assert scores == pytest.approx([cosine_of[f] for f in hybrid.handle.fact_ids])
    found_by = dict(zip(hybrid.handle.fact_ids, hybrid.found_by, strict=True))
    assert found_by[target.fact_id] == "keywords"  # not among the embedding's own top 3
    assert set(found_by.values()) <= {"embedding", "keywords", "both"}
    assert vector.found_by == ("embedding",) * 3
    assert memory.search(user_id="ann", query=QUERY, k=3).handle == hybrid.handle  # default
    # a filter narrows the hybrid ranking the same way it narrows the vector one
    narrowed = memory.search(user_id="ann", query=QUERY, k=3, search_mode="hybrid",
                             filter={"topic": "bills"})
    assert narrowed.handle.fact_ids == hybrid.handle.fact_ids


def test_keywords_choose_the_facts_and_the_cosine_orders_them():
    from inferscale_engine.memory.search.hybrid import by_score, fuse

    # "Where do I live?": the fact that answers it is the nearest by cosine; another shares
    # the query's one keyword ("lives"); a third has neither.
    lisbon, sister, shelter, far = 1, 2, 3, 4
    vector_hits = [(lisbon, 0.162), (sister, 0.128), (shelter, 0.121)]
    chosen = fuse(vector_hits, [(sister, 2.0), (far, 0.5)], {far: -0.05}, k=2)
    assert chosen == [(sister, 0.128), (lisbon, 0.162)]  # fused order: the keyword counts
    assert by_score(chosen) == [(lisbon, 0.162), (sister, 0.128)]  # cosine order
    # a keyword-only fact beats a weak vector hit into the k, and keeps its cosine
    assert fuse(vector_hits, [(far, 1.0)], {far: -0.05}, k=3) == [
        (far, -0.05), (lisbon, 0.162), (sister, 0.128)]
    assert fuse(vector_hits, [], {}, k=2) == vector_hits[:2]


def test_no_user_finds_another_users_facts_by_either_signal(memory):
    (ann,) = memory.add(user_id="ann", texts=[TARGET])
    (bob,) = memory.add(user_id="bob", texts=["Bob hides zorblax coins under the bed."])
    for mode in ("vector", "hybrid"):
        found = memory.search(user_id="ann", query="zorblax coins bed", k=10, search_mode=mode)
        assert found.handle.fact_ids == (ann.fact_id,)
        assert {f.user_id for f in found.facts} == {"ann"}
    assert keyword_ids(memory, "ann", "zorblax coins bed") == {ann.fact_id}
    assert keyword_ids(memory, "bob", "zorblax") == {bob.fact_id}
    assert memory.search(user_id="cy", query="zorblax", k=5).facts == []


def test_deleted_superseded_and_updated_facts_leave_both_signals(memory):
    (gone,) = memory.add(user_id="ann", texts=["Ann's locker code is quokka-7."])
    (old,) = memory.add(user_id="ann", texts=["Ann drives a marmalade Vespa."])
    (edited,) = memory.add(user_id="ann", texts=["Ann's cat is called Pumpernickel."])
    (kept,) = memory.add(user_id="ann", texts=["Ann grows tomatoes."])
    memory.delete(user_id="ann", fact_ids=[gone.fact_id])
    new = memory.supersede(user_id="ann", fact_id=old.fact_id, text="Ann drives a tram.")
    assert new is not None
    memory.update(user_id="ann", fact_id=edited.fact_id, text="Ann's cat is called Miso.")
    for query, stale in (("quokka locker code", gone.fact_id), ("marmalade Vespa", old.fact_id)):
        for mode in ("vector", "hybrid"):
            ids = memory.search(user_id="ann", query=query, k=10, search_mode=mode).handle
            assert stale not in ids.fact_ids
        assert keyword_ids(memory, "ann", query) == set()
    assert keyword_ids(memory, "ann", "Pumpernickel") == set()
    assert keyword_ids(memory, "ann", "Miso") == {edited.fact_id}
    assert keyword_ids(memory, "ann", "tram") == {new.fact_id}
    memory.delete_all(user_id="ann")
    assert keyword_ids(memory, "ann", "tomatoes") == set()
    assert kept.fact_id not in memory.search(user_id="ann", query="tomatoes", k=5).handle.fact_ids


def test_a_bad_search_mode_is_refused_clearly(memory, engine, tmp_path):
    from inferscale_engine.memory import Memory, MemoryConfig

    memory.add(user_id="ann", texts=[TARGET])
    for bad in ("bm25", "HYBRID", 1):
        with pytest.raises(InvalidRequestError, match="search_mode=.*'vector'.*'hybrid'"):
            memory.search(user_id="ann", query="zorblax", k=3, search_mode=bad)
    memory.close()
    with pytest.raises(ConfigError, match="search_mode"):
        Memory(engine, tmp_path / "x.db", HashEmbedder(), progress_bar=False,
               search_mode="keyword")
    with pytest.raises(ConfigError, match="search_mode"):
        MemoryConfig(engine=engine.config, search_mode="fts")
    with Memory(engine, tmp_path / "v.db", HashEmbedder(), progress_bar=False,
                search_mode="vector") as vector_memory:
        vector_memory.add(user_id="ann", texts=DISTRACTORS + [TARGET])
        found = vector_memory.search(user_id="ann", query=QUERY, k=3)
        assert found.handle == vector_memory.search(user_id="ann", query=QUERY, k=3,
                                                     search_mode="vector").handle


def test_the_index_keeps_keywords_and_vectors_of_the_same_facts():
    from inferscale_engine.memory.search.index import RetrievalIndex

    index = RetrievalIndex(device="cpu")
    vectors = torch.eye(3)
    with pytest.raises(RetrievalError, match="2 texts for 3 fact_ids"):
        index.add(user_id="u", fact_ids=[1, 2, 3], embeddings=vectors, texts=["a", "b"])
    assert index.count(user_id="u") == 0
    index.add(user_id="u", fact_ids=[1, 2, 3], embeddings=vectors,
              texts=["red apples", "green pears", "red cherries"])
    assert [f for f, _ in index.keyword_search(user_id="u", query="the red", k=5)] == [1, 3]
    assert index.scores(user_id="u", query_embedding=vectors[2], fact_ids=[3, 1]) == [1.0, 0.0]
    index.add(user_id="u", fact_ids=[3], embeddings=vectors[2:])  # re-indexed without text
    assert [f for f, _ in index.keyword_search(user_id="u", query="red", k=5)] == [1]
    index.remove(user_id="u", fact_ids=[1])
    assert index.keyword_search(user_id="u", query="red", k=5) == []
    assert index.keyword_search(user_id="v", query="green", k=5) == []
    index.drop_user(user_id="u")
    assert index.keyword_search(user_id="u", query="green", k=5) == []


def test_a_large_memory_matches_a_querys_rarest_words_first(monkeypatch):
    from inferscale_engine.memory.search import lexical

    index = lexical.LexicalIndex()
    texts = [f"Caroline talks about day {n}." for n in range(30)] + ["Caroline paints owls."]
    index.add("u", list(range(len(texts))), texts)
    everything = index.search("u", "Caroline owls", 50)
    assert len(everything) == 31 and everything[0][0] == 30
    monkeypatch.setattr(lexical, "MAX_POSTINGS", 10)  # 'caroline' (31 facts) is over it
    only_owls = pytest.approx(everything[0][1], rel=1e-3)  # 'caroline' weighed ~0 anyway
    assert index.search("u", "Caroline owls", 50) == [(30, only_owls)]
    assert index.search("u", "Caroline", 50) == []


def _prefers(word: str):
    """A reranker: texts holding `word` first, then shorter texts (a deterministic scorer)."""
    calls: list[tuple[str, list[str]]] = []

    def rerank(query: str, texts: list[str]) -> list[float]:
        calls.append((query, list(texts)))
        return [(10.0 if word in t.lower() else 0.0) - len(t) / 1000 for t in texts]

    return rerank, calls


def test_a_reranker_reorders_the_candidates_and_its_scores_are_reported(engine, tmp_path):
    from inferscale_engine.memory import Memory

    rerank, calls = _prefers("drawer")
    with Memory(engine, tmp_path / "r.db", HashEmbedder(), progress_bar=False,
                reranker=rerank, rerank_candidates=8) as memory:
        memory.add(user_id="ann", texts=DISTRACTORS + [TARGET])
        found = memory.search(user_id="ann", query=QUERY, k=3)
        (query, texts), = calls
        assert query == QUERY and len(texts) == 8  # the 8 best candidates were scored
        assert found.facts[0].text == TARGET and len(found.hits) == 3
        scores = [s for _, s in found.hits]
        assert scores == sorted(scores, reverse=True) and scores[0] > 9  # the reranker's
        assert memory.counters["reranked_searches"] == 1
        # a read as of a date is not reranked; k=0 asks nothing
        assert memory.search(user_id="ann", query=QUERY, k=0).hits == ()
        memory.search(user_id="ann", query=QUERY, k=3, as_of="2999-01-01")
        assert len(calls) == 1


def test_a_failing_reranker_leaves_the_cosine_order_and_is_counted(engine, tmp_path):
    from inferscale_engine.memory import Memory

    def broken(query: str, texts: list[str]) -> list[float]:
        return [1.0]  # one score for many texts

    with Memory(engine, tmp_path / "f.db", HashEmbedder(), progress_bar=False,
                reranker=broken) as memory:
        memory.add(user_id="ann", texts=DISTRACTORS + [TARGET])
        plain = memory.search(user_id="ann", query=QUERY, k=3, search_mode="vector")
        assert memory.counters["rerank_failures"] == 1
        assert all(-1 <= s <= 1 for _, s in plain.hits) and len(plain.hits) == 3
    with pytest.raises(ConfigError, match="reranker must be a callable"):
        Memory(engine, tmp_path / "b.db", HashEmbedder(), progress_bar=False,
               reranker="cross-encoder")
    with pytest.raises(ConfigError, match="rerank_candidates"):
        Memory(engine, tmp_path / "c.db", HashEmbedder(), progress_bar=False,
               reranker=broken, rerank_candidates=0)


def test_excluded_facts_are_left_out_before_the_k_are_chosen(memory):
    memory.add(user_id="ann", texts=DISTRACTORS)
    (target,) = memory.add(user_id="ann", texts=[TARGET])
    three = memory.search(user_id="ann", query=QUERY, k=3).handle.fact_ids
    first = three[0]
    two = memory.search(user_id="ann", query=QUERY, k=2, exclude=[first]).handle.fact_ids
    assert first not in two and len(two) == 2
    assert set(two) == set(three) - {first}  # the same choice, one fewer
    assert target.fact_id in memory.search(user_id="ann", query=QUERY, k=3,
                                           exclude=[first]).handle.fact_ids
    # a request's recent facts are skipped the same way: k new facts, keywords' choice kept
    handle = memory.handle_for(user_id="ann", query=QUERY, k=2, recent=[first])
    assert handle.fact_ids[-1] == first and set(handle.fact_ids[:2]) == set(two)
    with pytest.raises(InvalidFactError, match="exclude"):
        memory.search(user_id="ann", query=QUERY, k=2, exclude=["x"])


def test_the_keyword_query_runs_once_while_the_vector_scan_is_pending(monkeypatch):
    """hybrid_search hands its keyword query to the scan (index.py hybrid_candidates): it runs
    once per search, before the scan's result is read, on every path of the scan (float32, the
    float16 scan and its fallback, an empty user). Up to SCORED_FETCH_ROWS rows the keyword
    matches' cosines come back in the scan's one transfer (no second one); beyond, or after
    the float16 scan, a second transfer reads them. The results are the same on every path."""
    from inferscale_engine.memory.search import user_index as user_index_module
    from inferscale_engine.memory.search.hybrid import hybrid_search
    from inferscale_engine.memory.search.index import RetrievalIndex
    from inferscale_engine.memory.search.user_index import UserIndex

    calls: list[str] = []
    fetch, scores = user_index_module.fetch, UserIndex.scores

    def recorded_fetch(*args):
        calls.append("fetch")
        return fetch(*args)

    def recorded_scores(self, *args):
        calls.append("scores")
        return scores(self, *args)

    monkeypatch.setattr(user_index_module, "fetch", recorded_fetch)
    monkeypatch.setattr(UserIndex, "scores", recorded_scores)
    vectors = torch.randn(80, 8, generator=torch.Generator().manual_seed(0))
    vectors[:, :3] = 0  # the other facts are orthogonal to the query
    vectors[:3] = torch.eye(8)[:3]
    vectors[1, 0] = -0.3  # "green pears" scores below them: only its keyword brings it in
    texts = ["red apples", "green pears", "blue plums"] + [f"fact {n}" for n in range(77)]
    query = torch.tensor([0.6, 0.0, 0.8, 0.0, 0.0, 0.0, 0.0, 0.0])
    results = []
    # float32 scan, every score fetched with it; float32 scan of more rows than that; float16
    # scan (80 rows > 2k + 64 candidates at k=5), which cannot prove its top 5 among the 77
    # facts tied at 0, then the float32 scan (search_scored's test has the float16 path)
    for half, scored_rows, transfers in ((0, 16_384, ["fetch"]), (0, 79, ["fetch", "scores"]),
                                         (2, 16_384, ["fetch", "fetch"])):
        monkeypatch.setattr(user_index_module, "SCORED_FETCH_ROWS", scored_rows)
        index = RetrievalIndex(device="cpu", half_scan_min_rows=half)
        index.add(user_id="u", fact_ids=list(range(1, 81)), embeddings=vectors, texts=texts)
        keyword_search = index._keywords.search

        def keywords(*args, search=keyword_search):
            calls.append("keywords")
            return search(*args)

        monkeypatch.setattr(index._keywords, "search", keywords)
        ranked, found_by = hybrid_search(index, "u", "green", query, k=5)
        assert calls == ["keywords", *transfers]
        assert 2 in found_by and found_by[2] == "keywords"
        results.append(ranked)
        calls.clear()
        assert hybrid_search(index, "nobody", "green", query, k=1) == ([], {})
        assert calls == ["keywords"]
        calls.clear()
    expected = [(f, pytest.approx(c, abs=1e-6)) for f, c in results[0]]
    assert results[1] == expected and results[2] == expected


def test_search_scored_reads_the_cosines_the_scan_computes(monkeypatch):
    """UserIndex.search_scored's cosines equal scores(), on each path; unknown ids left out."""
    from inferscale_engine.memory.search import user_index as user_index_module
    from inferscale_engine.memory.search.user_index import UserIndex

    vectors = torch.randn(300, 16, generator=torch.Generator().manual_seed(1))
    query = torch.randn(16, generator=torch.Generator().manual_seed(2))
    named = [5, 290, 77, 5, 10_000]  # a repeat and an id not indexed
    for half in (0, 1):
        for scored_rows in (16_384, 0):
            monkeypatch.setattr(user_index_module, "SCORED_FETCH_ROWS", scored_rows)
            index = UserIndex(16, half_scan_min_rows=half)
            index.add(list(range(300)), vectors)
            hits, cosines = index.search_scored(query, 7, lambda: named)
            assert hits == index.search(query, 7)
            expected = index.scores(query, [5, 290, 77])
            assert list(cosines) == [5, 290, 77]
            assert list(cosines.values()) == pytest.approx(expected, abs=1e-6)
            assert index.search_scored(query, 0, lambda: named)[0] == []
            assert list(index.search_scored(query, 0, lambda: named)[1]) == [5, 290, 77]
