"""KVMemoryBase: the state and behaviour shared by the LangChain and LlamaIndex memories.

Serializable state only (user, session, k, window, the conversation's turns) lives in pydantic
fields; the live Memory is a private attribute or is looked up by `memory_name` in the
registry, so dumps, JSON and pickle keep every turn and never try to carry an engine.

Every turn goes to the memory layer (Memory.add: stored, its content encoded once as a fact
after the turns before it). A read builds ONE handle: the user's top-k facts for the query,
then the last `recent_turns` turns' facts in conversation order.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator
from typing_extensions import TypedDict

from inferscale_engine.checks import FACT_ROLES, check_role, has_visible
from inferscale_engine.facts import FactId, MemoryHandle
from inferscale_integrations.handles import make_handle_message
from inferscale_integrations.registry import DEFAULT_NAME, claim_name, get_memory

if TYPE_CHECKING:
    from inferscale_engine.memory import Memory



class TurnRecord(TypedDict):
    """One conversation message as kept in the memory object (plain JSON types)."""

    role: str
    """system, user, assistant or tool."""
    content: str
    fact_ids: list[int]
    """The facts the memory layer made of the content, in order: usually one; several for a
    turn longer than max_fact_tokens; none for a tool result or a blank message."""


class KVMemoryBase(BaseModel):
    """Conversation turns written to the memory layer, read back as one KV handle."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    user_id: str = Field(min_length=1)
    """Whose memory this is: every write and read is scoped to this user."""
    session_id: str | None = None
    """Conversation the turns belong to (the memory layer encodes a turn after its session's
    earlier turns)."""
    k: int = Field(default=5, ge=0)
    """Facts retrieved per read by similarity to the current input."""
    recent_turns: int = Field(default=8, ge=0)
    """Last turns always in the handle, in conversation order, after the top-k facts."""
    memory_name: str = Field(default=DEFAULT_NAME, min_length=1)
    """Name of the live Memory in the registry (see register_memory)."""
    handle_role: Literal["user", "system", "assistant"] = "user"
    """Role of the handle message. 'user' by default: some agents drop a leading system
    message that comes from memory."""
    turns: list[TurnRecord] = Field(default_factory=list)
    """The conversation so far, oldest first."""

    _memory: Memory | None = PrivateAttr(default=None)
    _lock: Any = PrivateAttr(default_factory=threading.RLock)

    def __init__(self, memory: Memory | None = None, /, **data: Any) -> None:
        """Build from fields; `memory` (optional) is the live Memory to use.

        A Memory passed here is also registered as `memory_name` when that name is free,
        so that copies restored from pickle or JSON find it.
        """
        if memory is None and "memory" in data:
            memory = data.pop("memory")
        super().__init__(**data)
        if memory is not None:
            claim_name(memory, self.memory_name)
            self._memory = memory

    @model_validator(mode="before")
    @classmethod
    def _drop_class_name(cls, data: Any) -> Any:
        """LlamaIndex adds 'class_name' to every dump; it is not a field."""
        if isinstance(data, dict) and "class_name" in data:
            data = {k: v for k, v in data.items() if k != "class_name"}
        return data

    # ---- live resources ----------------------------------------------------------------
    @property
    def memory(self) -> Memory:
        """The live Memory (the one passed in, else the one registered as memory_name)."""
        return self._memory if self._memory is not None else get_memory(self.memory_name)

    def __getstate__(self) -> dict[str, Any]:
        state = BaseModel.__getstate__(self)
        # The live Memory and the lock never travel: a restored copy resolves the Memory by
        # memory_name and makes a new lock.
        state["__pydantic_private__"] = {"_memory": None, "_lock": None}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        BaseModel.__setstate__(self, state)
        object.__setattr__(self, "__pydantic_private__",
                           {"_memory": None, "_lock": threading.RLock()})

    # ---- writes ------------------------------------------------------------------------
    def remember(self, messages: Sequence[tuple[str, str]]) -> list[TurnRecord]:
        """Write (role, content) turns to the memory layer and append them; thread-safe.

        Turns are written and appended under one lock, so concurrent writers (LlamaIndex's
        stream_chat thread) keep the conversation order.
        """
        records = [TurnRecord(role=check_role(role, "turn role"), content=str(content), fact_ids=[])
                   for role, content in messages]
        if not records:
            return []
        with self._lock:
            memory = self.memory
            parts = [memory.split_text(r["content"]) if r["role"] in FACT_ROLES
                     else [r["content"]] for r in records]
            payload = [{"role": r["role"], "content": part}
                       for r, pieces in zip(records, parts, strict=True) for part in pieces]
            if any(r["role"] in FACT_ROLES and has_visible(r["content"]) for r in records):
                results = iter(memory.add(user_id=self.user_id, session_id=self.session_id,
                                          messages=payload))
                for record, pieces in zip(records, parts, strict=True):
                    if record["role"] in FACT_ROLES:  # Memory.add: one fact per non-blank part
                        record["fact_ids"] = [int(next(results).fact_id) for part in pieces
                                              if has_visible(part)]
            else:
                memory.add_turns(user_id=self.user_id, session_id=self.session_id,
                                 messages=payload)
            self.turns = [*self.turns, *records]
        return records

    def clear_turns(self) -> None:
        """Forget the conversation held here; the user's long-term facts stay in the Memory."""
        with self._lock:
            self.turns = []

    # ---- reads -------------------------------------------------------------------------
    def handle_for(self, query: str | None, pending: int = 0) -> MemoryHandle:
        """Top-k facts for `query`, then the recent turns' facts (oldest first).

        Args:
            query: what to retrieve by; None or blank: recent turns only.
            pending: trailing turns not yet answered; they are sent as text by the caller,
                so they are left out of the handle.
        """
        with self._lock:
            answered = self.turns[:len(self.turns) - pending]
            skipped = {f for t in self.turns[len(answered):] for f in t["fact_ids"]}
        with_facts = [t for t in answered if t["fact_ids"]]
        window = [f for t in with_facts[-self.recent_turns:] for f in t["fact_ids"]
                  ] if self.recent_turns else []
        recent = list(dict.fromkeys(reversed(window)))[::-1]  # a repeated fact: latest place
        top: list[int] = []
        if query and has_visible(query) and self.k:
            # Ask for more: facts already in the window or still pending do not count.
            found = self.memory.search(user_id=self.user_id, query=query,
                                       k=self.k + len(recent) + len(skipped))
            top = [int(f.fact_id) for f in found.facts
                   if f.fact_id not in recent and f.fact_id not in skipped][:self.k]
        facts = top + recent
        return MemoryHandle(self.user_id, tuple(FactId(f) for f in facts))

    def handle_message_parts(self, query: str | None, pending: int = 0
                             ) -> tuple[str, dict[str, object]]:
        """Marker text and additional_kwargs of the handle message for `query`."""
        return make_handle_message(self.handle_for(query, pending))

    def pending_turns(self) -> int:
        """Trailing turns after the last assistant turn (a question not yet answered)."""
        with self._lock:
            roles = [t["role"] for t in self.turns]
        for count, role in enumerate(reversed(roles)):
            if role == "assistant":
                return count
        return len(roles)

    def last_user_text(self) -> str | None:
        """Content of the latest user turn, if any."""
        with self._lock:
            for turn in reversed(self.turns):
                if turn["role"] == "user" and has_visible(turn["content"]):
                    return turn["content"]
        return None
