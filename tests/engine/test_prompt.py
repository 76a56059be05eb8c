"""PromptBuilder encodes through the tokenizer's Rust backend only where that is exact."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferscale_engine.prompting.prompt import PromptBuilder

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "\n", " ", "- ", "\t"]


@pytest.fixture(scope="module")
def tokenizer(tiny_models):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_models["qwen2"]))


def _hf(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(max_size=12) | st.sampled_from(SPECIALS), max_size=8).map("".join))
def test_encode_equals_the_tokenizers_own_call(tokenizer, text):
    builder = PromptBuilder(tokenizer, "You are helpful.")
    assert builder._backend is not None  # the fast path is what this test checks
    assert builder.encode(text) == _hf(tokenizer, text)


def test_built_prompts_are_unchanged_by_the_fast_path(tokenizer):
    fast, slow = PromptBuilder(tokenizer, "Sys."), PromptBuilder(tokenizer, "Sys.")
    slow._backend = None
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi ✓"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Q?"}]
    facts = [fast.fact_ids("Dan collects maps."), fast.fact_ids("Ann: 東京")]
    assert fast.build(messages, facts) == slow.build(messages, facts)
    assert fast.fact_ids("x y") == slow.fact_ids("x y")


def test_a_truncating_backend_is_not_used(tokenizer):
    builder = PromptBuilder(tokenizer, "Sys.")
    text = "one two three four five six seven eight nine ten"
    backend = tokenizer.backend_tokenizer
    backend.enable_truncation(3)
    try:
        assert builder.encode(text) == _hf(tokenizer, text) and len(builder.encode(text)) > 3
    finally:
        backend.no_truncation()


def test_a_backend_that_differs_is_refused(tokenizer):
    class Skewed:  # the tokenizer, but its own call drops the last id of every text
        chat_template = tokenizer.chat_template
        backend_tokenizer = tokenizer.backend_tokenizer

        def __call__(self, text, **kwargs):
            ids = tokenizer(text, **kwargs)["input_ids"]
            return {"input_ids": ids[:-1]}

        def apply_chat_template(self, *args, **kwargs):
            return tokenizer.apply_chat_template(*args, **kwargs)

    builder = PromptBuilder(Skewed(), "Sys.")
    assert builder._backend is None
    assert builder.encode("a b c") == _hf(tokenizer, "a b c")[:-1]


def test_text_the_backend_refuses_gets_the_tokenizers_answer(tokenizer):
    builder = PromptBuilder(tokenizer, "Sys.")
    text = "lone \ud800 surrogate"
    try:
        expected: object = _hf(tokenizer, text)
    except Exception as exc:  # noqa: BLE001 - whatever the tokenizer does, encode does too
        expected = type(exc)
    try:
        got: object = builder.encode(text)
    except Exception as exc:  # noqa: BLE001
        got = type(exc)
    assert got == expected


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(max_size=80), max_size=8), st.text(max_size=40))
def test_the_batch_encoder_equals_encode(tokenizer, texts, other):
    builder = PromptBuilder(tokenizer, "You are helpful.", "Memory:\n")
    encode = builder.batch_encoder(list(dict.fromkeys(texts)))
    for text in [*texts, other]:  # batched texts are looked up, any other encoded alone
        assert encode(text) == builder.encode(text)


def test_context_texts_are_the_distinct_texts_and_leads():
    from inferscale_engine.prompting.contexts import RunContext, context_texts

    contexts = ["a", None, RunContext("lead", ("x",)), RunContext(None, ("y",)), "a", ""]
    assert context_texts(contexts) == ["a", "lead"]
