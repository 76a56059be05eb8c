"""LangChainKVMemory: a drop-in for ConversationBufferMemory whose history is one KV handle.

It takes ConversationBufferMemory's fields with the same meaning and errors. save_context writes
the exchange to the memory layer; load_memory_variables returns the handle (a marker string, or
one message when return_messages=True) instead of the transcript. `buffer`, `buffer_as_str`,
`buffer_as_messages` and `chat_memory` still show the transcript, as they do on
ConversationBufferMemory.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from langchain_classic.base_memory import BaseMemory
from langchain_classic.memory.utils import get_prompt_input_key
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    get_buffer_string,
)

from inferscale_integrations.base import KVMemoryBase, TurnRecord

_HANDLE_CLASSES: dict[str, type[BaseMessage]] = {
    "user": HumanMessage, "system": SystemMessage, "assistant": AIMessage}
_ROLE_CLASSES: tuple[tuple[type[BaseMessage], str], ...] = (
    (HumanMessage, "user"), (AIMessage, "assistant"), (SystemMessage, "system"),
    (ToolMessage, "tool"), (FunctionMessage, "tool"))


class LangChainSerializable:
    """dumpd/load support for our LangChain classes, under their module path."""

    @classmethod
    def is_lc_serializable(cls) -> bool:
        return True

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        return cls.__module__.split(".")


class LangChainKVMemory(LangChainSerializable, KVMemoryBase, BaseMemory):
    """LangChain memory for classic chains (ConversationChain, LLMChain, AgentExecutor)."""

    memory_key: str = "history"
    """Prompt variable the handle is given as."""
    return_messages: bool = False
    """True: the variable is [handle message] (for MessagesPlaceholder); False: the marker
    string (for string templates)."""
    input_key: str | None = None
    """Input holding the user's message (None: the only input that is not a memory variable)."""
    output_key: str | None = None
    """Output holding the answer (None: the only output, else 'output')."""
    human_prefix: str = "Human"
    """Prefix of user turns in buffer_as_str."""
    ai_prefix: str = "AI"
    """Prefix of assistant turns in buffer_as_str."""

    @property
    def memory_variables(self) -> list[str]:
        return [self.memory_key]

    def load_memory_variables(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """The handle for this input: top-k facts and the recent turns.

        Remote mode: nothing ('' or []); the server retrieves the facts for the chat request.
        """
        if self.base_url is not None:
            return {self.memory_key: [] if self.return_messages else ""}
        marker, extra = self.handle_message_parts(self._query(inputs))
        if not self.return_messages:
            return {self.memory_key: marker}
        message = _HANDLE_CLASSES[self.handle_role](content=marker, additional_kwargs=extra)
        return {self.memory_key: [message]}

    def save_context(self, inputs: dict[str, Any], outputs: dict[str, str]) -> None:
        """Write the user's input and the answer to the memory layer."""
        input_str, output_str = self._get_input_output(inputs, outputs)
        self.remember([("user", input_str), ("assistant", output_str)])

    def clear(self) -> None:
        """Forget this conversation (the user's long-term facts stay in the Memory)."""
        self.clear_turns()

    # ---- ConversationBufferMemory's read-only views ------------------------------------
    @property
    def buffer(self) -> Any:
        """The transcript: messages if return_messages, else a string."""
        return self.buffer_as_messages if self.return_messages else self.buffer_as_str

    @property
    def buffer_as_str(self) -> str:
        """The transcript as 'Human: ...' / 'AI: ...' lines."""
        return get_buffer_string(self.buffer_as_messages, human_prefix=self.human_prefix,
                                 ai_prefix=self.ai_prefix)

    @property
    def buffer_as_messages(self) -> list[BaseMessage]:
        """The transcript as LangChain messages."""
        return [turn_to_message(t) for t in self.turns]

    @property
    def chat_memory(self) -> BaseChatMessageHistory:
        """The transcript as a chat history; messages added to it go to the memory layer."""
        return KVChatMessageHistory(self)

    # ---- internals ---------------------------------------------------------------------
    def _query(self, inputs: dict[str, Any]) -> str | None:
        key = self.input_key
        if key is None:
            keys = [k for k in inputs if k not in (*self.memory_variables, "stop")]
            key = keys[0] if len(keys) == 1 else ("input" if "input" in inputs else None)
        return message_text(inputs.get(key)) if key is not None else None

    def _get_input_output(self, inputs: dict[str, Any], outputs: dict[str, Any]
                          ) -> tuple[str, str]:
        """ConversationBufferMemory's choice of input and output, with the same errors."""
        if self.input_key is None:
            prompt_input_key = get_prompt_input_key(inputs, self.memory_variables)
        else:
            prompt_input_key = self.input_key
        if self.output_key is None:
            if len(outputs) == 1:
                output_key = next(iter(outputs.keys()))
            elif "output" in outputs:
                output_key = "output"
                warnings.warn(
                    f"'{self.__class__.__name__}' got multiple output keys: {outputs.keys()}. "
                    "The default 'output' key is being used. If this is not desired, please "
                    "manually set 'output_key'.", stacklevel=3)
            else:
                raise ValueError(
                    f"Got multiple output keys: {outputs.keys()}, cannot determine which to "
                    "store in memory. Please set the 'output_key' explicitly.")
        else:
            output_key = self.output_key
        return message_text(inputs[prompt_input_key]), message_text(outputs[output_key])


class KVChatMessageHistory(BaseChatMessageHistory):
    """`chat_memory` of a LangChainKVMemory: its transcript, writing through to the Memory."""

    def __init__(self, memory: LangChainKVMemory) -> None:
        self._kv_memory = memory

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return self._kv_memory.buffer_as_messages

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self._kv_memory.remember([(message_role(m), message_text(m)) for m in messages])

    def clear(self) -> None:
        self._kv_memory.clear_turns()


def turn_to_message(turn: TurnRecord) -> BaseMessage:
    """A stored turn as a LangChain message."""
    cls = _HANDLE_CLASSES.get(turn["role"])
    if cls is None:
        return ChatMessage(role=turn["role"], content=turn["content"])
    return cls(content=turn["content"])


def message_role(message: BaseMessage) -> str:
    """The engine role (system, user, assistant, tool) of a LangChain message (or chunk)."""
    for cls, role in _ROLE_CLASSES:
        if isinstance(message, cls):
            return role
    if isinstance(message, ChatMessage):
        role = {"human": "user", "ai": "assistant", "developer": "system",
                "function": "tool"}.get(message.role, message.role)
        if role in ("system", "user", "assistant", "tool"):
            return role
    raise ValueError(f"cannot map a LangChain {type(message).__name__} with role "
                     f"{getattr(message, 'role', message.type)!r} to system, user, assistant "
                     "or tool")


def message_text(value: Any) -> str:
    """Text of an input or output value: a string, a message, or a list of messages."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, BaseMessage):
        return value.text
    if isinstance(value, list) and all(isinstance(v, BaseMessage) for v in value):
        return "\n".join(v.text for v in value)
    return str(value)
