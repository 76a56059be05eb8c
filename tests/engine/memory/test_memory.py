"""Memory's verbs and errors on the real engine (tiny Qwen2 fixture, one engine per module).

Each test opens its own Memory (fresh SQLite file) over the shared engine; closing a Memory
makes the engine forget its facts, so the next test starts from an empty engine. The verbs'
tests also run once on a fresh PostgreSQL database (ON_POSTGRES), the store a URL selects.
"""

from __future__ import annotations

import json

import pytest

from inferscale_engine.errors import (
    ConfigError,
    EngineClosedError,
    FactNotFoundError,
    HandleError,
    InferScaleError,
    InvalidFactError,
    InvalidRequestError,
    InvalidTurnError,
    InvalidUserIdError,
)
from inferscale_engine.facts import MemoryHandle
from inferscale_engine.memory import Memory
from inferscale_engine.memory.store.fact_store import FactStore
from inferscale_engine.memory.store.reserved import CONTEXT_KEY
from inferscale_engine.memory.types import AddResult, SearchResult
from tests.conftest import FACTS, greedy, max_abs_diff
from tests.engine.memory.memory_support import HashEmbedder

pytestmark = pytest.mark.vllm

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "I adopted a turtle last week."},
    {"role": "assistant", "content": "Lovely! What is its name?"},
    {"role": "user", "content": "Its name is Shelly."},
    {"role": "assistant", "content": ""},
]


@pytest.fixture(scope="module")
def engine(module_engine):
    """The module's tiny engine (conftest.py), W=32."""
    return module_engine


@pytest.fixture()
def db(tmp_path, request):
    """A fresh SQLite file; or, parametrized with "postgres", a fresh PostgreSQL database."""
    if getattr(request, "param", "sqlite") == "postgres":
        return request.getfixturevalue("postgres_url")
    return str(tmp_path / "memory.db")


ON_POSTGRES = pytest.mark.parametrize("db", ["sqlite", "postgres"], indirect=True)
"""Run a test on SQLite and again on PostgreSQL (tests/pgserver.py)."""


@pytest.fixture()
def memory(engine, db):
    with Memory(engine, db, HashEmbedder(), progress_bar=False) as mem:
        yield mem


def generation(memory, user_id, handle, question="What do you know about me?"):
    return memory.generate(user_id=user_id, query=question, handle=handle, sampling=greedy(4))


# ---- verbs -----------------------------------------------------------------------------------
@ON_POSTGRES
def test_add_search_and_generate(memory):
    results = memory.add(user_id="alice", texts=FACTS[:4], metadata={"source": "test"})
    assert [r.event for r in results] == ["ADD"] * 4 and [r.text for r in results] == FACTS[:4]
    ids = [r.fact_id for r in results]
    assert ids == sorted(ids) and all(memory.engine.is_resident(i) for i in ids)
    found = memory.search(user_id="alice", query=FACTS[2], k=2)
    assert isinstance(found, SearchResult) and len(found.hits) == 2
    # hybrid (the default) chooses by keywords and cosine; the score is the cosine
    assert found.facts[0].fact_id == ids[2] and found.hits[0][1] == pytest.approx(1.0)
    assert found.hits[0][1] >= found.hits[1][1]
    cosine = memory.search(user_id="alice", query=FACTS[2], k=2, search_mode="vector")
    assert cosine.facts[0].fact_id == ids[2] and cosine.hits[0][1] == pytest.approx(1.0)
    assert found.handle == MemoryHandle("alice", tuple(f.fact_id for f in found.facts))
    assert memory.search(user_id="alice", query="x", k=0).hits == ()
    assert memory.search(user_id="nobody", query="x", k=3).handle == MemoryHandle("nobody", ())
    kv = memory.generate(user_id="alice", query="Who lives in Paris?", k=3, sampling=greedy(4))
    assert kv.plan_status == "inject" and kv.num_injected_tokens > 0
    text = memory.generate(user_id="alice", query="Who lives in Paris?", k=3,
                           sampling=greedy(4), mode="text")
    assert text.mode == "text" and text.num_prompt_tokens == kv.num_prompt_tokens
    stored = memory.get(user_id="alice", fact_id=ids[0])
    assert stored.text == FACTS[0] and stored.metadata == {"source": "test"}
    assert [f.fact_id for f in memory.get_all(user_id="alice")] == ids
    assert memory.get_all(user_id="nobody") == []
    stats = memory.stats()
    assert (stats.num_facts, stats.num_indexed, stats.num_resident) == (4, 4, 4)
    assert stats.counters["added"] == 4 and stats.engine.counters["requests_kv"] >= 1


def test_duplicates_are_reported_not_stored(memory):
    first = memory.add(user_id="u", texts=[FACTS[0]])[0]
    again = memory.add(user_id="u", texts=[FACTS[0], FACTS[1], "  " + FACTS[1] + " "])
    assert again[0] == AddResult(first.fact_id, FACTS[0], "DUPLICATE", again[0].similarity)
    assert again[0].similarity == pytest.approx(1.0)
    assert again[1].event == "ADD"
    assert again[2].event == "DUPLICATE" and again[2].fact_id == again[1].fact_id
    assert len(memory.get_all(user_id="u")) == 2
    assert memory.add(user_id="other", texts=[FACTS[0]])[0].event == "ADD"  # per user
    assert memory.stats().counters["duplicates"] == 2


def test_dedupe_can_be_disabled(engine, db):
    with Memory(engine, db, HashEmbedder(), dedupe_threshold=None, progress_bar=False) as mem:
        results = mem.add(user_id="u", texts=[FACTS[0], FACTS[0]])
        assert [r.event for r in results] == ["ADD", "ADD"]


def test_a_bad_half_scan_threshold_is_refused_before_the_store_opens(engine, tmp_path):
    db = tmp_path / "never.db"
    with pytest.raises(ConfigError, match="half_scan_min_rows"):
        Memory(engine, str(db), HashEmbedder(), half_scan_min_rows=-1)
    assert not db.exists()


def test_semantic_search_with_the_default_embedder(engine, db):
    with Memory(engine, db, dedupe_threshold=0.9, device="cpu", progress_bar=False) as mem:
        assert mem._embedder.name == "sentence-transformers/all-MiniLM-L6-v2"
        mem.add(user_id="u", texts=FACTS)
        top = mem.search(user_id="u", query="Which pet does Melanie have?", k=1).facts[0]
        assert top.text == FACTS[3]
        near = mem.add(user_id="u", texts=["Alice likes chess and lives in Paris!"])[0]
        assert near.event == "DUPLICATE" and near.similarity >= 0.9


def test_messages_become_turns_and_context_encoded_facts(memory, engine):
    results = memory.add(user_id="carol", session_id="s1", messages=CHAT)
    assert [r.text for r in results] == [m["content"] for m in CHAT[1:4]]
    turns = memory.turns(user_id="carol", session_id="s1")
    assert [(t.role, t.content) for t in turns] == [(m["role"], m["content"]) for m in CHAT]
    raw = memory._store.get(user_id="carol", fact_ids=[r.fact_id for r in results])
    assert raw[0].metadata[CONTEXT_KEY] == "system: Be brief.\n"
    assert raw[2].metadata[CONTEXT_KEY].endswith("assistant: Lovely! What is its name?\n")
    assert memory.get(user_id="carol", fact_id=results[2].fact_id).metadata == {}
    records = [engine._facts[r.fact_id] for r in results]
    assert all(r.context_ids for r in records)
    assert records[2].context_ids == engine.prompts.encode(raw[2].metadata[CONTEXT_KEY])[-32:]
    # A later call's facts are encoded after the turns already stored in the session.
    later = memory.add(user_id="carol", session_id="s1",
                       messages=[{"role": "user", "content": "Shelly likes lettuce."}])
    context = memory._store.get(user_id="carol", fact_ids=[later[0].fact_id])[0].metadata
    assert context[CONTEXT_KEY].endswith("user: Its name is Shelly.\nassistant: \n")
    assert memory.add_turns(user_id="carol", session_id="s2",
                            messages=[{"role": "user", "content": "hi"}])
    assert len(memory.turns(user_id="carol", session_id="s2")) == 1
    assert len(memory.get_all(user_id="carol")) == 4


@ON_POSTGRES
def test_restart_rebuilds_kv_with_the_same_context(engine, db):
    with Memory(engine, db, HashEmbedder(), progress_bar=False) as mem:
        ids = [r.fact_id for r in mem.add(user_id="carol", session_id="s1", messages=CHAT)]
        handle = MemoryHandle("carol", tuple(ids))
        before = generation(mem, "carol", handle)
    assert before.plan_status == "inject"
    with Memory(engine, db, HashEmbedder(), startup="lazy", progress_bar=False) as mem:
        # SQLite registers every fact at start, PostgreSQL (shared) each user on first use
        assert not any(i in engine._facts and engine.is_resident(i) for i in ids)
        lazy = generation(mem, "carol", handle)
        assert all(engine.is_resident(i) for i in ids)
    with Memory(engine, db, HashEmbedder(), startup="encode", progress_bar=False) as mem:
        assert all(engine.is_resident(i) for i in ids)
        assert mem.stats().counters["startup_facts"] == 3
        eager = generation(mem, "carol", handle)
    for after in (lazy, eager):
        assert after.plan_status == "inject" and after.token_ids == before.token_ids
        assert max_abs_diff(after.logprobs, before.logprobs) <= 1e-5


@ON_POSTGRES
def test_update_replaces_text_and_rebuilds_kv(memory, engine):
    ids = [r.fact_id for r in memory.add(user_id="dan", texts=FACTS[:2], metadata={"a": 1})]
    old_key = engine._facts[ids[0]].slab_key
    fact = memory.update(user_id="dan", fact_id=ids[0], text="Dan collects old maps.")
    assert fact.fact_id == ids[0] and fact.text == "Dan collects old maps."
    assert fact.token_ids == engine.prompts.fact_ids("Dan collects old maps.")
    assert engine.is_resident(ids[0]) and engine._facts[ids[0]].slab_key != old_key
    assert memory.get(user_id="dan", fact_id=ids[0]).metadata == {"a": 1}
    memory.update(user_id="dan", fact_id=ids[0], text="Dan collects maps.", metadata={"b": 2})
    assert memory.get(user_id="dan", fact_id=ids[0]).metadata == {"b": 2}
    assert memory.search(user_id="dan", query="Dan collects maps.", k=1).facts[0].fact_id == ids[0]
    _, plan = engine.prepare_request(MemoryHandle("dan", (ids[0],)), "hi")
    assert plan.segments[1].token_ids == engine.prompts.fact_ids("Dan collects maps.")
    assert generation(memory, "dan", MemoryHandle("dan", tuple(ids))).plan_status == "inject"


@ON_POSTGRES
def test_delete_and_reset(memory, engine):
    ids = [r.fact_id for r in memory.add(user_id="eve", texts=FACTS[:3])]
    other = memory.add(user_id="frank", texts=[FACTS[4]])[0].fact_id
    with pytest.raises(FactNotFoundError, match="get_all"):
        memory.delete(user_id="eve", fact_ids=[ids[0], 10_000])
    with pytest.raises(FactNotFoundError):
        memory.delete(user_id="eve", fact_ids=[other])
    assert len(memory.get_all(user_id="eve")) == 3  # all or nothing
    memory.delete(user_id="eve", fact_ids=[ids[0], ids[0]])
    with pytest.raises(FactNotFoundError):
        engine.is_resident(ids[0])
    assert [f.fact_id for f in memory.get_all(user_id="eve")] == ids[1:]
    assert ids[0] not in memory.search(user_id="eve", query=FACTS[0], k=5).handle.fact_ids
    memory.add(user_id="eve", messages=[{"role": "user", "content": "hello there"}])
    assert memory.reset(user_id="eve") == 3
    assert memory.get_all(user_id="eve") == [] and memory.turns(user_id="eve") == []
    assert memory.search(user_id="eve", query=FACTS[1], k=5).hits == ()
    assert memory.reset(user_id="eve") == 0
    assert [f.fact_id for f in memory.get_all(user_id="frank")] == [other]
    memory.delete(user_id="frank", fact_ids=[])


def test_another_users_facts_and_handles_are_refused(memory, engine):
    alice = [r.fact_id for r in memory.add(user_id="alice", texts=FACTS[:2])]
    memory.add(user_id="bob", texts=[FACTS[2]])
    stolen = MemoryHandle("alice", tuple(alice))
    with pytest.raises(HandleError, match="belongs to 'alice'"):
        memory.generate(user_id="bob", query="hi", handle=stolen)
    with pytest.raises(HandleError, match="does not belong"):
        engine.generate(MemoryHandle("bob", tuple(alice)), "hi", greedy(2))
    with pytest.raises(FactNotFoundError):
        memory.get(user_id="bob", fact_id=alice[0])
    with pytest.raises(FactNotFoundError):
        memory.update(user_id="bob", fact_id=alice[0], text="mine now")
    assert memory.get(user_id="alice", fact_id=alice[0]).text == FACTS[0]
    assert memory.stats().counters["foreign_handles"] == 1


# ---- bad input -------------------------------------------------------------------------------
BAD_CALLS = [
    ("add", dict(user_id="", texts=["x"]), InvalidUserIdError, "empty"),
    ("add", dict(user_id=7, texts=["x"]), InvalidUserIdError, "must be a str"),
    ("add", dict(user_id=b"u", texts=["x"]), InvalidUserIdError, "decode it first"),
    ("add", dict(user_id="u\udc80", texts=["x"]), InvalidUserIdError, "lone surrogate"),
    ("add", dict(user_id="u", texts="a fact"), InvalidFactError, "wrap a single item"),
    ("add", dict(user_id="u", texts=["ok", "  \n"]), InvalidFactError, "texts\\[1\\] is empty"),
    ("add", dict(user_id="u", texts=[b"bytes"]), InvalidFactError, "decode it first"),
    ("add", dict(user_id="u", texts=[3.5]), InvalidFactError, "must be a str"),
    ("add", dict(user_id="u", texts=["bad \ud800 text"]), InvalidFactError, "errors='replace'"),
    ("add", dict(user_id="u", texts=["word " * 400]), InvalidFactError, "max_fact_tokens"),
    ("add", dict(user_id="u"), InvalidRequestError, "exactly one of"),
    ("add", dict(user_id="u", texts=["x"], messages=[]), InvalidRequestError, "exactly one"),
    ("add", dict(user_id="u", texts=["x"], metadata=["m"]), InvalidFactError, "dict"),
    ("add", dict(user_id="u", texts=["x"], metadata={"f": float("nan")}), InvalidFactError,
     "JSON"),
    ("add", dict(user_id="u", texts=["x"], metadata={CONTEXT_KEY: "x"}), InvalidFactError,
     "reserved"),
    ("add", dict(user_id="u", texts=["x"], session_id=" "), InvalidTurnError, "empty"),
    ("add", dict(user_id="u", messages=[{"role": "robot", "content": "x"}]), InvalidTurnError,
     "role"),
    ("add", dict(user_id="u", messages=[{"role": "user", "content": None}]), InvalidTurnError,
     "content"),
    ("add", dict(user_id="u", messages={"role": "user"}), InvalidTurnError, "list"),
    ("search", dict(user_id="u", query=""), InvalidRequestError, "empty"),
    ("search", dict(user_id="u", query="q", k=-1), InvalidRequestError, "k=-1"),
    ("search", dict(user_id="u", query="q", k=True), InvalidRequestError, "k=True"),
    ("search", dict(user_id=None, query="q"), InvalidUserIdError, "user_id"),
    ("get", dict(user_id="u", fact_id="1"), InvalidFactError, "positive ints"),
    ("get", dict(user_id="u", fact_id=10_000), FactNotFoundError, "no fact"),
    ("delete", dict(user_id="u", fact_ids=5), InvalidFactError, "wrap a single item"),
    ("delete", dict(user_id="u", fact_ids=[True]), InvalidFactError, "positive ints"),
    ("delete", dict(user_id="u", fact_ids=[0]), InvalidFactError, "positive ints"),
    ("update", dict(user_id="u", fact_id=10_000, text="x"), FactNotFoundError, "no fact"),
    ("update", dict(user_id="u", fact_id=1, text=""), InvalidFactError, "empty"),
    ("generate", dict(user_id="u", query="q", mode="fast"), InvalidRequestError, "mode"),
    ("generate", dict(user_id="u", query="q", handle={"user_id": "u"}), HandleError, "handle"),
    ("turns", dict(user_id="u", limit=-1), InvalidTurnError, "limit"),
]


@pytest.mark.parametrize("verb,kwargs,error,message", BAD_CALLS,
                         ids=[f"{v}-{i}" for i, (v, *_) in enumerate(BAD_CALLS)])
def test_bad_input_raises_a_specific_error_and_changes_nothing(memory, verb, kwargs, error,
                                                               message):
    memory.add(user_id="u", texts=[FACTS[0]])
    before = memory.stats()
    with pytest.raises(error, match=message) as caught:
        getattr(memory, verb)(**kwargs)
    assert isinstance(caught.value, InferScaleError)
    after = memory.stats()
    assert (after.num_facts, after.num_indexed) == (before.num_facts, before.num_indexed)
    assert generation(memory, "u", memory.search(user_id="u", query="x", k=1).handle
                      ).plan_status == "inject"  # still serving


def test_a_failed_encoding_keeps_the_fact_and_encodes_it_on_first_use(memory, engine,
                                                                      monkeypatch):
    def broken(plans, prompts):
        raise RuntimeError("simulated worker failure")

    with monkeypatch.context() as patch:
        patch.setattr(engine._writer, "run_saves", broken)
        (result,) = memory.add(user_id="gina", texts=[FACTS[1]])
    assert result.event == "ADD" and not engine.is_resident(result.fact_id)
    assert memory.get(user_id="gina", fact_id=result.fact_id).text == FACTS[1]
    assert memory.stats().counters["encode_failures"] == 1
    out = memory.generate(user_id="gina", query=FACTS[1], k=1, sampling=greedy(2))
    assert out.plan_status == "inject" and engine.is_resident(result.fact_id)


def test_changed_embedder_or_tokenizer_recomputes_stored_data(engine, db):
    with Memory(engine, db, HashEmbedder(), progress_bar=False) as mem:
        ids = [r.fact_id for r in mem.add(user_id="u", texts=FACTS[:3])]
    with FactStore(db) as store:  # as if written under another tokenizer
        store.update(user_id="u", fact_id=ids[0], text=FACTS[0], token_ids=[1, 2],
                     embedding=store.get(user_id="u", fact_ids=[ids[0]])[0].embedding)
        fingerprint = json.loads(store.fingerprint())
        store.set_fingerprint(json.dumps({**fingerprint, "tokenizer": "another"}))
    with Memory(engine, db, HashEmbedder(dim=32), progress_bar=False) as mem:
        assert mem.stats().counters["startup_refreshed"] == 3
        stored = mem.get(user_id="u", fact_id=ids[0])
        assert stored.token_ids == engine.prompts.fact_ids(FACTS[0])
        assert stored.embedding_array().shape == (32,)
        assert mem.search(user_id="u", query=FACTS[2], k=1).facts[0].fact_id == ids[2]
        assert json.loads(mem._store.fingerprint())["tokenizer"] != "another"
    with Memory(engine, db, HashEmbedder(dim=32), progress_bar=False) as mem:
        assert "startup_refreshed" not in mem.stats().counters


def test_closed_memory_refuses_calls(engine, db):
    mem = Memory(engine, db, HashEmbedder(), progress_bar=False)
    fact_id = mem.add(user_id="u", texts=[FACTS[0]])[0].fact_id
    mem.close()
    mem.close()
    with pytest.raises(EngineClosedError, match="new Memory"):
        mem.search(user_id="u", query="x")
    with pytest.raises(FactNotFoundError):
        engine.is_resident(fact_id)  # the shared engine forgot the closed Memory's facts


def test_contexts_of_a_large_add_are_bounded(engine, db):
    # A fact added as text is encoded after the user's last `context_turns` facts, not after
    # every fact before it in the call (that made add() quadratic in the batch size).
    texts = [f"Fact number {i} is about item {i * 7}." for i in range(40)]
    with Memory(engine, db, HashEmbedder(), progress_bar=False, context_turns=4,
                dedupe_threshold=None) as mem:
        ids = [r.fact_id for r in mem.add(user_id="big", texts=texts)]
        stored = mem._store.get(user_id="big", fact_ids=ids)
    last = stored[-1].metadata[CONTEXT_KEY]
    assert last == "".join(f"- {t}\n" for t in texts[-5:-1])
    assert max(len(f.metadata[CONTEXT_KEY].splitlines()) for f in stored[1:]) == 4
