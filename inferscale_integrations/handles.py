"""How memory handles travel from a memory's read to a chat-model wrapper.

A read (load_memory_variables / get) returns ONE handle message. Its additional_kwargs carry
``{"kv_handles": [handle.to_dict()]}`` and its text is a short opaque marker,
``[[inferscale:<id>]]``, so that string templates (ConversationChain's PROMPT, LlamaIndex's
condense prompt) still carry the handle. A marker resolves through a bounded, process-local
registry of recent handles; ids are random, so text typed by a user cannot name another user's
handle by guessing. The wrappers collect handles from call kwargs, additional_kwargs and
markers, strip the markers, drop the messages that carried nothing else, and merge what they
found into one handle of one user.
"""

from __future__ import annotations

import re
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from inferscale_engine.errors import HandleError
from inferscale_engine.facts import FactId, MemoryHandle

HANDLES_KEY = "kv_handles"
"""Key of the handle list in message additional_kwargs and in call kwargs."""
MARKER_RE = re.compile(r"\[\[inferscale:([A-Za-z0-9_-]{6,40})\]\]")


class HandleRegistry:
    """Recent handles by marker id (least recently made dropped first). Thread-safe."""

    def __init__(self, capacity: int = 4096) -> None:
        self._capacity = capacity
        self._handles: OrderedDict[str, MemoryHandle] = OrderedDict()
        self._lock = threading.Lock()

    def marker(self, handle: MemoryHandle) -> str:
        """A new marker text naming `handle`."""
        marker_id = secrets.token_urlsafe(9)
        with self._lock:
            self._handles[marker_id] = handle
            while len(self._handles) > self._capacity:
                self._handles.popitem(last=False)
        return f"[[inferscale:{marker_id}]]"

    def resolve(self, marker_id: str) -> MemoryHandle | None:
        """The handle a marker id names, or None if it is unknown or was dropped."""
        with self._lock:
            return self._handles.get(marker_id)


RECENT_HANDLES = HandleRegistry()
"""The process's registry of marker ids (markers are meaningful only in the process that made
them; handles in additional_kwargs and kwargs travel anywhere)."""


@dataclass(frozen=True, slots=True)
class ChatTurn:
    """One framework message reduced to what the engine needs, plus the handles it carried."""

    role: str
    """system, user, assistant or tool."""
    content: str
    handles: object = None
    """The message's additional_kwargs['kv_handles'] (any form as_handles accepts)."""


@dataclass(slots=True)
class PreparedChat:
    """A chat ready for Engine.generate: markers stripped, handles merged."""

    messages: list[dict[str, str]]
    handle: MemoryHandle | None
    num_unknown_markers: int = 0
    """Markers whose handle this process does not know (made elsewhere, or dropped)."""
    carriers: list[int] = field(default_factory=list)
    """Indexes of the input turns dropped because they carried only a handle."""


def make_handle_message(handle: MemoryHandle) -> tuple[str, dict[str, object]]:
    """Text and additional_kwargs of the ONE message that carries `handle`."""
    return RECENT_HANDLES.marker(handle), {HANDLES_KEY: [handle.to_dict()]}


def is_handle_message(content: object, additional_kwargs: Mapping[str, object] | None) -> bool:
    """True if a message is a handle carrier (only markers in its text, handles attached)."""
    if not additional_kwargs or HANDLES_KEY not in additional_kwargs:
        return False
    return not isinstance(content, str) or not MARKER_RE.sub("", content).strip()


def as_handles(value: object) -> list[MemoryHandle]:
    """Handles from None, a MemoryHandle, its to_dict() form, or a list of those.

    Raises:
        HandleError: `value` holds something that is not a handle.
    """
    if value is None:
        return []
    if isinstance(value, MemoryHandle):
        return [value]
    if isinstance(value, Mapping):
        return [MemoryHandle.from_dict(value)]
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [h for item in value for h in as_handles(item)]
    handle = getattr(value, "handle", None)  # a SearchResult
    if isinstance(handle, MemoryHandle):
        return [handle]
    raise HandleError(f"{HANDLES_KEY} must be MemoryHandles or their to_dict() forms, got "
                      f"{type(value).__name__}")


def merge_handles(handles: Iterable[MemoryHandle], user_id: str | None = None
                  ) -> MemoryHandle | None:
    """One handle with every fact of `handles` (first occurrence order), or None if none.

    Raises:
        HandleError: the handles belong to several users, or not to `user_id` when given.
    """
    handles = list(handles)
    if not handles:
        return None
    users = {h.user_id for h in handles}
    if len(users) > 1:
        raise HandleError(f"one request got memory handles of several users "
                          f"{sorted(users)!r:.120}; send one user's handles per request")
    (owner,) = users
    if user_id is not None and owner != user_id:
        raise HandleError(f"the memory handle belongs to {owner!r:.40}, but this model serves "
                          f"user_id={user_id!r:.40}; use that user's KVMemory")
    scored = all(len(h.scores) == len(h.fact_ids) for h in handles)
    merged: dict[FactId, float] = {}
    for handle in handles:
        for i, fact_id in enumerate(handle.fact_ids):
            merged.setdefault(FactId(fact_id), handle.scores[i] if scored else 0.0)
    return MemoryHandle(owner, tuple(merged), tuple(merged.values()) if scored else ())


def strip_markers(text: str) -> tuple[str, list[MemoryHandle], int]:
    """`text` without markers, the handles they name, and how many were unknown."""
    found, unknown = [], 0
    for marker_id in MARKER_RE.findall(text):
        handle = RECENT_HANDLES.resolve(marker_id)
        if handle is None:
            unknown += 1
        else:
            found.append(handle)
    return (MARKER_RE.sub("", text) if found or unknown else text), found, unknown


def prepare_chat(turns: Sequence[ChatTurn], extra_handles: object = None,
                 user_id: str | None = None) -> PreparedChat:
    """Collect every handle, strip markers, drop pure carriers, merge leading system turns.

    Args:
        turns: the framework's messages, in order.
        extra_handles: handles passed as call kwargs (kv_handles=...).
        user_id: if given, every handle must be this user's.

    Raises:
        HandleError: a carrier holds no valid handle, or the handles' users disagree.
    """
    handles = as_handles(extra_handles)
    messages: list[dict[str, str]] = []
    carriers, unknown = [], 0
    for i, turn in enumerate(turns):
        attached = as_handles(turn.handles)
        text, named, missing = strip_markers(turn.content)
        handles += attached + named
        unknown += missing
        if (attached or named or missing) and not text.strip():
            carriers.append(i)
            continue
        if turn.role == "system" and messages and all(m["role"] == "system" for m in messages):
            messages[-1]["content"] += "\n\n" + text  # the preamble takes one system message
            continue
        messages.append({"role": turn.role, "content": text})
    return PreparedChat(messages, merge_handles(handles, user_id), unknown, carriers)
