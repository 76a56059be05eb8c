"""The routes mem0's own Python client (`mem0ai`'s MemoryClient) calls, on `inferscale serve`.

    MemoryClient(api_key="<an --api-keys key>", host="http://127.0.0.1:8000")

  GET    /v1/ping/                   the key's check at the client's start
  POST   /v3/memories/add/           {messages, user_id, agent_id, run_id, metadata,
                                     async_mode, expiration_date}: async_mode=true answers
                                     once stored, each result with an event_id and status
                                     PENDING
  GET    /v1/event/{event_id}/       an asynchronous add's status (per fact: id = fact id)
  POST   /v3/memories/               get_all: {filters: {user_id, agent_id, run_id, ...}}
  POST   /v3/memories/search/        {query, filters, top_k, threshold, search_mode}
  GET / PUT / DELETE /v1/memories/{id}/          one memory
  GET    /v1/memories/{id}/history/  its ADD / UPDATE / DELETE events
  DELETE /v1/memories/?user_id=&agent_id=&run_id=   delete_all (a whole user: admin keys)

The client sends `Authorization: Token <key>` (accepted like Bearer). Ids are strings on the
wire. Filters name the user (required: a key reaches only its own users, as everywhere), the
agent and run scopes, and metadata conditions (memory/search/filters.py). With `infer=True` the
served model extracts facts and adds, updates or deletes stored ones (memory/infer.py);
otherwise each user or assistant message is stored as a fact.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from inferscale_engine.server.auth import HttpError
from inferscale_engine.server.routes import (
    _admin,
    _call,
    _filter_pool,
    _memory,
    _owned,
    _principal,
    _user,
    event_record,
    split_filters,
    stored_hits,
)

router = APIRouter(tags=["mem0"])


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")  # mem0's platform options we do not use


class AddBody(_Body):
    """POST /v3/memories/add/."""

    messages: list[dict[str, Any]] | str
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    metadata: dict[str, Any] | None = None
    infer: bool | None = None
    async_mode: bool | None = None
    """mem0's platform defaults to true; here false (None) keeps the add synchronous, so a
    search right after it finds the facts (a pending fact is not searchable yet)."""
    expiration_date: str | float | None = None
    """An ISO 8601 date or time, or seconds since the epoch: when the memory expires."""


class ListBody(_Body):
    """POST /v3/memories/."""

    filters: dict[str, Any] | None = None


class SearchBody(_Body):
    """POST /v3/memories/search/."""

    query: str
    filters: dict[str, Any] | None = None
    top_k: int = Field(default=10, ge=0, le=1000)
    threshold: float | None = None
    search_mode: str | None = None
    """'vector' or 'hybrid' (Memory.search); None: the server's setting."""


class UpdateBody(_Body):
    """PUT /v1/memories/{id}/."""

    text: str
    metadata: dict[str, Any] | None = None


def record(stored: Any, score: float | None = None) -> dict[str, Any]:
    """A memory in mem0's shape (string id, ISO times)."""
    out = {"id": str(stored.fact_id), "memory": stored.text, "user_id": stored.user_id,
           "agent_id": stored.agent_id, "run_id": stored.run_id, "metadata": stored.metadata,
           "categories": [], "created_at": _iso(stored.created_at),
           "updated_at": _iso(stored.updated_at), "expiration_date": (
               None if stored.expires_at is None else _iso(stored.expires_at))}
    if score is not None:
        out["score"] = score
    return out


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


def _memory_id(memory_id: str) -> int:
    try:
        value = int(memory_id)
    except ValueError:
        value = -1
    if value < 1:
        raise HttpError(404, f"no memory with id {memory_id!r}", "not_found_error")
    return value


@router.get("/v1/ping/")
async def ping(request: Request) -> dict[str, Any]:
    """What the client reads at start-up; the key was checked before this runs.

    The key's tenant is the client's organization, the server its project.
    """
    principal = _principal(request)
    return {"status": "ok", "org_id": principal.tenant if principal else "local",
            "project_id": "inferscale", "user_email": None}


@router.post("/v3/memories/add/")
async def add(request: Request, body: AddBody) -> dict[str, Any]:
    """Remember a conversation's (or one message's) turns as facts, or what the model infers."""
    user_id = _user(request, ("user_id", body.user_id))
    messages = ([{"role": "user", "content": body.messages}] if isinstance(body.messages, str)
                else body.messages)
    request.app.state.inferscale.check_add_size(len(messages))
    results = await _call(_memory(request).add, user_id=user_id, messages=messages,
                          metadata=body.metadata, agent_id=body.agent_id, run_id=body.run_id,
                          infer=bool(body.infer), wait=not body.async_mode,
                          expiration_date=body.expiration_date)
    return {"results": [{"id": str(r.fact_id), "memory": r.text, "event": r.event,
                         **({"event_id": str(r.fact_id), "status": r.status,
                             "message": "Memory processing has been queued for background "
                                        "execution"} if r.status else {})}
                        for r in results]}


@router.get("/v1/event/{event_id}/")
async def event(request: Request, event_id: str) -> dict[str, Any]:
    """An asynchronous add's status (PENDING, RUNNING, SUCCEEDED, FAILED)."""
    fact_id = _memory_id(event_id)
    user_id = await _owned(request, fact_id, event=True)
    return event_record(await _call(_memory(request).add_status, user_id=user_id,
                                    fact_id=fact_id))


@router.post("/v3/memories/")
async def get_all(request: Request, body: ListBody | None = None,
                  page: int = Query(default=1, ge=1),
                  page_size: int = Query(default=100, ge=1, le=1000)) -> dict[str, Any]:
    """The memories the filters select, oldest first, a page at a time."""
    ids, rest = split_filters(body.filters if body else None)
    user_id = _user(request, ("filters.user_id", ids.get("user_id")))
    found = await _call(_memory(request).records, _filter_pool(request, rest),
                        user_id=user_id, filter=rest or None, agent_id=ids.get("agent_id"),
                        run_id=ids.get("run_id"))
    start = (page - 1) * page_size
    return {"count": len(found), "next": None, "previous": None,
            "results": [record(f) for f in found[start:start + page_size]]}


@router.post("/v3/memories/search/")
async def search(request: Request, body: SearchBody) -> dict[str, Any]:
    """The memories most similar to the query among those the filters select."""
    ids, rest = split_filters(body.filters)
    user_id = _user(request, ("filters.user_id", ids.get("user_id")))
    memory = _memory(request)
    found = await _call(memory.search, _filter_pool(request, rest), user_id=user_id,
                        query=body.query, k=body.top_k, filter=rest or None,
                        agent_id=ids.get("agent_id"), run_id=ids.get("run_id"),
                        search_mode=body.search_mode)
    hits = [(f, s) for f, s in found.hits if body.threshold is None or s >= body.threshold]
    stored = await _call(stored_hits, memory=memory, user_id=user_id, hits=hits)
    return {"results": [record(r, s) for r, s in stored]}


@router.get("/v1/memories/{memory_id}/")
async def get_one(request: Request, memory_id: str) -> dict[str, Any]:
    """One memory."""
    fact_id = _memory_id(memory_id)
    user_id = await _owned(request, fact_id)
    return record(await _call(_memory(request).get, user_id=user_id, fact_id=fact_id))


@router.put("/v1/memories/{memory_id}/")
async def update(request: Request, memory_id: str, body: UpdateBody) -> dict[str, Any]:
    """Replace a memory's text (its KV is rebuilt)."""
    fact_id = _memory_id(memory_id)
    user_id = await _owned(request, fact_id)
    await _call(_memory(request).update, user_id=user_id, fact_id=fact_id, text=body.text,
                metadata=body.metadata)
    return record(await _call(_memory(request).get, user_id=user_id, fact_id=fact_id))


@router.delete("/v1/memories/{memory_id}/")
async def delete(request: Request, memory_id: str) -> dict[str, Any]:
    """Delete one memory."""
    fact_id = _memory_id(memory_id)
    user_id = await _owned(request, fact_id)
    await _call(_memory(request).delete, user_id=user_id, fact_ids=[fact_id])
    return {"message": "Memory deleted successfully!"}


@router.get("/v1/memories/{memory_id}/history/")
async def history(request: Request, memory_id: str) -> list[dict[str, Any]]:
    """A memory's ADD / UPDATE / DELETE events, oldest first."""
    fact_id = _memory_id(memory_id)
    user_id = await _owned(request, fact_id)  # also a deleted memory's owner
    events = await _call(_memory(request).history, user_id=user_id, fact_id=fact_id)
    return [{"id": str(e.event_id), "memory_id": str(e.fact_id), "user_id": e.user_id,
             "event": e.event, "old_memory": e.old_text, "new_memory": e.new_text,
             "created_at": _iso(e.created_at)} for e in events]


@router.delete("/v1/memories/")
async def delete_all(request: Request, user_id: str | None = Query(default=None),
                     agent_id: str | None = Query(default=None),
                     run_id: str | None = Query(default=None)) -> dict[str, Any]:
    """The user's memories of an agent or run; without them the whole user (admin keys)."""
    user_id = _user(request, ("user_id", user_id))
    if agent_id is None and run_id is None:
        _admin(request, "deleting a whole user")
    deleted = await _call(_memory(request).delete_all, user_id=user_id, agent_id=agent_id,
                          run_id=run_id)
    return {"message": "Memories deleted successfully!", "deleted": deleted}

