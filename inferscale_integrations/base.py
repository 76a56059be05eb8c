"""KVMemoryBase: the state and behaviour shared by the LangChain and LlamaIndex memories.

Serializable state only (user, session, k, window, the conversation's turns) lives in pydantic
fields; the live Memory is a private attribute or is looked up by `memory_name` in the
registry, so dumps, JSON and pickle keep every turn and never try to carry an engine.

Every turn goes to the memory layer (Memory.add: stored, its content encoded once as a fact
after the turns before it). A read builds ONE handle: the user's top-k facts for the query,
then the last `recent_turns` turns' facts in conversation order.

Remote mode (base_url set): turns go to an `inferscale serve` server (POST /v1/memories; a
question with its answer) and a read returns no handle: the server retrieves the user's facts
itself for each chat request (chat_openai / openai_like point a client at it). The API key is
never a field: dumps, JSON and pickle leave it out, and a restored copy reads
INFERSCALE_API_KEY.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from typing_extensions import TypedDict

from inferscale_engine.checks import FACT_ROLES, check_role, has_visible
from inferscale_engine.facts import MemoryHandle
from inferscale_integrations.client import MemoryClient, api_url
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
    base_url: str | None = None
    """The `inferscale serve` server holding this memory (remote mode), e.g.
    http://127.0.0.1:8000; None: the local Memory registered as memory_name."""
    num_sent_turns: int = Field(default=0, ge=0)
    """Remote mode: leading turns already written to the server (the rest await an answer)."""

    _memory: Memory | None = PrivateAttr(default=None)
    _lock: Any = PrivateAttr(default_factory=threading.RLock)
    _api_key: str | None = PrivateAttr(default=None)
    _client: MemoryClient | None = PrivateAttr(default=None)

    def __init__(self, memory: Memory | None = None, /, **data: Any) -> None:
        """Build from fields; `memory` (optional) is the live Memory to use.

        A Memory passed here is also registered as `memory_name` when that name is free,
        so that copies restored from pickle or JSON find it. In remote mode (base_url=...),
        `api_key=` is the server's key for this user (default: $INFERSCALE_API_KEY).
        """
        if memory is None and "memory" in data:
            memory = data.pop("memory")
        api_key = data.pop("api_key", None)
        super().__init__(**data)
        if self.base_url is None and api_key is not None:
            raise ValueError("api_key is for a server: pass base_url='http://host:port' too")
        if self.base_url is not None and memory is not None:
            raise ValueError("pass either a Memory (local) or base_url (a server), not both")
        self._api_key = api_key
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

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str | None) -> str | None:
        if value is not None:
            api_url(value)
        return value

    # ---- live resources ----------------------------------------------------------------
    @property
    def memory(self) -> Memory:
        """The live Memory (the one passed in, else the one registered as memory_name)."""
        if self.base_url is not None:
            raise ValueError(f"this KVMemory lives on the server {self.base_url}; it has no "
                             "local Memory (use .client for the server's memory API)")
        return self._memory if self._memory is not None else get_memory(self.memory_name)

    @property
    def client(self) -> MemoryClient:
        """The server's memory API (remote mode), opened on first use."""
        if self.base_url is None:
            raise ValueError("this KVMemory is local; pass base_url=... for a server")
        with self._lock:
            if self._client is None or self._client.base_url != api_url(self.base_url):
                self._client = MemoryClient(self.base_url, self._api_key)
            return self._client

    def __getstate__(self) -> dict[str, Any]:
        state = BaseModel.__getstate__(self)
        # The live Memory, the lock, the API key and the connection never travel: a restored
        # copy resolves the Memory by memory_name, reads INFERSCALE_API_KEY, makes a new lock.
        state["__pydantic_private__"] = {"_memory": None, "_lock": None, "_api_key": None,
                                         "_client": None}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        BaseModel.__setstate__(self, state)
        object.__setattr__(self, "__pydantic_private__",
                           {"_memory": None, "_lock": threading.RLock(), "_api_key": None,
                            "_client": None})

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
        if self.base_url is not None:
            with self._lock:
                self._send([*self.turns, *records])
            return records
        with self._lock:
            memory = self.memory
            parts = [memory.split_text(r["content"]) if r["role"] in FACT_ROLES
                     else [r["content"]] for r in records]
            payload = [{"role": r["role"], "content": part}
                       for r, pieces in zip(records, parts, strict=True) for part in pieces]
            if any(r["role"] in FACT_ROLES and has_visible(r["content"]) for r in records):
                owner = [i for i, pieces in enumerate(parts) for _ in pieces]  # payload -> record
                for result in memory.add(user_id=self.user_id, session_id=self.session_id,
                                         messages=payload):
                    assert result.turn is not None  # a fact made of a message
                    records[owner[result.turn]]["fact_ids"].append(int(result.fact_id))
            else:
                memory.add_turns(user_id=self.user_id, session_id=self.session_id,
                                 messages=payload)
            self.turns = [*self.turns, *records]
        return records

    def _send(self, turns: list[TurnRecord]) -> None:
        """Remote mode: write the turns up to the last answer, then keep `turns`.

        A question not answered yet is written with its answer: written first, it would come
        back from the server as one of the session's recent facts on its own request.
        """
        answered = max((i + 1 for i, t in enumerate(turns) if t["role"] == "assistant"),
                       default=0)
        unsent = turns[self.num_sent_turns:answered]
        if unsent:
            fact_ids = self.client.add_messages(
                user_id=self.user_id, session_id=self.session_id,
                messages=[{"role": t["role"], "content": t["content"]} for t in unsent])
            for turn, ids in zip(unsent, fact_ids, strict=True):
                turn["fact_ids"] = [int(f) for f in ids]
        self.turns = turns
        self.num_sent_turns = max(self.num_sent_turns, answered)

    def clear_turns(self) -> None:
        """Forget the conversation held here; the user's long-term facts stay in the Memory."""
        with self._lock:
            self.turns = []
            self.num_sent_turns = 0

    # ---- reads -------------------------------------------------------------------------
    def handle_for(self, query: str | None, pending: int = 0) -> MemoryHandle:
        """Top-k facts for `query`, then the recent turns' facts (oldest first).

        Args:
            query: what to retrieve by; None or blank: recent turns only.
            pending: trailing turns not yet answered; they are sent as text by the caller,
                so they are left out of the handle.

        Raises:
            ValueError: a remote KVMemory has no handles (the server retrieves the facts).
        """
        if self.base_url is not None:
            raise ValueError("a remote KVMemory makes no handles: the server retrieves the "
                             "user's facts for each chat request")
        with self._lock:
            answered = self.turns[:len(self.turns) - pending]
            skipped = {f for t in self.turns[len(answered):] for f in t["fact_ids"]}
        with_facts = [t for t in answered if t["fact_ids"]]
        window = [f for t in with_facts[-self.recent_turns:] for f in t["fact_ids"]
                  ] if self.recent_turns else []
        recent = list(dict.fromkeys(reversed(window)))[::-1]  # a repeated fact: latest place
        return self.memory.handle_for(user_id=self.user_id, query=query, k=self.k,
                                      recent=recent, exclude=sorted(skipped))

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
