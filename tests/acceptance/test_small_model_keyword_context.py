"""Acceptance with the real Qwen2.5-Coder-0.5B: Memory(keyword_context=True) finds the reply to
the turn a question matches by that turn's words, and answers from it in kv and text mode.

The conversation of small_memory.py: the reply holding the answer shares none of the
question's words and vector search leaves it out of k=4; the keyword signal brings it in
through its context. Its own module: one engine per process. Greedy decoding; assertions are
on what the answers say. Skipped without the smallmodel extra.
"""

from __future__ import annotations

import pytest

from tests.acceptance import small_memory as talk

pytestmark = talk.NEEDS_SMALL_MODEL


@pytest.fixture(scope="module")
def conversation():
    with talk.pottery(keyword_context=True) as memory:
        yield memory


def test_the_reply_comes_in_by_its_questions_words(conversation):
    found = conversation.search(user_id="caroline", query=talk.POTTERY_QUESTION, k=4)
    by = dict(zip((f.text for f in found.facts), found.found_by, strict=True))
    assert by.get(talk.POTTERY_ANSWER) == "keywords", by  # its own text holds no word of the query
    vector = conversation.search(user_id="caroline", query=talk.POTTERY_QUESTION, k=4,
                                 search_mode="vector")
    assert talk.POTTERY_ANSWER not in [f.text for f in vector.facts]


@pytest.mark.parametrize("mode", ["kv", "text"])
def test_the_answer_is_read_from_the_reply(conversation, mode):
    out = talk.answer(conversation, "caroline", talk.POTTERY_QUESTION, mode, k=4)
    assert "bowl" in out.text.lower(), out.text
