"""Acceptance with the real Qwen2.5-Coder-0.5B: Memory(neighbor_share=0.3) answers from the turn
said right after the one the question matches, in kv and in text mode alike.

The question ("What did Caroline make at the pottery class on Saturday?") matches Melanie's
turn asking about the class; the answer is Caroline's reply, which four other turns about
pottery outrank: without neighbors it is not among the k=4. Its own module: one engine per
process. Greedy decoding; assertions are on what the answers say. Skipped without the
smallmodel extra.
"""

from __future__ import annotations

import pytest

from inferscale_engine.model.small_model import small_model_available

pytestmark = [pytest.mark.vllm, pytest.mark.acceptance,
              pytest.mark.skipif(not small_model_available(),
                                 reason="needs the smallmodel extra (the 0.5B GGUF from PyPI)")]

TURNS = ["Melanie: My sister teaches a pottery class in Boston.",
         "Caroline: I painted a sunrise over the lake last week.",
         "Melanie: Did you go to the pottery class on Saturday?",
         "Caroline: Yes! I made a blue bowl for my mom.",
         "Melanie: My kids love camping in the mountains.",
         "Caroline: I signed up for a pottery workshop next month too.",
         "Melanie: Pottery sounds relaxing; I only tried it once at school.",
         "Caroline: The pottery class teacher is very patient.",
         "Caroline: I am reading a book about astronomy.",
         "Melanie: We adopted a puppy named Biscuit."]
QUESTION = "What did Caroline make at the pottery class on Saturday?"
ANSWER = TURNS[3]


@pytest.fixture(scope="module")
def conversation():
    from inferscale_engine.config import EngineConfig
    from inferscale_engine.memory import Memory, MemoryConfig
    from inferscale_engine.model.resolve import resolve_model

    path, dtype = resolve_model("small")
    config = MemoryConfig(engine=EngineConfig(model=str(path), dtype=dtype, max_model_len=2048,
                                              kv_cache_memory_bytes=256 * 2**20),
                          db_path=":memory:", device="cpu", neighbor_share=0.3)
    with Memory.from_config(config) as memory:
        memory.add(user_id="caroline", texts=TURNS)
        yield memory


def test_the_reply_comes_in_as_the_matching_turns_neighbor(conversation):
    found = conversation.search(user_id="caroline", query=QUESTION, k=4)
    by = dict(zip((f.text for f in found.facts), found.found_by, strict=True))
    assert by.get(ANSWER) == "neighbor", by
    assert by.get(TURNS[2]) in ("embedding", "both", "keywords")


@pytest.mark.parametrize("mode", ["kv", "text"])
def test_the_answer_is_read_from_the_neighbor(conversation, mode):
    from vllm import SamplingParams

    out = conversation.generate(user_id="caroline", query=QUESTION, k=4, mode=mode,
                                sampling=SamplingParams(max_tokens=24, temperature=0.0))
    print(f"[{mode}] {QUESTION} -> {out.text.strip()!r}")
    assert "bowl" in out.text.lower(), out.text
    assert (out.plan_status == "inject") == (mode == "kv")
