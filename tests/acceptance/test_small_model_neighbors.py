"""Acceptance with the real Qwen2.5-Coder-0.5B: Memory(neighbor_share=0.3) answers from the turn
said right after the one the question matches, in kv and in text mode alike.

The conversation of small_memory.py: the question matches Melanie's turn asking about the
class; the answer is Caroline's reply, which four other turns about pottery outrank: without
neighbors it is not among the k=4. Its own module: one engine per process. Greedy decoding;
assertions are on what the answers say. Skipped without the smallmodel extra.
"""

from __future__ import annotations

import pytest

from tests.acceptance import small_memory as talk

pytestmark = talk.NEEDS_SMALL_MODEL


@pytest.fixture(scope="module")
def conversation():
    with talk.pottery(neighbor_share=0.3) as memory:
        yield memory


def test_the_reply_comes_in_as_the_matching_turns_neighbor(conversation):
    found = conversation.search(user_id="caroline", query=talk.POTTERY_QUESTION, k=4)
    by = dict(zip((f.text for f in found.facts), found.found_by, strict=True))
    assert by.get(talk.POTTERY_ANSWER) == "neighbor", by
    assert by.get(talk.POTTERY_TURNS[2]) in ("embedding", "both", "keywords")


@pytest.mark.parametrize("mode", ["kv", "text"])
def test_the_answer_is_read_from_the_neighbor(conversation, mode):
    out = talk.answer(conversation, "caroline", talk.POTTERY_QUESTION, mode, k=4)
    assert "bowl" in out.text.lower(), out.text
