"""Deterministic tool-call parsers for agent tests on the tiny (gibberish) model.

The agent loop really calls ChatInferScale / InferScaleLLM, which really call the engine with
the memory's handle; only the reading of the answer is scripted: the first answer of a run
becomes a call of the first offered tool (its argument is the engine's text), and once a tool
result is in the chat the answer is final. Real models use the Hermes <tool_call> parser.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.agent.react.output_parser import ReActOutputParser
from llama_index.core.agent.react.types import (
    ActionReasoningStep,
    BaseReasoningStep,
    ResponseReasoningStep,
)

from inferscale_integrations.langchain.chat_model import ChatInferScale
from inferscale_integrations.llamaindex.llm import InferScaleLLM
from inferscale_integrations.tools import ToolCall, register_tool_parser


def scripted_calls(text: str, tools: Any, chat: Any) -> tuple[str, list[ToolCall]]:
    if not tools or any(m["role"] == "tool" for m in chat):
        return text, []
    name = tools[0]["function"]["name"]
    return "", [ToolCall(name, {"query": text.strip()[:20] or "?"}, "call_scripted")]


register_tool_parser("scripted", scripted_calls)


class ScriptedChatInferScale(ChatInferScale):
    tool_parser: str = "scripted"


class ScriptedInferScaleLLM(InferScaleLLM):
    tool_parser: str = "scripted"


class ScriptedReActParser(ReActOutputParser):
    """First answer: an action on `tool`; every later answer: the final response."""

    def __init__(self, tool: str) -> None:
        super().__init__()
        self._tool = tool
        self.outputs: list[str] = []

    def parse(self, output: str, is_streaming: bool = False) -> BaseReasoningStep:
        self.outputs.append(output)
        if len(self.outputs) == 1:
            return ActionReasoningStep(thought="look it up", action=self._tool,
                                       action_input={"query": output.strip()[:20] or "?"})
        return ResponseReasoningStep(thought="done", response=output or "?")
