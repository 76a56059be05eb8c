"""Tool calls read back from answers with vLLM's own tool parsers.

Tools are offered through the model's own chat template (PromptBuilder renders them with
apply_chat_template(tools=...)); calls are parsed by the vLLM parser named for the model
(hermes for Qwen2.5 and Hermes models, llama3_json, mistral, ...). A bare JSON object naming
an offered tool also counts as a call: small models often drop the <tool_call> tags.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from inferscale_engine.errors import InvalidRequestError


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One parsed tool call."""

    name: str
    arguments: dict[str, Any]
    call_id: str


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """An earlier call written back into a chat, in the Hermes text form."""
    payload = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def parse_tool_calls(tokenizer: Any, parser: str, text: str,
                     tools: Sequence[Mapping[str, Any]]) -> tuple[str, list[ToolCall]]:
    """The answer without its tool calls, and the calls, by vLLM's parser `parser`.

    Args:
        tokenizer: the model's tokenizer (some parsers look up their tag tokens).
        parser: a vLLM tool parser name ('hermes', 'llama3_json', ...).
        text: the answer, decoded with special tokens kept.
        tools: the offered tools (OpenAI function format).

    Raises:
        InvalidRequestError: vLLM has no parser of that name.
    """
    offered = {t.get("function", {}).get("name") for t in tools}
    request = _request(tools)
    cls = _parser_class(parser)
    try:
        instance = cls(tokenizer, request.tools) if _takes_tools(parser) else cls(tokenizer)
    except (RuntimeError, ValueError, KeyError) as exc:  # e.g. its tag token is missing
        raise InvalidRequestError(f"tool_parser={parser!r} does not fit this model's "
                                  f"tokenizer ({exc}); pick the model's parser") from None
    found = instance.extract_tool_calls(text, request)
    calls = []
    for call in found.tool_calls if found.tools_called else []:
        arguments = call.function.arguments
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            continue
        if isinstance(parsed, dict):
            calls.append(ToolCall(call.function.name, parsed, _call_id()))
    if calls:
        return (found.content or "").strip(), calls
    bare = _bare_call(text, offered)
    return ("", [bare]) if bare is not None else (text, [])


def _bare_call(text: str, offered: set[Any]) -> ToolCall | None:
    """A whole answer that is one JSON object naming an offered tool."""
    try:
        payload = json.loads(text.strip())
    except ValueError:
        return None
    if not isinstance(payload, dict) or payload.get("name") not in offered:
        return None
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    return ToolCall(payload["name"], arguments, _call_id()) if isinstance(arguments, dict) else (
        None)


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:12]


def _request(tools: Sequence[Mapping[str, Any]]) -> Any:
    try:  # vLLM 0.32 (CPU build)
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    except ImportError:  # vLLM 0.26
        from vllm.entrypoints.openai.protocol import ChatCompletionRequest  # type: ignore
    return ChatCompletionRequest.model_validate({
        "model": "inferscale", "messages": [{"role": "user", "content": ""}],
        "tools": [dict(t) for t in tools]})


@cache
def _parser_class(name: str) -> Any:
    try:  # vLLM 0.32
        from vllm.tool_parsers import ToolParserManager
    except ImportError:  # vLLM 0.26
        from vllm.entrypoints.openai.tool_parsers import ToolParserManager  # type: ignore
    try:
        return ToolParserManager.get_tool_parser(name)
    except KeyError:
        raise InvalidRequestError(f"tool_parser={name!r} is not a vLLM tool parser; use the "
                                  "one for the model (hermes for Qwen2.5, llama3_json for "
                                  "Llama 3.1, mistral, ...)") from None


@cache
def _takes_tools(name: str) -> bool:
    import inspect

    return "tools" in inspect.signature(_parser_class(name).__init__).parameters
