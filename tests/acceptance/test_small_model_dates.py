"""Acceptance with the real Qwen2.5-Coder-0.5B: Memory(date_facts=True) answers "when" from the
dates written into its facts, in kv and in text mode alike.

Its own module: one engine per process, and this one's Memory serves dated facts. Greedy
decoding; assertions are on what the answers say. Skipped without the smallmodel extra.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from inferscale_engine.model.small_model import small_model_available

pytestmark = [pytest.mark.vllm, pytest.mark.acceptance,
              pytest.mark.skipif(not small_model_available(),
                                 reason="needs the smallmodel extra (the 0.5B GGUF from PyPI)")]

FACTS = [("I moved to Lisbon.", datetime(2023, 5, 8, tzinfo=UTC)),
         ("I adopted a dog called Pepper.", datetime(2024, 2, 14, tzinfo=UTC)),
         ("I started learning the violin.", datetime(2022, 9, 1, tzinfo=UTC))]
QUESTIONS = [("When did I move to Lisbon?", ("may", "2023")),
             ("When did I adopt Pepper?", ("february", "2024"))]


@pytest.fixture(scope="module")
def dated():
    from inferscale_engine.config import EngineConfig
    from inferscale_engine.memory import Memory, MemoryConfig
    from inferscale_engine.model.resolve import resolve_model

    path, dtype = resolve_model("small")
    config = MemoryConfig(engine=EngineConfig(model=str(path), dtype=dtype, max_model_len=2048,
                                              kv_cache_memory_bytes=256 * 2**20),
                          db_path=":memory:", device="cpu", date_facts=True)
    with Memory.from_config(config) as memory:
        for text, when in FACTS:
            memory.add(user_id="dana", texts=[text], timestamp=when)
        yield memory


@pytest.mark.parametrize("mode", ["kv", "text"])
def test_when_questions_are_answered_from_the_facts_dates(dated, mode):
    from vllm import SamplingParams

    sampling = SamplingParams(max_tokens=24, temperature=0.0)
    assert [f.text for f in dated.get_all(user_id="dana")] == [t for t, _ in FACTS]
    for question, words in QUESTIONS:
        out = dated.generate(user_id="dana", query=question, k=3, sampling=sampling, mode=mode)
        print(f"[{mode}] {question} -> {out.text.strip()!r}")
        assert all(w in out.text.lower() for w in words), (question, out.text)
        assert (out.plan_status == "inject") == (mode == "kv")
