"""The text-answer cache: its key changes with anything that changes the text prompt."""

from __future__ import annotations

import json

from benchmarks.locomo_cache import TextAnswerCache, text_cache_key

BASE = dict(
    model={"name": "qwen2.5-coder-0.5b-instruct", "weights": "gguf-sha256:1d96", "dtype": "float32",
           "device": "cpu", "vllm": "0.32.0"},
    question_id="conv-26/17", k=20, prompt_token_ids=[151644, 8948, 198, 12, 508, 23, 3217],
    layout="system", options={}, system_prompt="You answer questions.\nMemory:\n",
    sampling={"max_tokens": 20, "temperature": 0.0, "logprobs": 100})


def key(**changes):
    return text_cache_key(**{**BASE, **changes})


def test_key_is_stable_and_changes_with_every_input():
    reference = key()
    assert reference == key() == key(options={}, sampling=dict(BASE["sampling"]))
    variants = {
        "model name": key(model={**BASE["model"], "name": "qwen2.5-coder-1.5b-instruct"}),
        "weights": key(model={**BASE["model"], "weights": "gguf-sha256:cc32"}),
        "dtype": key(model={**BASE["model"], "dtype": "bfloat16"}),
        "device": key(model={**BASE["model"], "device": "NVIDIA H200"}),
        "vllm": key(model={**BASE["model"], "vllm": "0.26.0"}),
        "question": key(question_id="conv-26/18"),
        "k": key(k=10),
        "one token": key(prompt_token_ids=[*BASE["prompt_token_ids"][:-1], 3218]),
        "token order": key(prompt_token_ids=list(reversed(BASE["prompt_token_ids"]))),
        "one token more": key(prompt_token_ids=[*BASE["prompt_token_ids"], 13]),
        "layout": key(layout="user4"),
        "options": key(options={"repair_top": 4}),
        "option value": key(options={"repair_top": 2}),
        "system prompt": key(system_prompt="You answer.\nMemory:\n"),
        "max tokens": key(sampling={**BASE["sampling"], "max_tokens": 32}),
        "logprobs": key(sampling={**BASE["sampling"], "logprobs": 20}),
        "temperature": key(sampling={**BASE["sampling"], "temperature": 0.7}),
    }
    assert reference not in variants.values()
    assert len(set(variants.values())) == len(variants)
    # dict order is not part of the key
    assert key(options={"a": 1, "b": 2}) == key(options={"b": 2, "a": 1})


def test_cache_round_trip_and_a_truncated_line(tmp_path):
    path = tmp_path / "cache.jsonl"
    cache = TextAnswerCache(path)
    assert cache.get("k1") is None and cache.misses == 1
    cache.put("k1", {"text": "Pepper", "token_ids": [1, 2]}, {"arm": "text"})
    cache.put("k2", {"text": "Peanuts", "token_ids": [3]})
    with path.open("a") as out:
        out.write('{"key": "k3", "generation": {"te')  # a killed run's last line
    again = TextAnswerCache(path)
    assert len(again) == 2
    assert again.get("k1") == {"text": "Pepper", "token_ids": [1, 2]} and again.hits == 1
    assert json.loads(path.read_text().splitlines()[0])["about"] == {"arm": "text"}
    memory_only = TextAnswerCache(None)
    memory_only.put("k", {"text": "x"})
    assert memory_only.get("k") == {"text": "x"}
