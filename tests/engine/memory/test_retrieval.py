"""Embedder (real offline MiniLM), UserIndex and RetrievalIndex (cosine top-k per user)."""

from __future__ import annotations

import math
import os
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from inferscale_engine.errors import (
    ConfigError,
    EmbedderError,
    FactNotFoundError,
    InvalidUserIdError,
    RetrievalError,
)
from inferscale_engine.memory.config import DEFAULT_EMBEDDING_MODEL
from inferscale_engine.memory.search.embedder import Embedder
from inferscale_engine.memory.search.index import RetrievalIndex
from inferscale_engine.memory.search.user_index import UserIndex

DIM = 4


# ---- Embedder ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def embedder():
    return Embedder(device="cpu", batch_size=8)


def test_embedder_constructs_without_loading():
    lazy = Embedder(device="cpu")
    assert lazy._model is None
    assert lazy.name == DEFAULT_EMBEDDING_MODEL and lazy.device == torch.device("cpu")


def test_embedder_dim_and_normalized_float32_rows(embedder):
    assert embedder.dim == 384
    vectors = embedder.encode(["Alice likes chess", "", "emoji 🧠 and 中文", "x " * 1000])
    assert vectors.shape == (4, 384) and vectors.dtype == torch.float32
    assert vectors.device == torch.device("cpu")
    torch.testing.assert_close(vectors.norm(dim=1), torch.ones(4))
    assert embedder.encode([]).shape == (0, 384)


def test_embedder_similarity_is_semantic(embedder):
    fact, question, other = embedder.encode(
        ["Alice likes chess", "Which game does Alice play?", "Bob owns a parrot"])
    assert float(fact @ question) > float(other @ question) + 0.2


def test_embedder_is_deterministic_across_batching(embedder):
    texts = [f"fact number {i} about topic {i % 3}" for i in range(11)]
    together = embedder.encode(texts)
    one_by_one = torch.cat([embedder.encode([t]) for t in texts])
    torch.testing.assert_close(together, one_by_one, atol=1e-5, rtol=1e-5)


def test_embedder_rejects_bad_input(embedder):
    with pytest.raises(RetrievalError, match="wrap a single item"):
        embedder.encode("Alice likes chess")
    with pytest.raises(RetrievalError, match=r"texts\[1\] must be a str, got int"):
        embedder.encode(["ok", 3])
    with pytest.raises(RetrievalError, match="lone surrogate"):
        embedder.encode(["bad \ud800"])


def test_embedder_config_errors_and_unloadable_model(tmp_path):
    with pytest.raises(ConfigError, match="batch_size"):
        Embedder(batch_size=0)
    with pytest.raises(ConfigError, match="device"):
        Embedder(device="not-a-device")
    with pytest.raises(ConfigError, match="model"):
        Embedder(model="")
    before = os.environ.get("HF_HUB_OFFLINE")
    missing = Embedder(str(tmp_path / "no-such-model"), device="cpu")
    with pytest.raises(EmbedderError, match="cannot load embedding model"):
        missing.encode(["x"])
    assert os.environ.get("HF_HUB_OFFLINE") == before


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=40) | st.text(alphabet="ab .,?é中🧠", min_size=200, max_size=3000))
def test_query_tokenizer_gives_what_preprocess_gives(embedder, text):
    """The query path's own Rust tokenizer copy is preprocess() for one text (incl. truncation)."""
    model = embedder._loaded()
    assert embedder._queries._tokenize.__name__ == "tokenize"  # the fast path is in use
    expected, got = model.preprocess([text]), embedder._queries._tokenize(text)
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        if isinstance(value, torch.Tensor):
            np.testing.assert_array_equal(value.numpy(), got[name])
        else:
            assert value == got[name]


def test_query_tokenizer_falls_back_to_preprocess_when_they_differ(embedder):
    from inferscale_engine.memory.search.embedder import _fast_tokenizer

    model = embedder._loaded()

    class Shifted:  # a model whose preprocess() differs from its tokenizer (e.g. a prompt)
        tokenizer, max_seq_length = model.tokenizer, model.max_seq_length

        def preprocess(self, texts):
            features = model.preprocess(["query: " + texts[0]])
            return features

    assert _fast_tokenizer(model) is not None
    assert _fast_tokenizer(Shifted()) is None
    assert _fast_tokenizer(object()) is None  # no tokenizer at all


# ---- UserIndex --------------------------------------------------------------------------------
def basis(*indices: int, scale: float = 1.0) -> torch.Tensor:
    """Rows scale * e_i: cosine scores against them are exact, so ties are exact too."""
    return torch.eye(DIM)[list(indices)] * scale


def test_search_ranks_by_cosine_and_returns_scores():
    index = UserIndex(DIM)
    index.add([10, 11, 12], basis(0, 1, 2, scale=3.0))  # scale is normalized away
    query = torch.tensor([0.8, 0.6, -0.1, 0.0])
    hits = index.search(query, 2)
    assert [h[0] for h in hits] == [10, 11]
    normalized = F.normalize(query, dim=0)
    assert hits[0][1] == pytest.approx(float(normalized[0]))
    assert index.search(query.unsqueeze(0), 2) == hits  # [1, dim] accepted too
    assert [h[0] for h in index.search(query, 99)] == [10, 11, 12]
    assert index.search(query, 0) == []
    assert index.nearest(query)[0] == 10
    assert UserIndex(DIM).nearest(query) is None and UserIndex(DIM).search(query, 3) == []


def test_similar_many_equals_search_row_by_row():
    index = UserIndex(DIM)
    generator = torch.Generator().manual_seed(3)
    index.add(list(range(1, 601)), torch.randn(600, DIM, generator=generator))
    queries = torch.randn(300, DIM, generator=generator)  # more rows than one chunk
    many = index.similar_many(queries, threshold=-1.0, limit=3)
    assert len(many) == 300
    for query, similar in zip(queries, many, strict=True):
        expected = index.search(query, 3)
        assert [f for f, _ in similar] == [f for f, _ in expected]
        assert [s for _, s in similar] == pytest.approx([s for _, s in expected], abs=1e-6)
    above = index.similar_many(queries, threshold=0.99, limit=5)
    assert all(s >= 0.99 for row in above for _, s in row)
    assert sum(map(len, above)) < 5 * 300  # the threshold cut some
    assert UserIndex(DIM).similar_many(queries[:2], 0.0, 4) == [[], []]
    with pytest.raises(RetrievalError):
        index.similar_many(torch.zeros(1, DIM), 0.0, 4)


def test_ties_break_by_fact_id_including_at_the_cut():
    index = UserIndex(DIM)
    index.add([40, 7, 25, 3, 99], basis(0, 0, 1, 0, 1))
    query = torch.tensor([1.0, 1.0, 0.0, 0.0])
    assert [h[0] for h in index.search(query, 5)] == [3, 7, 25, 40, 99]
    assert [h[0] for h in index.search(torch.tensor([1.0, 0.0, 0.0, 0.0]), 2)] == [3, 7]


def test_add_replaces_existing_ids_and_rejects_bad_input():
    index = UserIndex(DIM)
    index.add([1, 2], basis(0, 1))
    index.add(np.array([2, 3]), np.eye(DIM)[[0, 2]])  # 2 moves to e_0, 3 is new
    assert len(index) == 3 and index.fact_ids() == [1, 2, 3]
    assert [h[0] for h in index.search(basis(0)[0], 2)] == [1, 2]
    for fact_ids, embeddings, message in [
        ([5, 5], basis(0, 1), "repeat an id"),
        ([5], basis(0, 1), r"shape \(2, 4\), expected \(1, 4\)"),
        ([5], torch.ones(1, DIM + 1), "expected"),
        ([5], torch.zeros(1, DIM), "all-zero"),
        ([5], torch.full((1, DIM), math.nan), "NaN"),
        ([5], [["a"] * DIM], "not a float matrix"),
        (["5"], basis(0), "not an int"),
        ([True], basis(0), "not an int"),
    ]:
        with pytest.raises(RetrievalError, match=message):
            index.add(fact_ids, embeddings)
    assert index.fact_ids() == [1, 2, 3]
    with pytest.raises(RetrievalError, match="k=-1"):
        index.search(basis(0)[0], -1)
    with pytest.raises(RetrievalError, match="query_embedding"):
        index.search(torch.ones(DIM + 1), 1)


def test_capacity_doubles_and_removal_fills_holes():
    index = UserIndex(DIM, initial_capacity=4)
    capacities = []
    for fact_id in range(1, 20):
        index.add([fact_id], basis(fact_id % DIM))
        capacities.append(index.capacity)
    assert sorted(set(capacities)) == [4, 8, 16, 32]
    index.add(range(100, 200), torch.randn(100, DIM))
    assert index.capacity == 119
    with pytest.raises(FactNotFoundError, match="555"):
        index.remove([1, 555])
    assert len(index) == 119
    removed = set(range(1, 20, 2)) | set(range(150, 200))
    index.remove(sorted(removed, reverse=True))
    assert index.fact_ids() == sorted((set(range(1, 20)) | set(range(100, 200))) - removed)
    query = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert [h[0] for h in index.search(query, 3)] == [4, 8, 12]
    index.remove(index.fact_ids())
    assert len(index) == 0 and index.search(query, 5) == []


# ---- RetrievalIndex ---------------------------------------------------------------------------
def test_users_are_isolated_and_unknown_users_get_nothing():
    index = RetrievalIndex(device="cpu")
    index.add(user_id="alice", fact_ids=[1, 2], embeddings=basis(0, 1))
    index.add(user_id="bob", fact_ids=[3], embeddings=basis(0))
    query = basis(0)[0]
    assert index.search(user_id="bob", query_embedding=query, k=10) == [(3, 1.0)]
    assert [h[0] for h in index.search(user_id="alice", query_embedding=query, k=10)] == [1, 2]
    assert index.search(user_id="carol", query_embedding=query, k=10) == []
    assert index.nearest(user_id="carol", embedding=query) is None
    assert index.nearest(user_id="alice", embedding=basis(1)[0]) == (2, 1.0)
    assert index.similar_many(user_id="alice", embeddings=basis(1, 0), threshold=0.5) == [
        [(2, 1.0)], [(1, 1.0)]]
    assert index.similar_many(user_id="carol", embeddings=basis(0, 1), threshold=0.5) == [[], []]
    assert index.users() == ["alice", "bob"] and index.count() == 3
    with pytest.raises(FactNotFoundError):
        index.remove(user_id="alice", fact_ids=[3])  # bob's id
    with pytest.raises(FactNotFoundError):
        index.remove(user_id="carol", fact_ids=[1])
    index.remove(user_id="bob", fact_ids=[3])
    assert index.users() == ["alice"]  # emptied users are dropped
    index.drop_user(user_id="alice")
    index.drop_user(user_id="never-there")
    assert index.users() == [] and index.count() == 0


def test_dimension_is_fixed_by_the_first_add():
    index = RetrievalIndex(device="cpu")
    with pytest.raises(RetrievalError, match="pass \\[num_facts, dim\\]"):
        index.add(user_id="u", fact_ids=[1], embeddings=[1.0, 0.0])
    index.add(user_id="u", fact_ids=[1], embeddings=[[1.0, 0.0]])
    with pytest.raises(RetrievalError, match="expected"):
        index.add(user_id="v", fact_ids=[2], embeddings=[[1.0, 0.0, 0.0]])
    with pytest.raises(InvalidUserIdError):
        index.search(user_id="", query_embedding=[1.0, 0.0], k=1)
    index.add(user_id="u", fact_ids=[], embeddings=[])
    assert index.users() == ["u"] and index.count(user_id="u") == 1


def test_concurrent_adds_and_searches():
    index = RetrievalIndex(dim=DIM, device="cpu")
    errors = []

    def work(n: int) -> None:
        try:
            for i in range(30):
                index.add(user_id=f"u{n}", fact_ids=[n * 1000 + i], embeddings=torch.randn(1, DIM))
                index.search(user_id=f"u{n}", query_embedding=torch.randn(DIM), k=5)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and index.count() == 180
    for n in range(6):
        hits = index.search(user_id=f"u{n}", query_embedding=torch.randn(DIM), k=100)
        assert sorted(h[0] for h in hits) == [n * 1000 + i for i in range(30)]


def test_embedder_and_index_together(embedder):
    index = RetrievalIndex(device="cpu")
    facts = ["Alice likes chess", "Alice lives in Paris", "Alice has a sister"]
    index.add(user_id="alice", fact_ids=[1, 2, 3], embeddings=embedder.encode(facts))
    index.add(user_id="bob", fact_ids=[4], embeddings=embedder.encode(["Bob plays chess daily"]))
    query = embedder.encode(["Which game does Alice play?"])[0]
    hits = index.search(user_id="alice", query_embedding=query, k=2)
    assert hits[0][0] == 1 and all(h[0] != 4 for h in hits)
    duplicate = index.nearest(user_id="alice", embedding=embedder.encode(["Alice likes chess"]))
    assert duplicate[0] == 1 and duplicate[1] > 0.99


# ---- model-based: random add / remove / search sequences ---------------------------------------
OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.sampled_from("ab"),
              st.lists(st.tuples(st.integers(1, 16), st.integers(0, DIM - 1),
                                 st.sampled_from([1.0, -1.0, 0.5, 4.0])),
                       min_size=1, max_size=6, unique_by=lambda t: t[0])),
    st.tuples(st.just("remove"), st.sampled_from("ab"),
              st.tuples(st.lists(st.integers(0, 99), max_size=4), st.booleans())),
    st.tuples(st.just("search"), st.sampled_from("abc"),
              st.tuples(st.lists(st.integers(-3, 3), min_size=DIM, max_size=DIM)
                        .filter(any), st.integers(0, 12))),
), max_size=30)


@settings(max_examples=150, deadline=None)
@given(ops=OPS)
def test_random_sequences_match_a_brute_force_model(ops):
    """Stored rows are +-scale * e_j, so every cosine is exactly +-q_j/|q| and ties are exact:
    the index must equal a sort by (-score, fact id)."""
    index = RetrievalIndex(dim=DIM, device="cpu")
    model: dict[str, dict[int, torch.Tensor]] = {"a": {}, "b": {}}
    for op, user_id, arg in ops:
        owned_elsewhere = {f for u, facts in model.items() if u != user_id for f in facts}
        if op == "add":
            items = [(f, j, s) for f, j, s in arg if f not in owned_elsewhere]  # ids are global
            if items:
                index.add(user_id=user_id, fact_ids=[f for f, _, _ in items],
                          embeddings=torch.stack([basis(j, scale=s)[0] for _, j, s in items]))
                model[user_id].update({f: F.normalize(basis(j, scale=s)[0], dim=0)
                                       for f, j, s in items})
        elif op == "remove":  # picks index the user's ids; `unknown` adds an id they lack
            picks, unknown = arg
            owned = sorted(model[user_id])
            fact_ids = [owned[p % len(owned)] for p in picks] if owned else []
            if unknown:
                with pytest.raises(FactNotFoundError):
                    index.remove(user_id=user_id, fact_ids=[*fact_ids, 999])
            elif fact_ids:
                index.remove(user_id=user_id, fact_ids=fact_ids)
                for fact_id in set(fact_ids):
                    del model[user_id][fact_id]
        else:
            components, k = arg
            query = torch.tensor(components, dtype=torch.float32)
            normalized = F.normalize(query, dim=0)
            expected = sorted(((f, float(v @ normalized)) for f, v in
                               model.get(user_id, {}).items()), key=lambda h: (-h[1], h[0]))[:k]
            assert index.search(user_id=user_id, query_embedding=query, k=k) == expected
        for name, facts in model.items():
            assert index.count(user_id=name) == len(facts)
    assert index.users() == sorted(u for u, facts in model.items() if facts)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), num_facts=st.integers(1, 300), k=st.integers(1, 20))
def test_random_vectors_agree_with_numpy(seed, num_facts, k):
    generator = np.random.default_rng(seed)
    vectors = generator.standard_normal((num_facts, 16)).astype(np.float32)
    query = generator.standard_normal(16).astype(np.float32)
    fact_ids = generator.permutation(10 * num_facts)[:num_facts] + 1
    index = UserIndex(16)
    index.add(fact_ids.tolist(), vectors)
    normed = vectors.astype(np.float64) / np.linalg.norm(vectors, axis=1, keepdims=True)
    scores = normed @ (query / np.linalg.norm(query))
    hits = index.search(torch.from_numpy(query), k)
    assert len(hits) == min(k, num_facts)
    expected = np.sort(scores)[::-1][:len(hits)]
    np.testing.assert_allclose([h[1] for h in hits], expected, atol=1e-5)
    by_id = dict(zip(fact_ids.tolist(), scores, strict=True))
    np.testing.assert_allclose([by_id[f] for f, _ in hits], expected, atol=1e-5)


# ---- float16 scan (by default from HALF_SCAN_MIN_ROWS rows; forced here) -----------------------
def _twin_indexes(vectors: np.ndarray, fact_ids: list[int]) -> tuple[UserIndex, UserIndex]:
    plain, half = UserIndex(vectors.shape[1]), UserIndex(vectors.shape[1], half_scan_min_rows=1)
    plain.add(fact_ids, vectors)
    half.add(fact_ids, vectors)
    assert plain._half is None and half._half is not None
    return plain, half


def _assert_same_hits(got, expected, index: UserIndex, query):
    """The float32 scan's hits up to float32 rounding: the same scores position by position, and
    each returned fact truly scores that (facts closer than rounding may swap places)."""
    assert len(got) == len(expected)
    np.testing.assert_allclose([s for _, s in got], [s for _, s in expected], atol=1e-6)
    rows = torch.tensor([index._row_of[f] for f, _ in got], dtype=torch.long)
    unit = F.normalize(torch.as_tensor(query, dtype=torch.float64), dim=0)
    true = index._embeddings[rows].double() @ unit
    np.testing.assert_allclose(true.numpy(), [s for _, s in expected], atol=1e-6)
    beyond = plain_scores(index, query, len(expected) + 1)
    if all(a - b > 1e-5 for a, b in zip(beyond, beyond[1:])):  # no near-ties: the same order
        assert [f for f, _ in got] == [f for f, _ in expected]


def plain_scores(index: UserIndex, query, n: int) -> list[float]:
    """The n best float64 scores of the index's rows (a reference without any index code)."""
    unit = F.normalize(torch.as_tensor(query, dtype=torch.float64), dim=0)
    scores = index._embeddings[:len(index)].double() @ unit
    return scores.topk(min(n, len(index))).values.tolist()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), num_facts=st.integers(1, 600), k=st.integers(1, 40),
       copies=st.integers(0, 30))
def test_half_scan_returns_the_float32_scans_hits(seed, num_facts, k, copies):
    """Same ids in the same order as a float32 scan, also with exact ties (repeated vectors)
    and near-ties (a cluster around the query: the float16 candidates cannot prove the cut and
    the search falls back to float32)."""
    generator = np.random.default_rng(seed)
    vectors = generator.standard_normal((num_facts, 32)).astype(np.float32)
    query = generator.standard_normal(32).astype(np.float32)
    repeated = vectors[generator.integers(0, num_facts, copies)]
    near = query + 1e-4 * generator.standard_normal((copies * 4, 32)).astype(np.float32)
    vectors = np.concatenate([vectors, repeated, near])
    fact_ids = (generator.permutation(10 * len(vectors))[:len(vectors)] + 1).tolist()
    plain, half = _twin_indexes(vectors, fact_ids)
    _assert_same_hits(half.search(torch.from_numpy(query), k),
                      plain.search(torch.from_numpy(query), k), half, query)


def test_half_scan_answers_without_the_float32_scan_when_the_cut_is_clear():
    generator = np.random.default_rng(0)
    vectors = generator.standard_normal((4000, 64)).astype(np.float32)
    plain, half = _twin_indexes(vectors, list(range(1, 4001)))
    query = torch.from_numpy(generator.standard_normal(64).astype(np.float32))
    found = half._search_half(F.normalize(query, dim=0), torch.tensor(1.0), 10, 84)
    assert found is not None  # proven: random vectors leave a gap wider than the error bound
    _assert_same_hits(found, plain.search(query, 10), half, query)


def test_half_scan_falls_back_on_a_cluster_at_the_cut():
    generator = np.random.default_rng(1)
    query = generator.standard_normal(64).astype(np.float32)
    cluster = query + 1e-4 * generator.standard_normal((300, 64)).astype(np.float32)
    vectors = np.concatenate([generator.standard_normal((1000, 64)).astype(np.float32), cluster])
    plain, half = _twin_indexes(vectors, list(range(1, 1301)))
    unit = F.normalize(torch.from_numpy(query), dim=0)
    assert half._search_half(unit, torch.tensor(1.0), 10, 84) is None  # cut not provable
    _assert_same_hits(half.search(torch.from_numpy(query), 10),
                      plain.search(torch.from_numpy(query), 10), half, query)


def test_half_copies_follow_adds_replacements_removals_and_growth():
    generator = np.random.default_rng(2)
    index = UserIndex(8, initial_capacity=2, half_scan_min_rows=50)
    index.add(list(range(40)), generator.standard_normal((40, 8)))
    assert index._half is None  # below the threshold: float32 only
    index.add(list(range(30, 130)), generator.standard_normal((100, 8)))  # replaces 10, grows
    assert index._half is not None
    index.remove(list(range(0, 130, 3)))
    index.add(list(range(200, 260)), generator.standard_normal((60, 8)))
    live = len(index)
    assert index._half.shape == index._embeddings.shape
    torch.testing.assert_close(index._half[:live], index._embeddings[:live].half(), rtol=0, atol=0)
    query = torch.from_numpy(generator.standard_normal(8))
    plain = UserIndex(8)
    plain.add(list(index._row_fact_ids), index._embeddings[:live])
    _assert_same_hits(index.search(query, 7), plain.search(query, 7), index, query)


def test_half_scan_rejects_a_bad_query_like_the_float32_scan():
    _, half = _twin_indexes(np.eye(200, 16, dtype=np.float32) + 0.5, list(range(200)))
    for bad in (torch.zeros(16), torch.full((16,), float("nan"))):
        with pytest.raises(RetrievalError, match="NaN, inf or an all-zero"):
            half.search(bad, 3)


def test_half_copies_start_at_the_devices_threshold():
    from inferscale_engine.memory.search.user_index import HALF_SCAN_MIN_ROWS

    index = UserIndex(4)
    rows = HALF_SCAN_MIN_ROWS["cpu"]
    index.add(list(range(rows - 1)), torch.rand(rows - 1, 4) + 0.1)
    assert index._half is None
    index.add([rows], torch.rand(1, 4) + 0.1)
    assert index._half is not None and UserIndex(4, device="meta")._half_scan_min_rows == 0


def test_every_users_index_takes_the_configured_threshold_and_a_bad_one_is_refused():
    vectors = torch.rand(6, 4) + 0.1
    never, early = (RetrievalIndex(device="cpu", half_scan_min_rows=rows) for rows in (0, 3))
    for index in (never, early):
        for user in ("alice", "bob"):
            index.add(user_id=user, fact_ids=range(6), embeddings=vectors)
    assert all(u._half is None for u in never._users.values())
    assert all(u._half is not None for u in early._users.values())
    query = torch.rand(4)
    assert [f for f, _ in never.search(user_id="bob", query_embedding=query, k=3)] == [
        f for f, _ in early.search(user_id="bob", query_embedding=query, k=3)]
    for bad in (-1, True, 2.0, "8"):
        with pytest.raises(ConfigError, match="half_scan_min_rows"):
            RetrievalIndex(device="cpu", half_scan_min_rows=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="half_scan_min_rows"):
            UserIndex(4, half_scan_min_rows=bad)  # type: ignore[arg-type]
