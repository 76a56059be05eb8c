"""FactStore: round trips, validation, user isolation, transactions, migrations, durability.

Every test that takes `store` or `target` runs twice: on SQLite and on a fresh PostgreSQL
database (tests/pgserver.py). Tests of SQLite's own machinery (pragmas, files that are not
databases, migrations of old files) say so and run on SQLite only; test_store_postgres.py
holds PostgreSQL's own (several processes, lost connections, URLs).
"""

from __future__ import annotations

import math
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from inferscale_engine.checks import has_visible
from inferscale_engine.errors import (
    ConfigError,
    FactNotFoundError,
    InferScaleError,
    InvalidFactError,
    InvalidRequestError,
    InvalidTurnError,
    InvalidUserIdError,
    StoreError,
)
from inferscale_engine.facts import Fact
from inferscale_engine.memory.store import schema
from inferscale_engine.memory.store.fact_store import FactStore
from inferscale_engine.memory.store.records import StoredFact, Turn

REPO_ROOT = Path(__file__).resolve().parents[3]
SCHEMA_VERSION = 6


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request) -> str:
    return request.param


@pytest.fixture
def target(backend, tmp_path, request) -> str:
    """Where the test's database lives: a SQLite file, or a fresh PostgreSQL database."""
    if backend == "sqlite":
        return str(tmp_path / "facts.db")
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def store(backend, request):
    """A FactStore on ':memory:' (SQLite) or on a fresh PostgreSQL database."""
    where = ":memory:" if backend == "sqlite" else request.getfixturevalue("postgres_url")
    with FactStore(where) as fact_store:
        yield fact_store


def add(fact_store: FactStore, user_id: str, texts: list[str], **kwargs) -> list[int]:
    """add_facts with made-up token ids and 3-d embeddings."""
    return fact_store.add_facts(
        user_id=user_id, texts=texts, token_ids=[[len(t), 7] for t in texts],
        embeddings=[[1.0, float(i), -0.5] for i in range(len(texts))], **kwargs)


# ---- round trips -----------------------------------------------------------------------------
def test_add_and_get_round_trip(store):
    ids = store.add_facts(
        user_id="alice", session_id="s1", texts=["Alice likes chess", "Alice lives in Paris"],
        token_ids=[np.array([5, 6, 7]), torch.tensor([2**31 - 1, 0])],
        embeddings=torch.tensor([[0.6, 0.8], [1.0, 0.0]]),
        metadata=[{"source": "chat", "tags": ["game"]}, None])
    assert ids == sorted(ids) and len(set(ids)) == 2
    first, second = store.get(user_id="alice", fact_ids=[ids[1], ids[0]])[::-1]
    assert isinstance(first, StoredFact)
    assert (first.fact_id, first.user_id, first.session_id) == (ids[0], "alice", "s1")
    assert first.text == "Alice likes chess" and first.token_ids == (5, 6, 7)
    assert second.token_ids == (2**31 - 1, 0)
    np.testing.assert_array_equal(first.embedding_array(), np.array([0.6, 0.8], np.float32))
    assert first.embedding == np.array([0.6, 0.8], "<f4").tobytes()
    assert first.metadata == {"source": "chat", "tags": ["game"]} and second.metadata == {}
    assert first.created_at == first.updated_at > 0
    assert first.to_fact() == Fact(ids[0], "alice", "Alice likes chess", (5, 6, 7))
    assert store.get_all(user_id="alice") == [first, second]


def test_embedding_inputs_bytes_numpy_list_are_equivalent(store):
    vector = np.array([0.25, -1.5, 3.0], np.float32)
    ids = store.add_facts(user_id="u", texts=["a", "b", "c"], token_ids=[[1], [2], [3]],
                          embeddings=[vector.tobytes(), vector.astype(np.float64),
                                      vector.tolist()])
    embeddings = {f.embedding for f in store.get(user_id="u", fact_ids=ids)}
    assert embeddings == {vector.tobytes()}


def test_metadata_dict_applies_to_every_fact(store):
    ids = add(store, "u", ["a", "b"], metadata={"source": "import"})
    assert [f.metadata for f in store.get(user_id="u", fact_ids=ids)] == [{"source": "import"}] * 2


def test_unusual_text_round_trips(store):
    texts = ["nul\x00inside", "emoji 🧠 and 中文", "  padded  ", "line\nbreak", "é" * 10_000,
             "x\uffff", "\uffff0 \uffff\uffff\x00", "a\x00\uffff", "% ? %s $1 ' \\"]
    ids = add(store, "ü-user", texts, session_id="s\x00\uffff", metadata={"k": "v\x00"})
    facts = store.get(user_id="ü-user", fact_ids=ids)
    assert [f.text for f in facts] == texts and facts[0].session_id == "s\x00\uffff"
    assert facts[0].metadata == {"k": "v\x00"}
    assert store.recent_facts(user_id="ü-user", session_id="s\x00\uffff") == facts
    store.add_turns(user_id="ü-user", session_id="s\x00", turns=[("user", "a\x00\uffffb")])
    assert [t.content for t in store.recent_turns(user_id="ü-user", session_id="s\x00")] == [
        "a\x00\uffffb"]
    store.update(user_id="ü-user", fact_id=ids[0], text="new\x00", token_ids=[1],
                 embedding=[1.0, 0.0, 0.0])
    assert [(e.old_text, e.new_text) for e in store.history(user_id="ü-user", fact_id=ids[0])
            ] == [(None, texts[0]), (texts[0], "new\x00")]
    store.set_fingerprint("fp\x00\uffff")
    assert store.fingerprint() == "fp\x00\uffff"


def test_empty_add_returns_nothing(store):
    assert store.add_facts(user_id="u", texts=[], token_ids=[], embeddings=[]) == []
    assert store.count() == 0


# ---- validation ------------------------------------------------------------------------------
GOOD = dict(user_id="u", texts=["a fact"], token_ids=[[1, 2]], embeddings=[[0.1, 0.2]])
BAD_CALLS = [
    (dict(user_id=5), InvalidUserIdError, "user_id must be a str"),
    (dict(user_id="  "), InvalidUserIdError, "user_id is empty"),
    (dict(user_id="u\udcff"), InvalidUserIdError, "lone surrogate"),
    (dict(texts="a fact"), InvalidFactError, "wrap a single item"),
    (dict(texts=[""]), InvalidFactError, "texts[0] is empty"),
    (dict(texts=[b"bytes"]), InvalidFactError, "texts[0] is bytes, not text"),
    (dict(texts=["bad \ud800 text"]), InvalidFactError, "a lone surrogate at index 4"),
    (dict(token_ids=[[1], [2]]), InvalidFactError, "2 token_ids for 1 facts"),
    (dict(token_ids=[[]]), InvalidFactError, "token_ids[0] is empty"),
    (dict(token_ids=[[1, -3]]), InvalidFactError, "token_ids[0] holds -3"),
    (dict(token_ids=[[1.5]]), InvalidFactError, "token_ids[0] holds 1.5"),
    (dict(token_ids=[[True]]), InvalidFactError, "token_ids[0] holds True"),
    (dict(token_ids=[[2**31]]), InvalidFactError, "token ids are ints in"),
    (dict(token_ids=["abc"]), InvalidFactError, "token_ids[0] must be a list of ints"),
    (dict(embeddings=[]), InvalidFactError, "0 embeddings for 1 facts"),
    (dict(embeddings=[[0.1, math.nan]]), InvalidFactError, "NaN or inf"),
    (dict(embeddings=[[[0.1, 0.2]]]), InvalidFactError, "has shape (1, 2)"),
    (dict(embeddings=[["x", "y"]]), InvalidFactError, "not a vector of floats"),
    (dict(embeddings=[b"abc"]), InvalidFactError, "not a whole number of float32"),
    (dict(texts=["a", "b"], token_ids=[[1], [2]], embeddings=[[0.1], [0.1, 0.2]]),
     InvalidFactError, "different dimensions [1, 2]"),
    (dict(metadata={"when": object()}), InvalidFactError, "not JSON-serializable"),
    (dict(metadata={"x": math.inf}), InvalidFactError, "not JSON-serializable"),
    (dict(metadata={1: "a"}), InvalidFactError, "string keys"),
    (dict(metadata=[{}, {}]), InvalidFactError, "2 metadata for 1 facts"),
    (dict(session_id=3), InvalidFactError, "session_id must be a str"),
]


@pytest.mark.parametrize(("override", "error", "message"), BAD_CALLS)
def test_invalid_add_raises_specific_error_and_stores_nothing(store, override, error, message):
    with pytest.raises(error, match=None) as info:
        store.add_facts(**{**GOOD, **override})
    assert message in str(info.value)
    assert isinstance(info.value, InferScaleError | ValueError)
    assert store.count() == 0


def test_bad_fact_ids_are_rejected(store):
    with pytest.raises(InvalidFactError, match="wrap a single item"):
        store.get(user_id="u", fact_ids=3)
    with pytest.raises(InvalidFactError, match="positive ints"):
        store.delete(user_id="u", fact_ids=["1"])
    with pytest.raises(InvalidFactError, match="positive ints"):
        store.get(user_id="u", fact_ids=[True])


def test_bad_config_is_rejected(tmp_path):
    """SQLite's options and files (PostgreSQL's URLs: test_store_postgres.py)."""
    with pytest.raises(ConfigError, match="synchronous='SOMETIMES'"):
        FactStore(":memory:", synchronous="SOMETIMES")
    with pytest.raises(ConfigError, match="busy_timeout_ms"):
        FactStore(":memory:", busy_timeout_ms=-1)
    with pytest.raises(StoreError, match="cannot open fact database"):
        FactStore(tmp_path / "missing-folder" / "facts.db")
    not_a_db = tmp_path / "notes.txt"
    not_a_db.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not an InferScale database|cannot open"):
        FactStore(not_a_db)


# ---- user isolation and deletes --------------------------------------------------------------
def test_other_users_ids_count_as_not_found(store):
    alice = add(store, "alice", ["a1", "a2"])
    bob = add(store, "bob", ["b1"])
    with pytest.raises(FactNotFoundError, match=rf"\[{bob[0]}\]") as info:
        store.get(user_id="alice", fact_ids=[alice[0], bob[0]])
    assert isinstance(info.value, KeyError) and "'alice'" in str(info.value)
    with pytest.raises(FactNotFoundError):
        store.delete(user_id="alice", fact_ids=[bob[0]])
    with pytest.raises(FactNotFoundError):
        store.update(user_id="alice", fact_id=bob[0], text="stolen", token_ids=[1],
                     embedding=[1.0, 0.0, 0.0])
    assert [f.text for f in store.get_all(user_id="bob")] == ["b1"]
    assert [f.fact_id for f in store.get_all(user_id="alice")] == alice


def test_delete_is_all_or_nothing(store):
    ids = add(store, "u", ["a", "b", "c"])
    with pytest.raises(FactNotFoundError, match="999"):
        store.delete(user_id="u", fact_ids=[ids[0], 999])
    assert store.count(user_id="u") == 3
    store.delete(user_id="u", fact_ids=(ids[0], ids[2], ids[0]))
    assert [f.text for f in store.get_all(user_id="u")] == ["b"]
    with pytest.raises(FactNotFoundError):
        store.get(user_id="u", fact_ids=[ids[0]])


def test_ids_are_never_reused(store):
    ids = add(store, "u", ["a", "b"])
    store.delete(user_id="u", fact_ids=ids)
    store.reset(user_id="u")
    assert add(store, "u", ["c"])[0] > max(ids)


def test_update_replaces_content_and_keeps_or_replaces_metadata(store):
    (fact_id,) = add(store, "u", ["old"], metadata={"v": 1}, session_id="s")
    updated = store.update(user_id="u", fact_id=fact_id, text="new", token_ids=[9, 9],
                           embedding=np.array([0.0, 1.0, 0.0]))
    assert (updated.text, updated.token_ids, updated.metadata) == ("new", (9, 9), {"v": 1})
    assert updated.session_id == "s" and updated.updated_at >= updated.created_at
    assert updated.embedding_array().tolist() == [0.0, 1.0, 0.0]
    again = store.update(user_id="u", fact_id=fact_id, text="newer", token_ids=[1],
                         embedding=updated.embedding, metadata={"v": 2})
    assert again.metadata == {"v": 2}
    assert store.get(user_id="u", fact_ids=[fact_id]) == [again]
    with pytest.raises(InvalidFactError):
        store.update(user_id="u", fact_id=fact_id, text="", token_ids=[1], embedding=[1.0])
    assert store.get(user_id="u", fact_ids=[fact_id]) == [again]


def test_reset_deletes_only_that_users_facts_and_turns(store):
    alice = add(store, "alice", ["a1", "a2"])
    add(store, "bob", ["b1"])
    store.add_turns(user_id="alice", session_id="s", turns=[("user", "hi")])
    store.add_turns(user_id="bob", session_id="s", turns=[("user", "yo")])
    assert store.reset(user_id="alice") == alice
    assert store.count(user_id="alice") == 0 and store.count() == 1
    assert store.recent_turns(user_id="alice", session_id="s") == []
    assert [t.content for t in store.recent_turns(user_id="bob", session_id="s")] == ["yo"]
    assert store.users() == ["bob"]
    assert store.reset(user_id="nobody") == []


# ---- turns, users, iteration, meta -----------------------------------------------------------
def test_turns_per_session_in_chronological_order(store):
    store.add_turns(user_id="u", session_id="s1", turns=[("user", "q1"), ("assistant", "a1")])
    store.add_turns(user_id="u", session_id="s2", turns=[("user", "other session")])
    ids = store.add_turns(user_id="u", session_id="s1", turns=[("user", "q2"), ("assistant", "")])
    store.add_turns(user_id="u", session_id=None, turns=[("user", "no session")])
    recent = store.recent_turns(user_id="u", session_id="s1", limit=3)
    assert all(isinstance(t, Turn) for t in recent)
    assert [(t.role, t.content) for t in recent] == [("assistant", "a1"), ("user", "q2"),
                                                     ("assistant", "")]
    assert recent[-1].turn_id == ids[-1] and recent[0].session_id == "s1"
    assert [t.content for t in store.recent_turns(user_id="u", session_id=None)] == ["no session"]
    assert store.recent_turns(user_id="someone", session_id="s1") == []
    assert store.recent_turns(user_id="u", session_id="s1", limit=0) == []
    sessions = store.sessions(user_id="u")  # the most recently active first
    assert [(s.session_id, s.num_turns) for s in sessions] == [(None, 1), ("s1", 4), ("s2", 1)]
    assert sessions[1].first_at <= sessions[1].last_at
    assert store.sessions(user_id="someone") == []


@pytest.mark.parametrize(("turns", "message"), [
    ("hello", "wrap a single item"),
    ([("user",)], "pass (role, content) pairs"),
    ([("", "x")], "a role is one of"),
    ([("user", 5)], "content must be a str"),
    ([("user", "\udc80")], "lone surrogate"),
])
def test_invalid_turns_are_rejected(store, turns, message):
    with pytest.raises(InvalidTurnError, match=None) as info:
        store.add_turns(user_id="u", session_id="s", turns=turns)
    assert message in str(info.value)
    with pytest.raises(InvalidTurnError, match="limit"):
        store.recent_turns(user_id="u", session_id="s", limit=-1)
    assert store.recent_turns(user_id="u", session_id="s") == []


def test_facts_and_their_turns_are_written_in_one_transaction(store):
    turns = [("user", "I adopted a turtle."), ("assistant", "")]
    ids = store.add_facts(user_id="u", session_id="s", texts=["I adopted a turtle."],
                          token_ids=[[1, 2]], embeddings=[[1.0, 0.0]], turns=turns)
    assert [(t.role, t.content) for t in store.recent_turns(user_id="u", session_id="s")] == turns
    with pytest.raises(InvalidFactError):  # a bad fact: its turns are not written either
        store.add_facts(user_id="u", session_id="s", texts=["x"], token_ids=[[1]],
                        embeddings=[[float("nan"), 0.0]], turns=[("user", "x")])
    with pytest.raises(InvalidTurnError):  # a bad turn: no fact is written
        store.add_facts(user_id="u", session_id="s", texts=["y"], token_ids=[[1]],
                        embeddings=[[1.0, 0.0]], turns=[("user",)])
    assert store.count() == len(ids) == 1
    assert len(store.recent_turns(user_id="u", session_id="s")) == 2


def test_users_count_and_iter_all(store):
    ids = add(store, "b", ["b1", "b2"]) + add(store, "a", ["a1"]) + add(store, "c", ["c1", "c2"])
    store.add_turns(user_id="d", session_id="s", turns=[("user", "only turns")])
    assert store.users() == ["a", "b", "c", "d"]
    assert (store.count(), store.count(user_id="c"), store.count(user_id="d")) == (5, 2, 0)
    batches = list(store.iter_all(batch_size=2))
    assert [len(b) for b in batches] == [2, 2, 1]
    assert [f.fact_id for b in batches for f in b] == ids
    assert list(FactStore(":memory:").iter_all()) == []
    with pytest.raises(ConfigError):
        next(store.iter_all(batch_size=0))


def test_fingerprint_persists(target):
    with FactStore(target) as first:
        assert first.fingerprint() is None
        first.set_fingerprint("model=llama-3|tokenizer=abc")
        first.set_fingerprint("model=qwen2|tokenizer=def")
    with FactStore(target) as second:
        assert second.fingerprint() == "model=qwen2|tokenizer=def"
        with pytest.raises(ConfigError):
            second.set_fingerprint("")


# ---- database level --------------------------------------------------------------------------
def test_pragmas_and_schema(tmp_path):
    """SQLite only: its pragmas and file layout."""
    path = tmp_path / "facts.db"
    with FactStore(path) as fact_store:
        assert (fact_store.shared, fact_store.path) == (False, str(path))
        conn = fact_store._db._conn
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
        assert fact_store.schema_version == SCHEMA_VERSION
    with FactStore(path, synchronous="normal", busy_timeout_ms=250) as fact_store:
        assert fact_store._db._conn.execute("PRAGMA synchronous").fetchone()[0] == 1
    raw = sqlite3.connect(path)
    tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"facts", "turns", "meta", "history", "user_versions"} <= tables
    indexes = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"facts_user_id", "turns_session"} <= indexes
    raw.close()


def test_a_new_database_and_the_folders_made_for_it_are_private(tmp_path):
    """SQLite only: facts are readable by their owner alone (file, -wal and -shm 0600; the
    folders open_store makes 0700); an existing folder keeps its mode."""
    from inferscale_engine.memory.store import open_store

    def mode(path: Path) -> int:
        return path.stat().st_mode & 0o777

    umask = os.umask(0o022)  # the usual umask, under which SQLite makes files 0644
    os.chmod(tmp_path, 0o755)
    try:
        path = tmp_path / "home" / ".inferscale" / "facts.db"
        with open_store(str(path)) as fact_store:
            add(fact_store, "u", ["a private fact"])
            written = [path, path.with_name("facts.db-wal"), path.with_name("facts.db-shm")]
            assert [mode(p) for p in written] == [0o600] * 3
        assert mode(path.parent) == mode(path.parent.parent) == 0o700
        assert mode(tmp_path) == 0o755 and mode(path) == 0o600
        with FactStore(tmp_path / "plain.db") as fact_store:  # a FactStore of its own, too
            add(fact_store, "u", ["x"])
        assert mode(tmp_path / "plain.db") == 0o600
    finally:
        os.umask(umask)


def test_data_survives_reopen_and_content_hash_is_set(target):
    with FactStore(target) as fact_store:
        ids = add(fact_store, "u", ["persisted"])
    with FactStore(target) as fact_store:
        assert [f.text for f in fact_store.get(user_id="u", fact_ids=ids)] == ["persisted"]
        with fact_store._db.reading("test") as db:
            (content_hash,) = db.execute("SELECT content_hash FROM facts").fetchone()
    assert len(content_hash) == 64


def test_migration_hook_upgrades_once_and_newer_schema_is_refused(target, monkeypatch):
    with FactStore(target) as fact_store:
        add(fact_store, "u", ["before upgrade"])
    calls = []

    def add_priority(db) -> None:
        calls.append(1)
        db.execute("ALTER TABLE facts ADD COLUMN priority INTEGER NOT NULL DEFAULT 0")

    monkeypatch.setattr(schema, "_MIGRATIONS", [*schema._MIGRATIONS, add_priority])
    with FactStore(target) as fact_store:
        assert fact_store.schema_version == SCHEMA_VERSION + 1
        assert [f.text for f in fact_store.get_all(user_id="u")] == ["before upgrade"]
    with FactStore(target) as fact_store:
        assert fact_store.schema_version == SCHEMA_VERSION + 1
    assert calls == [1]
    monkeypatch.undo()
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}, newer than"):
        FactStore(target)


def test_a_version_1_store_gets_nfc_user_ids(tmp_path, monkeypatch):
    """SQLite only: a file written by a version-1 InferScale upgrades to the current schema."""
    path = tmp_path / "v1.db"
    with monkeypatch.context() as patch:
        patch.setattr(schema, "_MIGRATIONS", schema._MIGRATIONS[:1])
        FactStore(path).close()
    raw = sqlite3.connect(path)
    blob = np.asarray([1, 2], dtype="<i4").tobytes()
    for user in ("cafe\u0301", "caf\u00e9"):
        raw.execute("INSERT INTO facts (user_id, text, token_ids, embedding, created_at, "
                    "updated_at, content_hash) VALUES (?, 't', ?, ?, 0, 0, '')",
                    (user, blob, np.ones(3, dtype="<f4").tobytes()))
    raw.execute("INSERT INTO turns (user_id, role, content, created_at) VALUES "
                "('cafe\u0301', 'user', 'hi', 0)")
    raw.commit()
    raw.close()
    with FactStore(path) as fact_store:
        assert fact_store.schema_version == SCHEMA_VERSION
        assert len(fact_store.get_all(user_id="caf\u00e9")) == 2
        # version 3 gave every stored fact its ADD event
        assert [e.event for e in fact_store.history(user_id="caf\u00e9", fact_id=1)] == ["ADD"]
        assert fact_store.users() == ["caf\u00e9"]
        assert [t.content for t in fact_store.recent_turns(user_id="cafe\u0301",
                                                           session_id=None, limit=5)] == ["hi"]


BOOM_TRIGGER = {
    "sqlite": ["CREATE TRIGGER boom BEFORE INSERT ON facts WHEN NEW.text = 'boom' "
               "BEGIN SELECT RAISE(ABORT, 'boom trigger'); END"],
    "postgres": ["CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                 "IF NEW.text = 'boom' THEN RAISE EXCEPTION 'boom trigger'; END IF; "
                 "RETURN NEW; END $$",
                 "CREATE TRIGGER boom BEFORE INSERT ON facts FOR EACH ROW EXECUTE FUNCTION boom()"],
}


def test_failure_inside_the_transaction_rolls_back_the_whole_call(store, backend):
    with store._db.transaction("test") as db:
        for statement in BOOM_TRIGGER[backend]:
            db.execute(statement)
    version = store.user_version("u")
    with pytest.raises(StoreError, match="nothing was written: boom trigger"):
        add(store, "u", ["first", "boom", "third"], turns=[("user", "hi")])
    assert store.count() == 0 and store.recent_turns(user_id="u", session_id=None) == []
    assert store.user_version("u") == version
    assert len(add(store, "u", ["first", "third"])) == 2


def test_closed_store_raises(target):
    fact_store = FactStore(target)
    fact_store.close()
    fact_store.close()
    with pytest.raises(StoreError, match="is closed"):
        fact_store.count()
    with pytest.raises(StoreError, match="is closed"):
        add(fact_store, "u", ["x"])


def test_concurrent_writers_and_readers(target, backend):
    """Threads share one store; a second store on the same database waits on its locks."""
    options = {"synchronous": "NORMAL"} if backend == "sqlite" else {}
    fact_store = FactStore(target, **options)
    other_store = FactStore(target, **options)
    errors: list[BaseException] = []
    results: dict[str, list[int]] = {}

    def work(user_id: str) -> None:
        writer = other_store if user_id in ("user0", "user1") else fact_store
        try:
            ids = []
            for i in range(15):
                ids += add(writer, user_id, [f"{user_id}-{i}"])
                fact_store.get_all(user_id=user_id)
                fact_store.count()
            results[user_id] = ids
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(f"user{n}",)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    all_ids = [i for ids in results.values() for i in ids]
    assert len(set(all_ids)) == 90 == fact_store.count()
    for user_id, ids in results.items():
        assert [f.text for f in fact_store.get(user_id=user_id, fact_ids=ids)] == [
            f"{user_id}-{i}" for i in range(15)]
        assert other_store.user_version(user_id) == 15
    fact_store.close()
    other_store.close()


# ---- durability under SIGKILL ------------------------------------------------------------------
CHILD = """
import sys
from inferscale_engine.memory.store.fact_store import FactStore

store = FactStore(sys.argv[1])
batch = int(sys.argv[2])
n = 0
while True:
    texts = [f"fact number {n + j}" for j in range(batch)]
    ids = store.add_facts(user_id="crash", texts=texts,
                          token_ids=[[n + j + 1] for j in range(batch)],
                          embeddings=[[1.0, float(n + j)] for j in range(batch)])
    for fact_id, text in zip(ids, texts):
        print(fact_id, text, flush=True)
    n += batch
"""


@pytest.mark.parametrize("batch", [1, 25])
def test_acknowledged_facts_survive_sigkill(target, batch):
    """Every id printed after add_facts() returned is stored after a SIGKILL of the writer; no
    call is half applied (count is a multiple of the batch size)."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, target, str(batch)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO_ROOT)
    try:
        lines = []
        while len(lines) < 3 * batch + 10:
            line = proc.stdout.readline()
            assert line, f"child died early: {proc.stderr.read()}"
            lines.append(line)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        lines += proc.stdout.read().split("\n")[:-1]  # drop a partial last line
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    acknowledged = {int(fact_id): text for fact_id, text in
                    (line.rstrip("\n").split(" ", 1) for line in lines)}
    with FactStore(target) as reopened:
        stored = reopened.get(user_id="crash", fact_ids=list(acknowledged))
        assert {f.fact_id: f.text for f in stored} == acknowledged
        assert reopened.count() % batch == 0
        assert reopened.count() >= len(acknowledged)
        every = reopened.get_all(user_id="crash")
        assert [f.text for f in every] == [f"fact number {i}" for i in range(len(every))]


# ---- model-based: random operation sequences ---------------------------------------------------
USERS = st.sampled_from(["alice", "bob", "carol"])
TEXTS = st.text(min_size=1, max_size=12).filter(has_visible)


class StoreMachine(RuleBasedStateMachine):
    """Random add / update / delete / reset sequences against a dict model."""

    def __init__(self, target: str = ":memory:") -> None:
        super().__init__()
        self.store = FactStore(target)
        if target != ":memory:":  # one database for every example: start each from empty
            with self.store._db.transaction("test") as db:
                for table in ("facts", "turns", "history", "user_versions"):
                    db.execute(f"DELETE FROM {table}")
        self.model: dict[int, tuple[str, str, tuple[int, ...]]] = {}  # id -> user, text, tokens

    def ids_of(self, user_id: str) -> list[int]:
        return sorted(i for i, (u, _, _) in self.model.items() if u == user_id)

    @rule(user_id=USERS, texts=st.lists(TEXTS, min_size=1, max_size=3),
          token=st.integers(0, 2**31 - 1))
    def add_facts(self, user_id, texts, token):
        ids = self.store.add_facts(user_id=user_id, texts=texts,
                                   token_ids=[[token, len(t)] for t in texts],
                                   embeddings=[[1.0, float(len(t))] for t in texts])
        assert not set(ids) & set(self.model) and ids == sorted(ids)
        for fact_id, text in zip(ids, texts, strict=True):
            self.model[fact_id] = (user_id, text, (token, len(text)))

    @precondition(lambda self: self.model)
    @rule(data=st.data(), text=TEXTS)
    def update(self, data, text):
        fact_id = data.draw(st.sampled_from(sorted(self.model)))
        user_id = data.draw(USERS)
        if self.model[fact_id][0] != user_id:
            with pytest.raises(FactNotFoundError):
                self.store.update(user_id=user_id, fact_id=fact_id, text=text, token_ids=[1],
                                  embedding=[0.0, 1.0])
            return
        self.store.update(user_id=user_id, fact_id=fact_id, text=text, token_ids=[1],
                          embedding=[0.0, 1.0])
        self.model[fact_id] = (user_id, text, (1,))

    @rule(data=st.data(), user_id=USERS)
    def delete(self, data, user_id):
        candidates = sorted(self.model) + [10_000]
        fact_ids = data.draw(st.lists(st.sampled_from(candidates), max_size=3))
        if all(self.model.get(i, ("",))[0] == user_id for i in fact_ids):
            self.store.delete(user_id=user_id, fact_ids=fact_ids)
            for fact_id in fact_ids:
                self.model.pop(fact_id, None)
        else:
            with pytest.raises(FactNotFoundError):
                self.store.delete(user_id=user_id, fact_ids=fact_ids)

    @rule(user_id=USERS)
    def reset(self, user_id):
        assert self.store.reset(user_id=user_id) == self.ids_of(user_id)
        self.model = {i: v for i, v in self.model.items() if v[0] != user_id}

    @invariant()
    def matches_model(self):
        for user_id in ("alice", "bob", "carol"):
            facts = self.store.get_all(user_id=user_id)
            assert [f.fact_id for f in facts] == self.ids_of(user_id)
            assert [(f.user_id, f.text, f.token_ids) for f in facts] == [
                self.model[i] for i in self.ids_of(user_id)]
        assert self.store.count() == len(self.model)
        assert self.store.users() == sorted({u for u, _, _ in self.model.values()})

    def teardown(self) -> None:
        self.store.close()


def test_store_matches_model(backend, request):
    target = ":memory:" if backend == "sqlite" else request.getfixturevalue("postgres_url")
    run_state_machine_as_test(lambda: StoreMachine(target), settings=settings(
        max_examples=40, stateful_step_count=15, deadline=None,
        suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow]))


def test_history_records_every_change_in_its_transaction_and_reset_erases_it(store):
    (first, second) = add(store, "hist", ["I live in Boston.", "I like tea."])
    store.update(user_id="hist", fact_id=first, text="I moved to Lisbon.", token_ids=[1],
                      embedding=[1.0, 0.0, 0.0])
    store.delete(user_id="hist", fact_ids=[second])
    events = [(e.event, e.old_text, e.new_text)
              for e in store.history(user_id="hist", fact_id=first)]
    assert events == [("ADD", None, "I live in Boston."),
                      ("UPDATE", "I live in Boston.", "I moved to Lisbon.")]
    assert [(e.event, e.old_text) for e in store.history(user_id="hist", fact_id=second)
            ] == [("ADD", None), ("DELETE", "I like tea.")]
    assert store.history(user_id="someone-else", fact_id=first) == []
    with pytest.raises(FactNotFoundError):  # a failed update records nothing
        store.update(user_id="someone-else", fact_id=first, text="x", token_ids=[1],
                          embedding=[1.0, 0.0, 0.0])
    assert len(store.history(user_id="hist", fact_id=first)) == 2
    store.reset(user_id="hist")
    assert store.history(user_id="hist", fact_id=first) == []


# ---- time on facts: validity, superseding, expiry -------------------------------------------
def test_superseded_facts_stay_with_their_interval_and_the_chain_in_history(store):
    old, other = add(store, "tim", ["Tim lives in Boston.", "Tim likes tea."],
                     valid_from=[1000.0, None])
    (new,) = add(store, "tim", ["Tim moved to Lisbon."], valid_from=2000.0)
    before = store.user_version("tim")
    assert store.supersede(user_id="tim", fact_ids=[old], by=new) == [old]
    assert store.user_version("tim") > before
    stored = {f.fact_id: f for f in store.get_all(user_id="tim")}
    assert (stored[old].valid_from, stored[old].valid_to, stored[old].superseded_by) == (
        1000.0, 2000.0, new)  # stopped when the newer fact began
    assert stored[other].valid_from is None and stored[other].since == stored[other].created_at
    assert stored[new].valid_to is None and stored[new].superseded_by is None
    # as of a date: which facts were true then
    assert stored[old].current(1500.0) and not stored[new].current(1500.0)
    assert not stored[old].current(2500.0) and stored[new].current(2500.0)
    assert not stored[old].current(999.0)
    item = stored[old].to_item()
    assert (item.valid_from, item.valid_to, item.superseded_by) == (1000.0, 2000.0, new)
    assert [(e.event, e.old_text, e.new_text) for e in store.history(user_id="tim", fact_id=old)
            ] == [("ADD", None, "Tim lives in Boston."),
                  ("SUPERSEDE", "Tim lives in Boston.", "Tim moved to Lisbon.")]
    # superseding again changes nothing; an explicit time wins
    assert store.supersede(user_id="tim", fact_ids=[old], by=new) == []
    assert store.supersede(user_id="tim", fact_ids=[other], by=new, at=1234.5) == [other]
    assert store.get(user_id="tim", fact_ids=[other])[0].valid_to == 1234.5


def test_supersede_refuses_foreign_unknown_and_self_and_changes_nothing(store):
    (mine,) = add(store, "ann", ["Ann works at Acme."])
    (theirs,) = add(store, "bob", ["Bob works at Initech."])
    (newer,) = add(store, "ann", ["Ann works at Globex."])
    with pytest.raises(FactNotFoundError):
        store.supersede(user_id="ann", fact_ids=[mine, theirs], by=newer)
    with pytest.raises(FactNotFoundError):
        store.supersede(user_id="ann", fact_ids=[mine], by=theirs)
    with pytest.raises(InvalidRequestError, match="cannot supersede itself"):
        store.supersede(user_id="ann", fact_ids=[mine, newer], by=newer)
    assert all(f.valid_to is None for f in store.get_all(user_id="ann") + store.get_all(
        user_id="bob"))
    assert [e.event for e in store.history(user_id="ann", fact_id=mine)] == ["ADD"]


def test_expiry_is_stored_listed_in_order_and_a_sweep_records_expire(store):
    soon, later, never = add(store, "eve", ["a", "b", "c"], expires_at=[100.0, 200.0, None])
    (other,) = add(store, "zed", ["z"], expires_at=50.0)
    assert store.expired(now=10.0) == []
    assert store.expired(now=150.0) == [("zed", other), ("eve", soon)]
    assert store.expired(now=1e12, limit=1) == [("zed", other)]
    fact, kept = store.get(user_id="eve", fact_ids=[soon, never])
    assert fact.expires_at == 100.0 and not fact.current(time.time())  # expired long ago
    assert kept.expires_at is None and kept.current(time.time())
    store.delete(user_id="eve", fact_ids=[soon], event="EXPIRE")
    assert [e.event for e in store.history(user_id="eve", fact_id=soon)] == ["ADD", "EXPIRE"]
    assert store.expired(now=150.0) == [("zed", other)]
    with pytest.raises(InvalidRequestError, match="DELETE or EXPIRE"):
        store.delete(user_id="eve", fact_ids=[later], event="FORGET")
    assert len(store.get_all(user_id="eve")) == 2


@pytest.mark.parametrize(("field", "value"), [("valid_from", "yesterday"), ("expires_at", True),
                                              ("valid_from", float("nan")),
                                              ("expires_at", [1.0])])
def test_bad_times_are_refused_and_nothing_is_stored(store, field, value):
    with pytest.raises(InvalidFactError, match=field):
        add(store, "bad", ["x", "y"], **{field: value})
    assert store.count(user_id="bad") == 0


def test_a_pending_fact_is_marked(store):
    (fact,) = add(store, "pat", ["later"], pending=True)
    assert store.get(user_id="pat", fact_ids=[fact])[0].pending


# ---- per-user versions (how replicas sharing a database notice each other's writes) ----------
def test_user_version_grows_with_every_change_of_the_users_facts(target):
    with FactStore(target) as writer, FactStore(target) as reader:
        assert reader.user_version("u") == 0 == reader.user_version("never written")
        seen = [reader.user_version("u")]

        def changed() -> bool:
            seen.append(reader.user_version("u"))  # another store sees each commit
            return seen[-1] > seen[-2]

        ids = add(writer, "u", ["a", "b", "c"])
        assert changed()
        writer.update(user_id="u", fact_id=ids[0], text="a2", token_ids=[1],
                      embedding=[1.0, 0.0, 0.0])
        assert changed()
        writer.delete(user_id="u", fact_ids=[ids[1]])
        assert changed()
        writer.reset(user_id="u")
        assert changed()
        # calls that change none of the user's facts leave the version alone
        with pytest.raises(FactNotFoundError):
            writer.delete(user_id="u", fact_ids=[ids[2]])
        with pytest.raises(FactNotFoundError):
            writer.update(user_id="u", fact_id=ids[0], text="x", token_ids=[1], embedding=[1.0])
        with pytest.raises(InvalidFactError):
            add(writer, "u", [""])
        writer.add_turns(user_id="u", session_id="s", turns=[("user", "hi")])
        writer.add_facts(user_id="u", texts=[], token_ids=[], embeddings=[])
        writer.delete(user_id="u", fact_ids=[])
        add(writer, "other", ["o"])
        assert not changed()
        assert reader.user_version("cafe\u0301") == reader.user_version("caf\u00e9") == 0
        add(writer, "caf\u00e9", ["x"])
        assert reader.user_version("cafe\u0301") == 1  # NFC, like every user id
    with pytest.raises(InvalidUserIdError):
        FactStore(target).user_version(" ")


def test_shared_and_path_name_the_database(backend, target):
    with FactStore(target) as fact_store:
        assert fact_store.shared is (backend == "postgres")
        assert fact_store.path == target
        assert isinstance(fact_store, FactStore)


# ---- pinned facts --------------------------------------------------------------------------
def test_pinned_is_stored_set_per_current_fact_and_cleared_by_supersede(store):
    plain, kept = add(store, "ann", ["Ann has a cat.", "Ann is vegetarian."])
    (pinned,) = add(store, "ann", ["Ann's name is Ann Lee."], pinned=True)
    (theirs,) = add(store, "bo", ["Bo has a dog."])
    (due,) = add(store, "ann", ["Ann's flight is today."], expires_at=1.0)
    flags = {f.fact_id: f.pinned for f in store.get_all(user_id="ann")}
    assert flags == {plain: False, kept: False, pinned: True, due: False}
    assert store.get(user_id="ann", fact_ids=[pinned])[0].to_item().pinned
    before = store.user_version("ann")
    assert store.set_pinned(user_id="ann", fact_ids=[kept, pinned], pinned=True) == [kept]
    assert store.user_version("ann") > before
    assert store.set_pinned(user_id="ann", fact_ids=[kept], pinned=True) == []  # again: none
    for foreign in ([plain, theirs], [10**9], [due]):  # another user's, unknown, expired
        with pytest.raises(FactNotFoundError):
            store.set_pinned(user_id="ann", fact_ids=foreign, pinned=True)
    assert not store.get(user_id="ann", fact_ids=[plain])[0].pinned  # all or nothing
    (newer,) = add(store, "ann", ["Ann is vegan."])
    assert store.supersede(user_id="ann", fact_ids=[kept], by=newer) == [kept]
    assert not store.get(user_id="ann", fact_ids=[kept])[0].pinned
    with pytest.raises(FactNotFoundError):
        store.set_pinned(user_id="ann", fact_ids=[kept], pinned=True)
    assert store.set_pinned(user_id="ann", fact_ids=[pinned], pinned=False) == [pinned]
    assert not any(f.pinned for f in store.get_all(user_id="ann"))
