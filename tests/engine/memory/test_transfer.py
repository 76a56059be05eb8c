"""Export and import (issue 57): a user's facts out as JSON Lines and back in, equal.

Over FakeRunner (no vLLM): what is checked is the store's rows (texts, metadata, times,
supersede chains, history), what search and answers serve after an import, and that a second
import adds nothing. The round trip runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import io
import json
import time

import pytest

from inferscale_engine.errors import InvalidRequestError
from inferscale_engine.memory import Memory
from inferscale_engine.memory.store.fact_store import FactStore
from tests.conftest import engine_config
from tests.engine.memory.memory_support import HashEmbedder
from tests.fake_runner import FakeRunner


@pytest.fixture(scope="module")
def engine(tiny_models):
    from inferscale_engine.runtime.engine import Engine

    with Engine(engine_config(tiny_models["qwen2"], context_window_tokens=32),
                runner=FakeRunner) as eng:
        yield eng


@pytest.fixture(params=["sqlite", "postgres"])
def new_db(request, tmp_path):
    """Makes fresh databases of one kind: SQLite files, or PostgreSQL databases."""
    if request.param == "sqlite":
        names = iter(range(100))
        yield lambda: str(tmp_path / f"memory-{next(names)}.db")
        return
    server = request.getfixturevalue("postgres_server")
    made = []

    def fresh() -> str:
        made.append(server.create_database())
        return server.url_for(made[-1])
    yield fresh
    for name in made:
        server.drop_database(name)


def open_memory(engine, db) -> Memory:
    return Memory(engine, db, HashEmbedder(), progress_bar=False)


def populate(memory: Memory, user: str) -> dict[str, int]:
    """Facts of every kind: a supersede chain, an edit, an expired one, a deleted one."""
    (boston,) = memory.add(user_id=user, texts=["Ann lives in Boston."], timestamp="2023-01-10",
                           metadata={"topic": "home", "rank": [1, 2]}, agent_id="planner",
                           run_id="r1", session_id="chat-1")
    lisbon = memory.supersede(user_id=user, fact_id=boston.fact_id, text="Ann moved to Lisbon.",
                              timestamp="2024-03-02")
    porto = memory.supersede(user_id=user, fact_id=lisbon.fact_id, text="Ann moved to Porto.",
                             timestamp="2025-05-01")
    (cat,) = memory.add(user_id=user, texts=["Ann's cat is called Miso."])
    memory.update(user_id=user, fact_id=cat.fact_id, text="Ann's cat is called Mochi.",
                  metadata={"kind": "pet"})
    (job,) = memory.add(user_id=user, texts=["Ann works at the harbour."])
    memory.supersede(user_id=user, fact_id=job.fact_id)  # just stopped being true
    (visa,) = memory.add(user_id=user, texts=["Ann's visa runs out."],
                         expiration_date=time.time() + 3600)
    (gone,) = memory.add(user_id=user, texts=["Ann's old phone number is 555-0100."])
    memory.delete(user_id=user, fact_ids=[gone.fact_id])
    memory.add(user_id=user, session_id="chat-2", messages=[
        {"role": "user", "content": "I started learning the cello."}])
    memory.add(user_id=user, texts=["Ann is vegetarian."], pinned=True)
    return {"boston": boston.fact_id, "lisbon": lisbon.fact_id, "porto": porto.fact_id,
            "cat": cat.fact_id, "job": job.fact_id, "visa": visa.fact_id}


def expire(db: str, user: str, fact_id: int) -> None:
    """Let a fact expire now (its row stays, hidden: on_expiry='hide')."""
    with FactStore(db) as store:
        assert store.set_expiry(user_id=user, fact_ids=[fact_id], expires_at=time.time() - 60)


def by_source(lines: list[str]) -> dict[str, dict]:
    """The export's facts by identity, ids replaced by identities (comparable across stores)."""
    header, *facts = [json.loads(line) for line in lines]
    assert header["format"] == "inferscale.memories" and header["num_facts"] == len(facts)
    sources = {f["id"]: f["source"] for f in facts}
    out = {}
    for fact in facts:
        fact = dict(fact, superseded_by=sources.get(fact["superseded_by"]))
        out[fact.pop("source")] = {k: v for k, v in fact.items() if k != "id"}
    return out


def test_export_then_import_gives_the_same_facts(engine, new_db):
    first, second = new_db(), new_db()
    with open_memory(engine, first) as memory:
        ids = populate(memory, "ann")
    expire(first, "ann", ids["visa"])
    with open_memory(engine, first) as memory:
        exported = list(memory.export(user_id="ann"))
    facts = by_source(exported)
    assert len(facts) == 8  # all but the deleted one: current, superseded, expired
    assert [f["text"] for f in facts.values() if f["pinned"]] == ["Ann is vegetarian."]
    texts = {f["text"]: f for f in facts.values()}
    boston, lisbon = texts["Ann lives in Boston."], texts["Ann moved to Lisbon."]
    assert boston["superseded_by"] == next(s for s, f in facts.items() if f is lisbon)
    assert boston["metadata"] == {"topic": "home", "rank": [1, 2]}
    assert (boston["agent_id"], boston["run_id"], boston["session_id"]) == (
        "planner", "r1", "chat-1")
    assert [e["event"] for e in boston["history"]] == ["ADD", "SUPERSEDE"]
    assert [e["event"] for e in texts["Ann's cat is called Mochi."]["history"]] == [
        "ADD", "UPDATE"]
    assert texts["Ann works at the harbour."]["valid_to"] is not None

    with open_memory(engine, second) as memory:
        result = memory.import_(user_id="ann", file=io.StringIO("".join(exported)))
        assert (result.format, result.num_records, result.num_skipped) == ("inferscale", 8, 0)
        assert len(result.fact_ids) == 8
        assert by_source(list(memory.export(user_id="ann"))) == facts  # pins included
        assert [memory.get(user_id="ann", fact_id=f).text
                for f in memory.pinned(user_id="ann")] == ["Ann is vegetarian."]
        current = {f.text for f in memory.get_all(user_id="ann")}
        assert current == {"Ann moved to Porto.", "Ann's cat is called Mochi.",
                           "I started learning the cello.", "Ann is vegetarian."}
        assert {f.text for f in memory.get_all(user_id="ann", as_of="2023-06-01")} >= {
            "Ann lives in Boston."}
        found = memory.search(user_id="ann", query="Where does Ann live?", k=10)
        assert "Ann moved to Porto." in [f.text for f in found.facts]
        assert not {"Ann lives in Boston.", "Ann's visa runs out."} & {
            f.text for f in found.facts}
        out = memory.generate(user_id="ann", query="Where does Ann live?", k=3)
        assert out.text == FakeRunner.ANSWER and out.plan_status == "inject"

        again = memory.import_(user_id="ann", file=io.StringIO("".join(exported)))
        assert (again.fact_ids, again.num_skipped) == ((), 8)
        own = memory.import_(user_id="ann", file=io.StringIO("".join(
            memory.export(user_id="ann"))))
        assert own.fact_ids == ()
        assert memory.stats().num_facts == 8


def test_a_users_own_export_imported_back_adds_nothing(engine, tmp_path):
    with open_memory(engine, tmp_path / "m.db") as memory:
        populate(memory, "bo")
        before = memory.stats().num_facts
        result = memory.import_(user_id="bo", file=io.StringIO("".join(
            memory.export(user_id="bo"))))
        assert result.fact_ids == () and memory.stats().num_facts == before
        copied = memory.import_(user_id="bo-copy", file=io.StringIO("".join(
            memory.export(user_id="bo"))))  # another user: a copy
        assert len(copied.fact_ids) == before


def test_a_bad_line_names_itself_and_nothing_is_imported(engine, tmp_path):
    with open_memory(engine, tmp_path / "m.db") as memory:
        memory.add(user_id="cy", texts=["Cy plays the oboe."])
        lines = list(memory.export(user_id="cy"))
        memory.add(user_id="cy", texts=["Cy has a red bike."])
        good = json.loads(lines[1])
        bad = [lines[0].replace('"num_facts": 1', '"num_facts": 3'), lines[1],
               json.dumps(dict(good, id=99, source="x", created_at="yesterday")) + "\n",
               json.dumps(dict(good, id=100, source="y")) + "\n"]
        with pytest.raises(InvalidRequestError, match=r"line 3: created_at='yesterday'"):
            memory.import_(user_id="dee", file=io.StringIO("".join(bad)))
        with pytest.raises(InvalidRequestError, match="line 2 is not JSON"):
            memory.import_(user_id="dee", file=io.StringIO(lines[0] + "{oops\n"))
        with pytest.raises(InvalidRequestError, match="says 3 facts but the file holds 1"):
            memory.import_(user_id="dee", file=io.StringIO(bad[0] + lines[1]))
        with pytest.raises(InvalidRequestError, match="no known format"):
            memory.import_(user_id="dee", file=io.StringIO('{"hello": 1}\n'))
        with pytest.raises(InvalidRequestError, match="max_fact_tokens|tokens"):
            memory.import_(user_id="dee", file=io.StringIO(json.dumps(
                {"id": "m1", "memory": "word " * 5000}) + "\n"))
        assert memory.get_all(user_id="dee") == []
