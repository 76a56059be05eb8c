"""Who a request is for, and what a chat or completion asks of the memory.

A request names its user in one or more channels: the header `X-User-Id` (UTF-8 bytes), and in
chat and completion bodies the OpenAI field `user` or `memory.user_id`
(`extra_body={"memory": {...}}` in the openai SDK); memory routes take `user_id` (body or
query) or `filters.user_id`. Every channel is normalized (checks.check_user_id: NFC) BEFORE
any access decision, each is checked against the API key, and channels that name different
users are refused: the id a key is checked for is exactly the id the memory serves.

`memory` options: enabled (default true), k (facts retrieved, default the server's), write
(save the exchange as conversation turns after the response), session_id, recent_facts (the
session's last facts, besides the top-k), add (facts to remember, stored before the answer:
one round trip, and a write that passes through any OpenAI-compatible proxy, vllm-router
included, with the client's headers), expiration_date (when the facts of `add` stop being
served: an ISO 8601 date or time, or seconds since the epoch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferscale_engine.checks import check_session, check_time, check_user_id
from inferscale_engine.errors import InferScaleError
from inferscale_engine.server.auth import HttpError, Principal

USER_HEADER = "x-user-id"
STRIPPED_FIELDS = ("kv_transfer_params", "vllm_xargs")
"""Client-sent fields that reach vLLM's engine: the server sets them, a client never does.
(A client's cache_salt is kept: the seam combines it with the tenant's or the user's salt.)"""
_OPTIONS = ("enabled", "k", "write", "session_id", "user_id", "recent_facts", "add",
            "expiration_date")


@dataclass(frozen=True, slots=True)
class MemoryOptions:
    """What one request asks of the memory."""

    user_id: str | None
    enabled: bool = True
    k: int = 5
    write: bool = False
    session_id: str | None = None
    recent_facts: int = 0
    add: tuple[str, ...] = ()
    expiration_date: float | None = None
    """When the facts of `add` stop being served (seconds since the epoch)."""

    @property
    def active(self) -> bool:
        """True if the request is served with the user's memory."""
        return self.enabled and self.user_id is not None


def identify(request: Any, headers: Mapping[str, str], default_k: int,
             principal: Principal | None = None) -> MemoryOptions:
    """The request's user and memory options (see the module docstring).

    Raises:
        HttpError: 400 for a malformed user id or option, or two channels naming different
            users; 422 for a user id that is not a string; 403 for a user the key may not reach.
    """
    raw = (request.model_extra or {}).get("memory") if hasattr(request, "model_extra") else None
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping) or set(raw) - set(_OPTIONS):
        raise HttpError(400, f"'memory' must be an object with keys from {_OPTIONS}, got "
                             f"{raw!r:.80}")
    user_id = resolve_user([("X-User-Id", header_user(headers)),
                            ("user", getattr(request, "user", None)),
                            ("memory.user_id", raw.get("user_id"))], principal)
    try:
        session = raw.get("session_id")
        session_id = check_session(session) if session is not None else None
    except InferScaleError as exc:
        raise HttpError(400, f"memory.{exc}") from None
    add = _texts(raw.get("add", []))
    if add and user_id is None:
        raise HttpError(400, "memory.add needs a user: send the X-User-Id header (or `user`)")
    expires = _expiration(raw.get("expiration_date"), add)
    return MemoryOptions(user_id, _flag(raw, "enabled", True), _count(raw, "k", default_k),
                         _flag(raw, "write", False), session_id, _count(raw, "recent_facts", 0),
                         add, expires)


def _expiration(value: object, add: tuple[str, ...]) -> float | None:
    """memory.expiration_date: when the facts of memory.add expire (400 if not a time)."""
    if value is None:
        return None
    if not add:
        raise HttpError(400, "memory.expiration_date applies to the facts of memory.add; "
                             "send it with memory.add")
    try:
        return check_time(value, "memory.expiration_date", day_end=True)
    except InferScaleError as exc:
        raise HttpError(400, str(exc)) from None


def header_user(headers: Mapping[str, str]) -> str | None:
    """The X-User-Id header as text: its bytes read as UTF-8 (None when absent).

    Starlette hands header values over decoded as Latin-1; the bytes are recovered and read as
    UTF-8, the encoding clients send.

    Raises:
        HttpError: 400 if the bytes are not UTF-8.
    """
    value = headers.get(USER_HEADER)
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise HttpError(400, "the X-User-Id header is not UTF-8; send the user id's UTF-8 "
                             "bytes") from None


def resolve_user(named: Sequence[tuple[str, object]], principal: Principal | None
                 ) -> str | None:
    """The one user a request names, normalized and allowed (None: it names none).

    Args:
        named: (channel, value) for each identity channel; None or "" means not given.
        principal: the API key's, or None on a server without keys.

    Raises:
        HttpError: 422 for a value that is not a string; 400 for a malformed id or channels
            that name different users; 403 for a user the key may not reach.
    """
    found: dict[str, str] = {}
    for channel, value in named:
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise HttpError(422, f"{channel} must be a string (a user id), got "
                                 f"{type(value).__name__}")
        try:
            user_id = check_user_id(value)
        except InferScaleError as exc:
            raise HttpError(400, f"{channel}: {exc}") from None
        if principal is not None:
            principal.check_user(user_id)
        found.setdefault(user_id, channel)
    if len(found) > 1:
        channels = " and ".join(f"{channel} {user!r:.40}" for user, channel in found.items())
        raise HttpError(400, f"the request names different users ({channels}); name one user, "
                             "in one place")
    return next(iter(found), None)


def strip_client_fields(request: Any) -> list[str]:
    """Remove kv_transfer_params and vllm_xargs a client sent; their names."""
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


def _texts(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise HttpError(400, f"memory.add must be a list of strings (facts), got {value!r:.60}")
    return tuple(value)
