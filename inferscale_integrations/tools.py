"""Tool calling as text, the Hermes / Qwen2.5 way.

Tool schemas go into the system message; calls are parsed from
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks in the answer. The engine
renders chats with the model's own template but without its tool section, so the wrappers put
the schemas into the system message themselves and turn earlier tool calls back into the same
text form.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One parsed tool call."""

    name: str
    arguments: dict[str, Any]
    call_id: str


def tools_prompt(schemas: Sequence[Mapping[str, Any]], tool_choice: str | None = None) -> str:
    """System-message text that offers `schemas` (OpenAI function format) to the model.

    Args:
        schemas: ``{"type": "function", "function": {...}}`` dicts.
        tool_choice: None/'auto', 'any'/'required' (must call a tool), or a tool name.
    """
    lines = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    text = TOOLS_HEADER + lines + TOOLS_FOOTER
    if tool_choice in ("any", "required"):
        text += "\n\nYou must call at least one of these functions."
    elif tool_choice not in (None, "auto", "none"):
        text += f"\n\nYou must call the function {tool_choice!r}."
    return text


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """The text form of one call, as the model is asked to write it."""
    payload = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """The answer without its well-formed tool calls, and those calls in order.

    A block that is not valid JSON with a string 'name' stays in the text.
    """
    calls: list[ToolCall] = []

    def take(match: re.Match[str]) -> str:
        try:
            payload = json.loads(match.group(1))
        except ValueError:
            return match.group(0)
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            return match.group(0)
        arguments = payload.get("arguments", payload.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return match.group(0)
        if not isinstance(arguments, dict):
            return match.group(0)
        calls.append(ToolCall(payload["name"], arguments, "call_" + uuid.uuid4().hex[:12]))
        return ""

    rest = _CALL_RE.sub(take, text)
    return (rest.strip() if calls else text), calls


ToolParser = Callable[[str, Sequence[Mapping[str, Any]], Sequence[Mapping[str, str]]],
                      tuple[str, list[ToolCall]]]
"""(answer text, offered tool schemas, chat sent) -> (text without the calls, the calls)."""


def hermes_parser(text: str, tools: Sequence[Mapping[str, Any]],
                  chat: Sequence[Mapping[str, str]]) -> tuple[str, list[ToolCall]]:
    """Hermes / Qwen2.5 <tool_call> blocks (see parse_tool_calls)."""
    return parse_tool_calls(text)


_parsers: dict[str, ToolParser] = {"hermes": hermes_parser}
_parsers_lock = threading.Lock()


def register_tool_parser(name: str, parser: ToolParser) -> None:
    """Make `parser` selectable as a wrapper's tool_parser=name (replacing one of that name)."""
    if not isinstance(name, str) or not name.strip() or not callable(parser):
        raise ValueError("register_tool_parser needs a name and a callable "
                         "(text, tools, chat) -> (text, calls)")
    with _parsers_lock:
        _parsers[name] = parser


def get_tool_parser(name: str) -> ToolParser:
    """The tool-call parser registered as `name`.

    Raises:
        ValueError: no parser has that name.
    """
    with _parsers_lock:
        parser = _parsers.get(name)
        known = sorted(_parsers)
    if parser is None:
        raise ValueError(f"tool_parser={name!r} is unknown; known: {known} (add one with "
                         "register_tool_parser)")
    return parser


def add_tools_prompt(messages: list[dict[str, str]], schemas: Sequence[Mapping[str, Any]],
                     tool_choice: str | None = None) -> list[dict[str, str]]:
    """`messages` with the tools offered at the end of the (first) system message."""
    text = tools_prompt(schemas, tool_choice)
    if messages and messages[0]["role"] == "system":
        head = {"role": "system", "content": messages[0]["content"] + "\n\n" + text}
        return [head, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def tool_choice_name(tool_choice: object) -> str | None:
    """A tool_choice in any framework's form as None, 'auto', 'none', 'any' or a tool name."""
    if tool_choice is None or tool_choice is False:
        return None
    if tool_choice is True or tool_choice == "required":
        return "any"
    if isinstance(tool_choice, str):
        return tool_choice
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else tool_choice.get("name")
        if isinstance(name, str):
            return name
    raise ValueError(f"tool_choice={tool_choice!r:.80} is not understood; pass 'auto', 'any', "
                     "'none', a tool name, or {'type': 'function', 'function': {'name': ...}}")
