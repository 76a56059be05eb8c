"""Tool calling for the wrappers: offered through the model's chat template, read by vLLM.

The engine renders the offered tools with the model's own template (apply_chat_template(
tools=...)) and vLLM's tool parser named by the wrapper's `tool_parser` reads the calls back
(hermes for Qwen2.5, llama3_json, mistral, ...; a bare JSON object naming an offered tool
counts). Earlier calls in the chat are written back in the Hermes text form. Apps may register
their own parser under a name (register_tool_parser).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from inferscale_engine.prompting.tool_calls import ToolCall, format_tool_call

if TYPE_CHECKING:
    from inferscale_engine.memory import Memory

__all__ = ["ToolCall", "ToolParser", "format_tool_call", "register_tool_parser",
           "read_tool_calls", "tool_choice_name", "with_tool_choice"]

ToolParser = Callable[[str, Sequence[Mapping[str, Any]], Sequence[Mapping[str, str]]],
                      tuple[str, list[ToolCall]]]
"""(answer text, offered tool schemas, chat sent) -> (text without the calls, the calls)."""

_parsers: dict[str, ToolParser] = {}
_parsers_lock = threading.Lock()


def register_tool_parser(name: str, parser: ToolParser) -> None:
    """Make `parser` selectable as a wrapper's tool_parser=name (before vLLM's parsers)."""
    if not isinstance(name, str) or not name.strip() or not callable(parser):
        raise ValueError("register_tool_parser needs a name and a callable "
                         "(text, tools, chat) -> (text, calls)")
    with _parsers_lock:
        _parsers[name] = parser


def read_tool_calls(memory: Memory, parser: str, text: str, tools: Sequence[Mapping[str, Any]],
                    chat: Sequence[Mapping[str, str]]) -> tuple[str, list[ToolCall]]:
    """The answer without its tool calls, and the calls.

    Read by the parser registered as `parser`, else by vLLM's tool parser of that name.
    """
    with _parsers_lock:
        custom = _parsers.get(parser)
    if custom is not None:
        return custom(text, tools, chat)
    return memory.parse_tool_calls(text, tools, parser)


def with_tool_choice(messages: list[dict[str, str]], tool_choice: str | None
                     ) -> list[dict[str, str]]:
    """`messages` with a system instruction when a call is required ('any' or a tool name).

    Chat templates render the tools but not tool_choice, so it is said in words.
    """
    if tool_choice in (None, "auto", "none"):
        return messages
    text = ("You must call at least one of the functions." if tool_choice == "any"
            else f"You must call the function {tool_choice!r}.")
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + text},
                *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def tool_choice_name(tool_choice: object) -> str | None:
    """A tool_choice in any framework's form as None, 'auto', 'none', 'any' or a tool name."""
    if tool_choice is None or tool_choice is False:
        return None
    if tool_choice is True or tool_choice in ("required", "any"):
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
