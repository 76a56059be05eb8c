"""Backup and restore (issue 57): a store and its disk tier, restored onto fresh folders.

The disk tier test runs the real engine (tiny Llama, vLLM on the CPU), as only a real worker
writes and loads entries: the restored store and tier serve the same facts (search, answers)
without encoding any, and a restore without the tier encodes exactly the current facts. The
database procedures (SQLite's online backup API, pg_dump / pg_restore) run over FakeRunner.
"""

from __future__ import annotations

import json
import shutil

import pytest

from inferscale_engine.errors import ConfigError
from inferscale_engine.memory import Memory
from inferscale_engine.memory.backup import backup, restore
from tests.conftest import FACTS, QUESTIONS, engine_config, greedy, running_engine
from tests.engine.memory.memory_support import HashEmbedder
from tests.fake_runner import FakeRunner


def open_memory(engine, db, **options) -> Memory:
    return Memory(engine, db, HashEmbedder(), progress_bar=False, **options)


def exported(memory: Memory, user: str) -> list[dict]:
    """The user's export without its time of export (comparable between stores)."""
    lines = [json.loads(line) for line in memory.export(user_id=user)]
    lines[0].pop("exported_at")
    return lines


def fake_engine(tiny_models):
    from inferscale_engine.runtime.engine import Engine

    return Engine(engine_config(tiny_models["llama"]), runner=FakeRunner)


@pytest.mark.vllm
def test_a_restored_store_and_disk_tier_serve_the_same_facts_without_encoding(tiny_models,
                                                                              tmp_path):
    model, live, fresh = tiny_models["llama"], tmp_path / "live", tmp_path / "fresh"
    with running_engine(model, disk_tier_path=str(live / "disk")) as engine:
        with open_memory(engine, live / "memory.db") as memory:
            added = memory.add(user_id="alice", texts=FACTS)
            memory.supersede(user_id="alice", fact_id=added[-1].fact_id,
                             text="John plays jazz piano in Boston now.")
            found = memory.search(user_id="alice", query=QUESTIONS[0], k=3)
            answer = memory.generate(user_id="alice", query=QUESTIONS[0], k=3,
                                     sampling=greedy(6))
            before = exported(memory, "alice")
            engine.workers.flush_disk()
            info = backup(str(live / "memory.db"), tmp_path / "backup", str(live / "disk"))
            memory.add(user_id="alice", texts=["Alice adopted a parrot."])  # after: not in it
    assert (info.num_facts, info.num_current, info.num_users) == (6, 5, 1)
    assert info.num_disk_entries == 5  # the current facts (a superseded one leaves the tiers)

    restored = restore(tmp_path / "backup", str(fresh / "memory.db"), str(fresh / "disk"))
    assert (restored.num_facts, restored.num_disk_entries) == (6, 5)
    with running_engine(model, disk_tier_path=str(fresh / "disk")) as engine:
        with open_memory(engine, fresh / "memory.db", startup="encode") as memory:
            counters = engine.stats().counters
            assert counters.get("encoded_facts") == 1  # the preamble: no fact encoded again
            assert exported(memory, "alice") == before
            again = memory.search(user_id="alice", query=QUESTIONS[0], k=3)
            assert again.handle == found.handle and again.facts == found.facts
            out = memory.generate(user_id="alice", query=QUESTIONS[0], k=3, sampling=greedy(6))
            assert out.plan_status == "inject" and out.token_ids == answer.token_ids
            counters = engine.stats().counters
            assert counters.get("disk_hits", 0) >= 3 and counters.get("encoded_facts") == 1

    bare = restore(tmp_path / "backup", str(tmp_path / "bare" / "memory.db"))
    assert bare.num_disk_entries is None and bare.num_current == 5
    with fake_engine(tiny_models) as engine, \
            open_memory(engine, tmp_path / "bare" / "memory.db", startup="encode") as memory:
        assert engine.stats().counters.get("encoded_facts") == 1 + bare.num_current
        assert exported(memory, "alice") == before
        assert memory.generate(user_id="alice", query=QUESTIONS[0], k=3).plan_status == "inject"


def test_sqlite_backup_is_online_and_restore_never_overwrites(tiny_models, tmp_path, capsys):
    from inferscale_engine.cli import main as cli

    db = str(tmp_path / "memory.db")
    with fake_engine(tiny_models) as engine, open_memory(engine, db) as memory:
        memory.add(user_id="bo", texts=["Bo keeps bees.", "Bo's hives are on the roof."])
        (old,) = memory.add(user_id="cy", texts=["Cy lives in Oslo."])
        memory.supersede(user_id="cy", fact_id=old.fact_id, text="Cy moved to Bergen.")
        # the Memory keeps its store open (and could be writing): the backup API copies a
        # consistent snapshot anyway
        assert cli(["backup", "--db", db, str(tmp_path / "backup")]) == 0
        assert "backed up 4 facts of 2 users (sqlite" in capsys.readouterr().out
        expected = {u: exported(memory, u) for u in ("bo", "cy")}
    assert (tmp_path / "backup" / "memory.db").stat().st_mode & 0o777 == 0o600
    target = tmp_path / "restored" / "memory.db"
    assert cli(["restore", str(tmp_path / "backup"), "--db", str(target)]) == 0
    assert "the 3 current facts are encoded again" in capsys.readouterr().out
    with fake_engine(tiny_models) as engine, open_memory(engine, target) as memory:
        assert {u: exported(memory, u) for u in ("bo", "cy")} == expected
    with pytest.raises(ConfigError, match="exists"):
        restore(tmp_path / "backup", str(target))
    with pytest.raises(ConfigError, match="not an empty folder"):
        backup(db, tmp_path / "backup")
    with pytest.raises(ConfigError, match="holds a sqlite store"):
        restore(tmp_path / "backup", "postgresql://nobody@127.0.0.1:1/none")


def test_postgres_backup_and_restore_with_pg_dump(tiny_models, tmp_path, postgres_server):
    if shutil.which("pg_dump") is None and not list(
            __import__("pathlib").Path("/usr/lib/postgresql").glob("*/bin/pg_dump")):
        pytest.skip("pg_dump is not installed")
    source = postgres_server.url_for(postgres_server.create_database())
    target = postgres_server.url_for(postgres_server.create_database())
    with fake_engine(tiny_models) as engine, open_memory(engine, source) as memory:
        (old,) = memory.add(user_id="di", texts=["Di rows on the Thames."],
                            metadata={"sport": "rowing"})
        memory.supersede(user_id="di", fact_id=old.fact_id, text="Di rows on the Seine.")
        memory.update(user_id="di", fact_id=old.fact_id + 1, text="Di rows on the Loire.")
        expected = exported(memory, "di")
        info = backup(source, tmp_path / "backup")
    assert (info.database, info.num_facts, info.num_current) == ("postgresql", 2, 1)
    assert (tmp_path / "backup" / "memory.pgdump").is_file()
    restored = restore(tmp_path / "backup", target)
    assert (restored.num_facts, restored.num_users) == (2, 1)
    with fake_engine(tiny_models) as engine, open_memory(engine, target) as memory:
        assert exported(memory, "di") == expected  # same ids, times, chain and history
        (fact,) = memory.add(user_id="di", texts=["Di also cycles."])
        assert fact.fact_id > max(f["id"] for f in expected[1:])  # ids go on, never reused
    with pytest.raises(ConfigError, match="has tables"):
        restore(tmp_path / "backup", target)
