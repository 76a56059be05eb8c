"""KVMemoryBlock, KVStaticBlock: LlamaIndex memory blocks that contribute a user's facts as KV.

    from llama_index.core.memory import Memory
    memory = Memory.from_defaults(session_id="s1", memory_blocks=[KVMemoryBlock(user_id="alice")])
    agent = FunctionAgent(tools=[...], llm=InferScaleLLM())
    await agent.run("What is my dog called?", memory=memory)

On each read the block retrieves the user's pinned facts and top-k facts for the latest user
message (Memory.handle_for) and contributes one marker naming their handle; LlamaIndex puts it
in the system message and InferScaleLLM injects the facts' KV instead of reading text.
`as_text=True` contributes the facts' text instead (for other LLMs). A put (messages that
leave the short-term memory, or an explicit `aput`) remembers the user and assistant messages
as facts, each encoded after the turns before it.

A read before the first user message (an empty chat, or only system and assistant messages:
an agent's opening turn, a prompt rendered before any input) has nothing to search with. It
contributes the user's k most recent facts, so the first answer already knows the user;
`without_query="none"` contributes nothing instead. A user with no facts contributes nothing.

KVStaticBlock is LlamaIndex's StaticMemoryBlock as KV: its `static_content` facts are added
to the user's memory pinned (Memory.add(pinned=True)) on the block's first read, and every
read contributes the user's pinned facts, which InferScaleLLM injects right after the system
prompt, before any retrieved fact.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.memory import BaseMemoryBlock
from pydantic import Field, PrivateAttr, field_validator

from inferscale_engine import checks
from inferscale_engine.facts import MemoryHandle
from inferscale_integrations.handles import RECENT_HANDLES
from inferscale_integrations.registry import DEFAULT_NAME, check_name, get_memory


class _UserBlock(BaseMemoryBlock[str]):
    """A block of one user's facts in a registered Memory (the fields both blocks check)."""

    user_id: str = Field(description="The user whose facts are read and written.")
    memory_name: str = Field(default=DEFAULT_NAME,
                             description="The registered Memory (register_memory).")

    @field_validator("user_id")
    @classmethod
    def _user(cls, value: str) -> str:
        return checks.check_user_id(value)

    @field_validator("memory_name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value)


class KVMemoryBlock(_UserBlock):
    """A user's long-term facts as one KV handle per read (sync and async)."""

    name: str = Field(default="kv_memory", description="The block's name in the prompt.")
    description: str | None = Field(
        default="Facts remembered about the user, injected as precomputed KV.")
    k: int = Field(default=5, ge=0, description="Facts retrieved per read.")
    as_text: bool = Field(default=False,
                          description="Contribute the facts' text instead of a KV marker.")
    session_id: str | None = Field(default=None, description="Session of the written turns.")
    without_query: Literal["recent", "none"] = Field(
        default="recent", description="What a read before the first user message contributes: "
        "the user's k most recent facts, or nothing.")
    expire_after_minutes: float | None = Field(
        default=None, gt=0, description="Facts a put writes stop being served this many "
        "minutes later (Memory's expiration_date); None: never.")

    def get(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any) -> str:
        """The block's content for these messages (sync)."""
        return self._read(messages)

    def put(self, messages: list[ChatMessage]) -> None:
        """Remember these messages' user and assistant turns as facts (sync)."""
        self._write(messages)

    async def _aget(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any
                    ) -> str:
        return await asyncio.to_thread(self._read, messages)

    async def _aput(self, messages: list[ChatMessage]) -> None:
        await asyncio.to_thread(self._write, messages)

    # ---- internals ---------------------------------------------------------------------
    def _read(self, messages: list[ChatMessage] | None) -> str:
        query = next((m.content for m in reversed(messages or [])
                      if m.role == MessageRole.USER and isinstance(m.content, str)
                      and checks.has_visible(m.content)), None)
        if not self.k or (query is None and self.without_query == "none"):
            return ""
        memory = get_memory(self.memory_name)
        if query is not None:  # pinned facts first, then k others
            handle = memory.handle_for(user_id=self.user_id, query=query, k=self.k)
            texts = [memory.get(user_id=self.user_id, fact_id=f).text for f in handle.fact_ids]
        else:  # before the first user message: the latest facts, oldest first
            recent = memory.records(user_id=self.user_id)[-self.k:]
            texts = [record.text for record in recent]
            handle = MemoryHandle(self.user_id, tuple(record.fact_id for record in recent))
        if not texts:
            return ""
        if self.as_text:
            return "\n".join(f"- {text}" for text in texts)
        return RECENT_HANDLES.marker(handle)

    def _write(self, messages: list[ChatMessage]) -> None:
        turns = [{"role": m.role.value, "content": m.content} for m in messages
                 if m.role in (MessageRole.USER, MessageRole.ASSISTANT)
                 and isinstance(m.content, str) and m.content.strip()]
        if turns:
            expires = (None if self.expire_after_minutes is None
                       else time.time() + self.expire_after_minutes * 60.0)
            get_memory(self.memory_name).add(user_id=self.user_id, session_id=self.session_id,
                                             messages=turns, expiration_date=expires)


class KVStaticBlock(_UserBlock):
    """Facts always in context (LlamaIndex's StaticMemoryBlock), pinned and served as KV."""

    name: str = Field(default="kv_static", description="The block's name in the prompt.")
    description: str | None = Field(
        default="Facts about the user that are always in context, injected as KV.")
    static_content: tuple[str, ...] = Field(
        default=(), description="Facts pinned for the user on the first read (a stored one is "
        "pinned, not repeated).")
    as_text: bool = Field(default=False,
                          description="Contribute the facts' text instead of a KV marker.")
    _added: bool = PrivateAttr(default=False)

    def get(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any) -> str:
        """The user's pinned facts, as one marker (or their text)."""
        memory = get_memory(self.memory_name)
        if not self._added and self.static_content:
            memory.add(user_id=self.user_id, texts=list(self.static_content), pinned=True)
        self._added = True
        pinned = memory.pinned(user_id=self.user_id)
        if not pinned:
            return ""
        if self.as_text:
            return "\n".join(f"- {memory.get(user_id=self.user_id, fact_id=f).text}"
                             for f in pinned)
        return RECENT_HANDLES.marker(MemoryHandle(self.user_id, tuple(pinned)))

    def put(self, messages: list[ChatMessage]) -> None:
        """Nothing: static content is not written by the conversation."""

    async def _aget(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any
                    ) -> str:
        return await asyncio.to_thread(self.get, messages)

    async def _aput(self, messages: list[ChatMessage]) -> None:
        return None
