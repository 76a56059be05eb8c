"""MemoryClient: the memory REST API of `inferscale serve`, with Memory's verbs.

The remote KVMemory (KVMemory(base_url=...)) writes through it, and apps use it to add, search
and delete a user's facts on a server. Every verb is scoped by `user_id=`, as on Memory; writes
return once the server has stored the facts and encoded their KV. The API key is sent as
`Authorization: Bearer`; without one, the INFERSCALE_API_KEY environment variable is used.
Importing this module imports no framework, torch or vLLM (httpx comes with the openai SDK).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

from inferscale_engine.errors import InferScaleError
from inferscale_engine.facts import FactId
from inferscale_engine.memory.types import (
    AddResult,
    AddStatus,
    HistoryEvent,
    ImportResult,
    MemoryItem,
)

API_KEY_ENV = "INFERSCALE_API_KEY"
"""Environment variable read when no api_key is given (and by restored KVMemory copies)."""
USER_HEADER = "X-User-Id"
"""The header naming the user a chat request is for (the server reads it first)."""


class MemoryServerError(InferScaleError):
    """The server refused a call (status 4xx/5xx) or could not be reached (status None)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


RemoteFact = MemoryItem
"""Deprecated alias (issue 53): MemoryClient returns MemoryItem, the one fact shape Memory
returns too (inferscale_engine.memory.types). Its fields start with RemoteFact's, in order."""


def api_url(base_url: str) -> str:
    """The server's OpenAI-style base URL (ending in /v1) from its address, with or without."""
    url = base_url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"base_url {base_url!r} must be an http(s) URL of `inferscale serve`, "
                         "e.g. http://127.0.0.1:8000")
    return url if url.endswith("/v1") else url + "/v1"


def resolve_api_key(api_key: str | None) -> str | None:
    """`api_key`, else $INFERSCALE_API_KEY, else None (a server without --api-keys)."""
    return api_key or os.environ.get(API_KEY_ENV) or None


class MemoryClient:
    """A user-scoped client of the memory REST API (thread-safe; close() when done)."""

    def __init__(self, base_url: str, api_key: str | None = None, *,
                 timeout_s: float = 120.0) -> None:
        """Nothing is sent until the first call.

        Args:
            base_url: the server, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine).
            api_key: a key from the server's --api-keys file (default: $INFERSCALE_API_KEY).
            timeout_s: per call; a write waits for the facts' KV to be encoded.
        """
        httpx = _httpx()
        self.base_url = api_url(base_url)
        key = resolve_api_key(api_key)
        self._http = httpx.Client(
            base_url=self.base_url, timeout=timeout_s,
            headers={"Authorization": f"Bearer {key}"} if key else {})

    # ---- writes ------------------------------------------------------------------------
    def add(self, *, user_id: str, texts: Sequence[str] | None = None,
            messages: Sequence[Mapping[str, str]] | None = None, session_id: str | None = None,
            metadata: Mapping[str, Any] | None = None, agent_id: str | None = None,
            run_id: str | None = None, timestamp: Any = None, expiration_date: Any = None,
            wait: bool = True, pinned: bool = False) -> list[AddResult]:
        """Remember facts (texts) or a conversation's turns (messages); one result per fact.

        agent_id / run_id tag them (mem0's scopes); timestamp is when they became true and
        expiration_date when the server stops serving them (each a date, datetime, ISO string
        or epoch seconds). wait=False: the server answers once the facts are stored (status
        'PENDING'); their embedding and KV follow (add_status). MemoryServerError 429: its
        queue is full. pinned=True: in every answer of the user, before the retrieved
        memories (Memory.add).
        """
        scope = {"agent_id": agent_id, "run_id": run_id, "timestamp": _json_time(timestamp),
                 "expiration_date": _json_time(expiration_date), "pinned": pinned or None}
        return [result for _, result in self._add(user_id, texts, messages, session_id,
                                                  metadata, scope, wait)]

    def add_status(self, *, user_id: str, fact_id: int) -> AddStatus:
        """How an asynchronous add of a fact went (Memory.add_status, over HTTP)."""
        self._owned(user_id, fact_id)
        event = self._call("GET", f"/memories/events/{int(fact_id)}")
        result = event["results"][0]
        return AddStatus(FactId(int(event["id"])), event["status"], result["event"],
                         FactId(int(result["duplicate_of"])) if "duplicate_of" in result
                         else None, event.get("error"))

    def add_messages(self, *, user_id: str, session_id: str | None,
                     messages: Sequence[Mapping[str, str]]) -> list[list[FactId]]:
        """Record conversation turns; per message, the ids of the facts made of it.

        Several for a turn the server cut; none for a system, tool or blank one.
        """
        per_message: list[list[FactId]] = [[] for _ in messages]
        for index, result in self._add(user_id, None, messages, session_id, None, {}):
            per_message[index].append(result.fact_id)
        return per_message

    def update(self, *, user_id: str, fact_id: int, text: str,
               metadata: Mapping[str, Any] | None = None) -> MemoryItem:
        """Replace a memory's text (the server rebuilds its KV)."""
        self._owned(user_id, fact_id)
        body = {"text": text, **({"metadata": dict(metadata)} if metadata is not None else {})}
        return _fact(self._call("PUT", f"/memories/{int(fact_id)}", json=body))

    def supersede(self, *, user_id: str, fact_id: int, text: str | None = None,
                  timestamp: Any = None, metadata: Mapping[str, Any] | None = None
                  ) -> AddResult | None:
        """Replace a fact by a newer one, the old one kept as history (Memory.supersede).

        Without text the fact just stops being true (at timestamp, default now). Returns the
        new fact's result (event 'UPDATE'), None without text.
        """
        self._owned(user_id, fact_id)
        body = {"text": text, "timestamp": _json_time(timestamp),
                **({"metadata": dict(metadata)} if metadata is not None else {})}
        found = self._call("POST", f"/memories/{int(fact_id)}/supersede", json=body)["result"]
        if found is None:
            return None
        return AddResult(FactId(int(found["id"])), found["memory"], found["event"],
                         supersedes=(FactId(int(fact_id)),))

    def delete(self, *, user_id: str, fact_ids: Sequence[int]) -> None:
        """Delete memories, one call each."""
        for fact_id in fact_ids:
            self._owned(user_id, fact_id)
            self._call("DELETE", f"/memories/{int(fact_id)}")

    def reset(self, *, user_id: str) -> int:
        """Delete every memory and turn of a user (admin keys only); the number deleted."""
        return int(self._call("POST", "/memories/reset", json={"user_id": user_id})["deleted"])

    # ---- reads -------------------------------------------------------------------------
    def search(self, *, user_id: str, query: str, k: int = 5, agent_id: str | None = None,
               run_id: str | None = None, as_of: Any = None) -> list[MemoryItem]:
        """The user's k memories most similar to `query` (of an agent, a run), best first.

        as_of (a date, datetime, ISO string or epoch seconds): among the facts true then.
        """
        body = {"query": query, "user_id": user_id, "top_k": k, "agent_id": agent_id,
                "run_id": run_id, **({"as_of": _json_time(as_of)} if as_of is not None else {})}
        return [_fact(r) for r in self._call("POST", "/memories/search", json=body)["results"]]

    def get_all(self, *, user_id: str, agent_id: str | None = None,
                run_id: str | None = None, as_of: Any = None,
                include_superseded: bool = False) -> list[MemoryItem]:
        """Every current memory of a user (added in agent_id / run_id, if given), oldest first.

        as_of (a date, datetime or ISO string): the memories true then; include_superseded:
        every stored one.
        """
        params = {k: v for k, v in (("user_id", user_id), ("agent_id", agent_id),
                                    ("run_id", run_id), ("as_of", _json_time(as_of)),
                                    ("include_superseded",
                                     "true" if include_superseded else None)) if v is not None}
        return [_fact(r) for r in self._call("GET", "/memories", params=params)["results"]]

    def get(self, *, user_id: str, fact_id: int) -> MemoryItem:
        """One memory with its metadata."""
        fact = _fact(self._call("GET", f"/memories/{int(fact_id)}"))
        if fact.user_id != user_id:
            raise MemoryServerError(f"memory {fact_id} is not user {user_id!r:.40}'s", 404)
        return fact

    def history(self, *, user_id: str, fact_id: int) -> list[HistoryEvent]:
        """A memory's events (ADD, UPDATE, SUPERSEDE, DELETE ...), oldest first."""
        events = self._call("GET", f"/memories/{int(fact_id)}/history")["results"]
        if any(e["user_id"] != user_id for e in events):
            raise MemoryServerError(f"memory {fact_id} is not user {user_id!r:.40}'s", 404)
        return [HistoryEvent(int(e["id"]), int(e["memory_id"]), str(e["user_id"]), e["event"],
                             e["old_memory"], e["new_memory"], float(e["created_at"]))
                for e in events]

    # ---- export / import ---------------------------------------------------------------
    def export(self, *, user_id: str) -> list[str]:
        """Every stored fact of the user with its history, as JSON Lines (Memory.export)."""
        response = self._request("GET", "/memories/export", params={"user_id": user_id})
        return response.text.splitlines(keepends=True)

    def import_(self, *, user_id: str, text: str, format: str | None = None) -> ImportResult:
        """Import a file's content into the user's memory (Memory.import_, over HTTP).

        The server's request body limit bounds `text` (8 MiB by default).
        """
        params = {"user_id": user_id, **({"format": format} if format else {})}
        body = self._request("POST", "/memories/import", params=params,
                             content=text.encode("utf-8"),
                             headers={"Content-Type": "application/x-ndjson"}).json()
        return ImportResult(body["format"], body["imported"] + body["skipped"],
                            tuple(FactId(i) for i in body["ids"]), body["skipped"])

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals ---------------------------------------------------------------------
    def _add(self, user_id: str, texts: Sequence[str] | None,
             messages: Sequence[Mapping[str, str]] | None, session_id: str | None,
             metadata: Mapping[str, Any] | None, scope: Mapping[str, Any] | None = None,
             wait: bool = True) -> list[tuple[int, AddResult]]:
        body: dict[str, Any] = {"user_id": user_id, "session_id": session_id,
                                **{k: v for k, v in (scope or {}).items() if v is not None},
                                **({} if wait else {"async_mode": True})}
        if texts is not None:
            body["texts"] = list(texts)
        if messages is not None:
            body["messages"] = [dict(m) for m in messages]
        if metadata is not None:
            body["metadata"] = dict(metadata)
        return [(int(r.get("message_index", 0)),
                 AddResult(FactId(int(r["id"])), r["memory"], r["event"], r.get("similarity"),
                           r.get("message_index"), status=r.get("status")))
                for r in self._call("POST", "/memories", json=body)["results"]]

    def _owned(self, user_id: str, fact_id: int) -> None:
        """Raise unless `fact_id` is `user_id`'s (the server checks the key's users too)."""
        self.get(user_id=user_id, fact_id=fact_id)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        httpx = _httpx()
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise MemoryServerError(f"cannot reach the InferScale server at {self.base_url} "
                                    f"({type(exc).__name__}: {exc}); is `inferscale serve` "
                                    "running there?") from None
        if response.status_code >= 400:
            raise MemoryServerError(f"{method} {path}: {response.status_code} "
                                    f"{_error_message(response)}", response.status_code)
        return response


def memory_options(user_id: str, *, session_id: str | None = None, k: int | None = None,
                   recent_facts: int | None = None, write: bool | None = None
                   ) -> dict[str, Any]:
    """The `memory` object of a chat request body (extra_body={"memory": ...}).

    The user and the options given (None: the server's default).
    """
    options: dict[str, Any] = {"user_id": user_id, "session_id": session_id, "k": k,
                               "recent_facts": recent_facts, "write": write}
    return {name: value for name, value in options.items() if value is not None}


@dataclass(frozen=True)
class ClientSettings:
    """What an OpenAI client needs to answer as one user of `inferscale serve`."""

    model: str
    url: str
    """The OpenAI base URL (…/v1)."""
    api_key: str
    headers: dict[str, str]
    """The caller's default headers plus X-User-Id (it survives a per-call extra_body)."""
    memory: dict[str, Any]
    """The body's `memory` object (extra_body={"memory": ...})."""


def client_settings(*, base_url: str, user_id: str, api_key: str | None,
                    session_id: str | None, k: int | None, recent_facts: int | None,
                    write: bool | None, model: str | None,
                    default_headers: Mapping[str, str] | None) -> ClientSettings:
    """Resolve the key, the model (GET /v1/models when None), the headers and the options."""
    key = resolve_api_key(api_key)
    return ClientSettings(
        model=model or served_model(base_url, key), url=api_url(base_url),
        api_key=key or "no-key", headers={**(default_headers or {}), USER_HEADER: user_id},
        memory=memory_options(user_id, session_id=session_id, k=k, recent_facts=recent_facts,
                              write=write))


def served_model(base_url: str, api_key: str | None = None) -> str:
    """The model name the server serves (GET /v1/models), for clients that must name it."""
    httpx = _httpx()
    key = resolve_api_key(api_key)
    try:
        response = httpx.get(api_url(base_url) + "/models", timeout=30.0,
                             headers={"Authorization": f"Bearer {key}"} if key else {})
    except httpx.TransportError as exc:
        raise MemoryServerError(f"cannot reach the InferScale server at {base_url} "
                                f"({type(exc).__name__}: {exc})") from None
    if response.status_code >= 400:
        raise MemoryServerError(f"GET /v1/models: {response.status_code} "
                                f"{_error_message(response)}", response.status_code)
    return str(response.json()["data"][0]["id"])


def _httpx() -> Any:
    try:
        import httpx
    except ImportError as exc:  # pragma: no cover - httpx comes with openai and vLLM
        raise ImportError("the InferScale server client needs httpx; install it with: pip "
                          "install 'inferscale-kv[client]'") from exc
    return httpx


def _fact(record: Mapping[str, Any]) -> MemoryItem:
    return MemoryItem(FactId(int(record["id"])), str(record["user_id"]), str(record["memory"]),
                      record.get("score"), dict(record.get("metadata") or {}),
                      record.get("session_id"), record.get("created_at"),
                      record.get("updated_at"), agent_id=record.get("agent_id"),
                      run_id=record.get("run_id"), valid_from=record.get("valid_from"),
                      valid_to=record.get("valid_to"),
                      superseded_by=None if record.get("superseded_by") is None
                      else FactId(int(record["superseded_by"])),
                      expires_at=record.get("expires_at"),
                      pinned=bool(record.get("pinned", False)))


def _json_time(value: Any) -> Any:
    """An expiration_date as JSON: dates and datetimes as ISO 8601 (naive: UTC, as served)."""
    return value.isoformat() if isinstance(value, date) else value


def _error_message(response: Any) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300]
