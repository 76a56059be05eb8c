"""Acceptance with the real Qwen2.5-Coder-0.5B: Memory(date_facts=True) answers "when" from the
dates written into its facts, in kv and in text mode alike.

Its own module: one engine per process, and this one's Memory serves dated facts. Greedy
decoding; assertions are on what the answers say. Skipped without the smallmodel extra.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.acceptance.small_memory import NEEDS_SMALL_MODEL, answer, small_memory

pytestmark = NEEDS_SMALL_MODEL

FACTS = [("I moved to Lisbon.", datetime(2023, 5, 8, tzinfo=UTC)),
         ("I adopted a dog called Pepper.", datetime(2024, 2, 14, tzinfo=UTC)),
         ("I started learning the violin.", datetime(2022, 9, 1, tzinfo=UTC))]
QUESTIONS = [("When did I move to Lisbon?", ("may", "2023")),
             ("When did I adopt Pepper?", ("february", "2024"))]


@pytest.fixture(scope="module")
def dated():
    with small_memory(date_facts=True) as memory:
        for text, when in FACTS:
            memory.add(user_id="dana", texts=[text], timestamp=when)
        yield memory


@pytest.mark.parametrize("mode", ["kv", "text"])
def test_when_questions_are_answered_from_the_facts_dates(dated, mode):
    assert [f.text for f in dated.get_all(user_id="dana")] == [t for t, _ in FACTS]
    for question, words in QUESTIONS:
        out = answer(dated, "dana", question, mode, k=3)
        assert all(w in out.text.lower() for w in words), (question, out.text)
