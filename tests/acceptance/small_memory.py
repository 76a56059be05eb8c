"""What the acceptance modules share: a Memory over the real 0.5B, and a conversation whose
answer is in a reply that shares no word with the question.

In the conversation, the question ("What did Caroline make at the pottery class on Saturday?")
matches Melanie's turn asking about the class; the answer is Caroline's reply, which four
other turns about pottery outrank by embedding: vector search does not bring it into k=4.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from inferscale_engine.model.small_model import small_model_available

NEEDS_SMALL_MODEL = [pytest.mark.vllm, pytest.mark.acceptance,
                     pytest.mark.skipif(not small_model_available(), reason="needs the "
                                        "smallmodel extra (the 0.5B GGUF from PyPI)")]
"""An acceptance module's pytestmark."""

POTTERY_TURNS = ["Melanie: My sister teaches a pottery class in Boston.",
                 "Caroline: I painted a sunrise over the lake last week.",
                 "Melanie: Did you go to the pottery class on Saturday?",
                 "Caroline: Yes! I made a blue bowl for my mom.",
                 "Melanie: My kids love camping in the mountains.",
                 "Caroline: I signed up for a pottery workshop next month too.",
                 "Melanie: Pottery sounds relaxing; I only tried it once at school.",
                 "Caroline: The pottery class teacher is very patient.",
                 "Caroline: I am reading a book about astronomy.",
                 "Melanie: We adopted a puppy named Biscuit."]
POTTERY_QUESTION = "What did Caroline make at the pottery class on Saturday?"
POTTERY_ANSWER = POTTERY_TURNS[3]


@contextmanager
def small_memory(**options: Any) -> Iterator[Any]:
    """A Memory over the 0.5B on the CPU, in memory, with these MemoryConfig options."""
    from inferscale_engine.config import EngineConfig
    from inferscale_engine.memory import Memory, MemoryConfig
    from inferscale_engine.model.resolve import resolve_model

    path, dtype = resolve_model("small")
    config = MemoryConfig(engine=EngineConfig(model=str(path), dtype=dtype, max_model_len=2048,
                                              kv_cache_memory_bytes=256 * 2**20),
                          db_path=":memory:", device="cpu", **options)
    with Memory.from_config(config) as memory:
        yield memory


@contextmanager
def pottery(**options: Any) -> Iterator[Any]:
    """small_memory(**options) holding POTTERY_TURNS as the facts of user 'caroline'."""
    with small_memory(**options) as memory:
        memory.add(user_id="caroline", texts=POTTERY_TURNS)
        yield memory


def answer(memory: Any, user_id: str, query: str, mode: str, k: int) -> Any:
    """A greedy answer of at most 24 tokens, printed; it was served as asked (kv injects)."""
    from vllm import SamplingParams

    out = memory.generate(user_id=user_id, query=query, k=k, mode=mode,
                          sampling=SamplingParams(max_tokens=24, temperature=0.0))
    print(f"[{mode}] {query} -> {out.text.strip()!r}")
    assert (out.plan_status == "inject") == (mode == "kv")
    return out
