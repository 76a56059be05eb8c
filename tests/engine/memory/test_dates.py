"""Dated facts (memory/dating.py) over FakeRunner: the date is in the tokens every path serves.

With date_facts=True a fact is served as '[8 May 2023] <text>': the KV's token ids and the text
a prompt pastes (the repaired user block included) both hold the label; stored, searched and
returned texts do not. Every path that tokenizes a fact (sync add, queued add, update,
supersede, import, the start-up rebuild when the setting changes) writes the label of the day
the fact became true.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

import pytest

from inferscale_engine.errors import ConfigError
from inferscale_engine.memory.dating import date_label
from tests.conftest import engine_config
from tests.engine.memory.memory_support import HashEmbedder
from tests.fake_runner import FakeRunner

MAY_8 = datetime(2023, 5, 8, 23, 30, tzinfo=UTC)
JUNE_2 = datetime(2023, 6, 2, 9, 0, tzinfo=UTC)


@pytest.fixture()
def engine(tiny_models):
    from inferscale_engine.prompting.layout import QUALITY_LAYOUT
    from inferscale_engine.runtime.engine import Engine

    # the product's layout: the two best facts are repaired as text before the question
    with Engine(engine_config(tiny_models["qwen2"], host_tier_bytes=0, layout=QUALITY_LAYOUT),
                runner=FakeRunner) as eng:
        yield eng


def open_memory(engine, path, **options):
    from inferscale_engine.memory import Memory

    return Memory(engine, path, HashEmbedder(), progress_bar=False, **options)


def served_tokens(engine, fact_id):
    return tuple(engine._facts[fact_id].fact.token_ids)


def dated(engine, text, when):
    return engine.tokenize_fact(date_label(when.timestamp()) + text)


def test_date_label_is_the_utc_day():
    assert date_label(MAY_8.timestamp()) == "[8 May 2023] "
    assert date_label(datetime(2024, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()) == (
        "[31 December 2024] ")


def test_every_path_serves_the_fact_with_the_day_it_became_true(engine, tmp_path):
    with open_memory(engine, tmp_path / "m.db", date_facts=True) as memory:
        (added,) = memory.add(user_id="ann", texts=["I moved to Lisbon."], timestamp=MAY_8)
        assert served_tokens(engine, added.fact_id) == dated(engine, "I moved to Lisbon.", MAY_8)
        # what the user reads back is what they added
        assert memory.get(user_id="ann", fact_id=added.fact_id).text == "I moved to Lisbon."
        (hit,) = memory.search(user_id="ann", query="Where did I move?", k=1).items
        assert hit.text == "I moved to Lisbon."

        updated = memory.update(user_id="ann", fact_id=added.fact_id, text="I moved to Porto.")
        assert updated.text == "I moved to Porto."
        assert served_tokens(engine, added.fact_id) == dated(engine, "I moved to Porto.", MAY_8)

        new = memory.supersede(user_id="ann", fact_id=added.fact_id,
                               text="I moved to Madrid.", timestamp=JUNE_2)
        assert served_tokens(engine, new.fact_id) == dated(engine, "I moved to Madrid.", JUNE_2)

        (queued,) = memory.add(user_id="ann", texts=["I adopted a cat."], timestamp=JUNE_2,
                               wait=False)
        assert served_tokens(engine, queued.fact_id) == dated(engine, "I adopted a cat.", JUNE_2)
        assert memory.wait_adds(60)
        assert served_tokens(engine, queued.fact_id) == dated(engine, "I adopted a cat.", JUNE_2)

        before = datetime.now(UTC)
        (plain,) = memory.add(user_id="ann", texts=["I play chess."])  # no timestamp: today
        assert served_tokens(engine, plain.fact_id) in {
            dated(engine, "I play chess.", day) for day in (before, datetime.now(UTC))}

        line = json.dumps({"id": "m1", "memory": "I learn Greek.", "user_id": "x",
                           "created_at": MAY_8.isoformat()})
        memory.import_(user_id="bo", file=io.StringIO(line + "\n"), format="mem0")
        (imported,) = memory.get_all(user_id="bo")
        assert served_tokens(engine, imported.fact_id) == dated(engine, "I learn Greek.", MAY_8)


def test_kv_and_text_prompts_hold_the_same_dated_words(engine, tmp_path):
    with open_memory(engine, tmp_path / "m.db", date_facts=True) as memory:
        texts = ["I moved to Lisbon.", "I work at a bakery.", "My dog is Rex.", "I like tea."]
        memory.add(user_id="ann", texts=texts, timestamp=MAY_8)
        question = "Where do I live?"
        handle = memory.handle_for(user_id="ann", query=question, k=4)
        prompt = engine.render_prompt(handle, question, layout=engine.config.layout)
        assert len(prompt.facts) == 2 and engine.config.layout.repair_placement == "user"
        words = engine.tokenizer.decode(prompt.token_ids())
        assert all(f"- [8 May 2023] {t}" in words for t in texts), words
        for mode in ("kv", "text"):
            memory.generate(user_id="ann", query=question, k=4, mode=mode)
            assert engine._runner.requests[-1][0]["prompt_token_ids"] == prompt.token_ids()


def test_the_setting_changed_on_a_store_recomputes_its_token_ids(engine, tmp_path):
    path = tmp_path / "m.db"
    with open_memory(engine, path) as memory:
        (fact,) = memory.add(user_id="ann", texts=["I moved to Lisbon."], timestamp=MAY_8)
        assert served_tokens(engine, fact.fact_id) == engine.tokenize_fact("I moved to Lisbon.")
    with open_memory(engine, path, date_facts=True) as memory:
        assert memory.counters["startup_refreshed"] == 1
        assert served_tokens(engine, fact.fact_id) == dated(engine, "I moved to Lisbon.", MAY_8)
    with open_memory(engine, path, date_facts=True) as memory:
        assert memory.counters["startup_refreshed"] == 0  # the same setting: nothing redone
    with open_memory(engine, path) as memory:
        assert memory.counters["startup_refreshed"] == 1
        assert served_tokens(engine, fact.fact_id) == engine.tokenize_fact("I moved to Lisbon.")


def test_date_facts_is_checked(engine, tmp_path, tiny_models):
    from inferscale_engine.memory import MemoryConfig

    with pytest.raises(ConfigError, match="date_facts"):
        open_memory(engine, tmp_path / "m.db", date_facts="yes")
    with pytest.raises(ConfigError, match="date_facts"):
        MemoryConfig(engine=engine_config(tiny_models["qwen2"]), date_facts=1)
    with open_memory(engine, tmp_path / "m.db") as memory:  # the engine is free again
        assert memory.add(user_id="ann", texts=["x y"])
