"""LlamaIndexKVMemory: a LlamaIndex memory whose history is one KV handle.

put() writes each message to the memory layer (thread-safe: stream_chat calls it from a
thread). get() returns the handle message (top-k facts for the input, then the recent turns)
followed by the trailing messages not answered yet: SimpleChatEngine puts the user's message
first and calls get() without input, so the question must come back as text. reset() forgets
the conversation; the user's long-term facts stay in the Memory.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.memory import BaseMemory

from inferscale_integrations.base import KVMemoryBase, TurnRecord
from inferscale_integrations.handles import is_handle_message

_ROLES = {MessageRole.SYSTEM: "system", MessageRole.DEVELOPER: "system",
          MessageRole.USER: "user", MessageRole.ASSISTANT: "assistant",
          MessageRole.CHATBOT: "assistant", MessageRole.MODEL: "assistant",
          MessageRole.TOOL: "tool", MessageRole.FUNCTION: "tool"}


class LlamaIndexKVMemory(KVMemoryBase, BaseMemory):
    """LlamaIndex memory for chat engines and agents."""

    @classmethod
    def class_name(cls) -> str:
        return "InferScaleKVMemory"

    @classmethod
    def from_defaults(cls, chat_history: list[ChatMessage] | None = None, llm: Any = None,
                      **kwargs: Any) -> LlamaIndexKVMemory:
        """Build from fields (user_id=..., k=...) and optionally seed the conversation.

        `llm` is accepted for LlamaIndex's signature; the memory does not use it.
        """
        memory = cls(**kwargs)
        if chat_history:
            memory.put_messages(chat_history)
        return memory

    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        """[handle message] + the trailing messages not answered yet (remote mode: no handle).

        Args:
            input: what to retrieve facts by; None: the latest user message.
            kwargs: LlamaIndex's extras (initial_token_count, ...); the handle's size is set
                by k and recent_turns instead.
        """
        pending = self.pending_turns()
        tail = [turn_to_chat_message(t) for t in self.turns[len(self.turns) - pending:]
                ] if pending else []
        if self.base_url is not None:  # the server retrieves the facts for the chat request
            return tail
        marker, extra = self.handle_message_parts(input or self.last_user_text(), pending)
        handle = ChatMessage(role=MessageRole(self.handle_role), content=marker,
                             additional_kwargs=extra)
        return [handle, *tail]

    def get_all(self) -> list[ChatMessage]:
        """The whole conversation as text messages."""
        return [turn_to_chat_message(t) for t in self.turns]

    def put(self, message: ChatMessage) -> None:
        """Write one message to the memory layer (a handle message is not stored)."""
        self.put_messages([message])

    def put_messages(self, messages: list[ChatMessage]) -> None:
        """Write messages to the memory layer in one call, in order."""
        self.remember([(message_role(m), m.content or "") for m in messages
                       if not is_handle_message(m.content, m.additional_kwargs)])

    def set(self, messages: list[ChatMessage]) -> None:
        """Replace the conversation with `messages` (written to the memory layer)."""
        with self._lock:
            self.clear_turns()
            self.put_messages(messages)

    def reset(self) -> None:
        """Forget the conversation (the user's long-term facts stay in the Memory)."""
        self.clear_turns()


def turn_to_chat_message(turn: TurnRecord) -> ChatMessage:
    """A stored turn as a LlamaIndex message."""
    return ChatMessage(role=MessageRole(turn["role"]), content=turn["content"])


def message_role(message: ChatMessage) -> str:
    """The engine role (system, user, assistant, tool) of a LlamaIndex message."""
    role = _ROLES.get(MessageRole(message.role))
    if role is None:
        raise ValueError(f"cannot store a message with role {message.role!r}")
    return role
