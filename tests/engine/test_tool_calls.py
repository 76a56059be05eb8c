"""Tool calls read back with vLLM's own parsers (hermes, llama3_json), and bare JSON calls."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from inferscale_engine.errors import InvalidRequestError
from inferscale_engine.prompting.tool_calls import parse_tool_calls
from inferscale_integrations.tools import format_tool_call

WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def tokenizer(tiny_models):
    return AutoTokenizer.from_pretrained(str(tiny_models["qwen2"]))


def test_hermes_blocks_are_calls(tokenizer):
    text = "Let me check.\n" + format_tool_call("weather", {"city": "Oslo"})
    content, calls = parse_tool_calls(tokenizer, "hermes", text, [WEATHER])
    assert [(c.name, c.arguments) for c in calls] == [("weather", {"city": "Oslo"})]
    assert content == "Let me check." and calls[0].call_id.startswith("call_")
    assert parse_tool_calls(tokenizer, "hermes", "plain answer", [WEATHER]) == (
        "plain answer", [])


def test_a_bare_json_object_naming_an_offered_tool_is_a_call(tokenizer):
    bare = '{"name": "weather", "arguments": {"city": "Lima"}}'
    content, calls = parse_tool_calls(tokenizer, "hermes", bare, [WEATHER])
    assert content == "" and [(c.name, c.arguments) for c in calls] == [
        ("weather", {"city": "Lima"})]
    other = '{"name": "launch_rockets", "arguments": {}}'  # not offered: stays text
    assert parse_tool_calls(tokenizer, "hermes", other, [WEATHER]) == (other, [])
    assert parse_tool_calls(tokenizer, "hermes", "{not json", [WEATHER]) == ("{not json", [])


def test_other_vllm_parsers_by_name_and_unknown_names(tokenizer):
    _, calls = parse_tool_calls(tokenizer, "pythonic", '[weather(city="Kyoto")]', [WEATHER])
    assert [(c.name, c.arguments) for c in calls] == [("weather", {"city": "Kyoto"})]
    with pytest.raises(InvalidRequestError, match="not a vLLM tool parser"):
        parse_tool_calls(tokenizer, "no-such-parser", "x", [WEATHER])
    with pytest.raises(InvalidRequestError, match="does not fit this model"):
        parse_tool_calls(tokenizer, "llama3_json", "x", [WEATHER])  # needs <|python_tag|>
