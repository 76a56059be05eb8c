"""Who a chat or completion request is for, and what it asks of the memory.

The user comes from the header `X-User-Id`, else the body's `user` (the OpenAI field), else
`memory.user_id` in the body (`extra_body={"memory": {...}}` in the openai SDK). `memory`
options: enabled (default true), k (facts retrieved, default the server's), write (save the
exchange as conversation turns after the response), session_id, recent_facts (the session's
last facts, besides the top-k).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferscale_engine.checks import check_text, check_user_id
from inferscale_engine.errors import InferScaleError
from inferscale_engine.server.auth import HttpError

USER_HEADER = "x-user-id"
STRIPPED_FIELDS = ("kv_transfer_params", "cache_salt", "vllm_xargs")
"""Client-sent fields that reach vLLM's engine: the server sets them, a client never does."""
_OPTIONS = ("enabled", "k", "write", "session_id", "user_id", "recent_facts")


@dataclass(frozen=True, slots=True)
class MemoryOptions:
    """What one request asks of the memory."""

    user_id: str | None
    enabled: bool = True
    k: int = 5
    write: bool = False
    session_id: str | None = None
    recent_facts: int = 0

    @property
    def active(self) -> bool:
        """True if the request is served with the user's memory."""
        return self.enabled and self.user_id is not None


def identify(request: Any, headers: Mapping[str, str], default_k: int) -> MemoryOptions:
    """The request's user and memory options (see the module docstring).

    Raises:
        HttpError: 400 for a malformed user id or option.
    """
    raw = (request.model_extra or {}).get("memory") if hasattr(request, "model_extra") else None
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping) or set(raw) - set(_OPTIONS):
        raise HttpError(400, f"'memory' must be an object with keys from {_OPTIONS}, got "
                             f"{raw!r:.80}")
    user = headers.get(USER_HEADER) or getattr(request, "user", None) or raw.get("user_id")
    try:
        user_id = check_user_id(user) if user is not None else None
        session = raw.get("session_id")
        session_id = check_text(session, "memory.session_id") if session is not None else None
    except InferScaleError as exc:
        raise HttpError(400, str(exc)) from None
    return MemoryOptions(user_id, _flag(raw, "enabled", True), _count(raw, "k", default_k),
                         _flag(raw, "write", False), session_id, _count(raw, "recent_facts", 0))


def strip_client_fields(request: Any) -> list[str]:
    """Remove kv_transfer_params, cache_salt and vllm_xargs a client sent; their names."""
    stripped = []
    for name in STRIPPED_FIELDS:
        if getattr(request, name, None) is not None:
            setattr(request, name, None)
            stripped.append(name)
    return stripped


def _flag(raw: Mapping[str, Any], name: str, default: bool) -> bool:
    value = raw.get(name, default)
    if not isinstance(value, bool):
        raise HttpError(400, f"memory.{name} must be true or false, got {value!r:.40}")
    return value


def _count(raw: Mapping[str, Any], name: str, default: int) -> int:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 256:
        raise HttpError(400, f"memory.{name} must be an int in [0, 256], got {value!r:.40}")
    return value
