"""The memory REST API, in mem0's request and response shapes where they fit.

  POST   /v1/memories            {messages | texts, user_id, agent_id, run_id, metadata,
                                 session_id, timestamp, expiration_date, async_mode} -> results
                                 (a long turn becomes several facts: message_index says whose;
                                 at most --max-add-facts facts per call, else 413)
  GET    /v1/memories/events/{id}  an asynchronous add's status, per fact (event id = fact id)
  GET    /v1/memories?user_id=&agent_id=&run_id=&as_of=&include_superseded=   the user's
                                 memories (of an agent, a run; true at as_of; all)
  GET    /v1/memories/{id}       one memory       PUT {text, metadata}   DELETE
  GET    /v1/memories/{id}/history   its ADD / UPDATE / SUPERSEDE / DELETE events
  POST   /v1/memories/{id}/supersede {text, timestamp, metadata}: replaced by a newer fact
                                 (without text: no longer true), the old one kept as history
  POST   /v1/memories/search     {query, user_id (or filters.user_id), agent_id, run_id,
                                 filters, top_k, threshold, search_mode, as_of,
                                 hide_older_versions}: filters as mem0's (agent_id, run_id,
                                 metadata); search_mode 'vector' or 'hybrid'; as_of: among the
                                 facts true then; each result's score (cosine) and found_by
                                 (what found it); older_versions: the ids left out as older
                                 versions of a result (a question about now)
  DELETE /v1/memories?user_id=&agent_id=&run_id=   the memories of an agent or run; without
                                 them every memory of the user (admin)
  POST   /v1/memories/reset      {user_id}: memories and turns of a user (admin)
  GET    /v1/memories/export, POST /v1/memories/import   server/transfer_api.py
Memories carry agent_id, run_id, expires_at, valid_from, valid_to and superseded_by (times in
seconds since the epoch; an expired memory is never returned). Writes are durable and their KV
encoded before the call returns ("pending": false); with async_mode (mem0's name) they return
once stored ("pending": true, each result's "event_id" and "status": "PENDING"), the embedding
and KV queued (429 when the queue is full). A key reaches only its own users (403; 404 for a
memory id it may not see); the user may also come from the X-User-Id header
(server/identity.py: how channels are read and normalized).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from functools import partial
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from inferscale_engine.errors import FactNotFoundError, InferScaleError
from inferscale_engine.memory.search.filters import check_filter, check_size
from inferscale_engine.server.auth import HttpError, Principal, http_error
from inferscale_engine.server.identity import header_user, resolve_user

router = APIRouter(prefix="/v1/memories", tags=["memory"])
ENTITIES = ("user_id", "agent_id", "run_id")
"""mem0's scopes in a filter: the user, and an agent and a run within the user."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AddBody(_Body):
    """POST /v1/memories."""

    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    messages: list[dict[str, Any]] | None = None
    texts: list[str] | None = None
    metadata: dict[str, Any] | None = None
    session_id: str | None = None
    async_mode: bool = False
    """Return once stored; embedding and KV in the background (Memory.add(wait=False))."""
    timestamp: str | float | None = None
    """mem0's: when the facts became true (an ISO 8601 date or time, or epoch seconds)."""
    expiration_date: str | float | None = None
    """mem0's: an ISO 8601 date or time, or seconds since the epoch (memory/expiry.py)."""
    pinned: StrictBool = False
    """In every answer of the user, before the retrieved memories (Memory.add(pinned=True))."""


class UpdateBody(_Body):
    """PUT /v1/memories/{id}: a new text, pinned or unpinned, or both."""

    text: str | None = None
    metadata: dict[str, Any] | None = None
    pinned: StrictBool | None = None
    """True: pin the memory (Memory.pin); False: unpin it; None: leave it."""


class SupersedeBody(_Body):
    """POST /v1/memories/{id}/supersede."""

    text: str | None = None
    timestamp: str | float | None = None
    metadata: dict[str, Any] | None = None


class SearchBody(_Body):
    """POST /v1/memories/search."""

    query: str
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    filters: dict[str, Any] | None = None
    top_k: int = Field(default=5, ge=0, le=1000)
    threshold: float | None = None
    search_mode: str | None = None
    """'vector' or 'hybrid' (Memory.search); None: the server's setting."""
    as_of: str | float | None = None
    """Search among the facts true at this time (superseded ones included)."""
    hide_older_versions: str | None = None
    """'now', 'always' or 'never' (Memory.search); None: the server's setting."""


class ResetBody(_Body):
    """POST /v1/memories/reset."""

    user_id: str | None = None


def _memory(request: Request) -> Any:
    return request.app.state.inferscale.memory


def _principal(request: Request) -> Principal | None:
    return getattr(request.state, "principal", None)


def _user(request: Request, *named: tuple[str, object]) -> str:
    """The user a call is for: `named` channels and X-User-Id (identity.resolve_user)."""
    user_id = resolve_user([*named, ("X-User-Id", header_user(request.headers))],
                           _principal(request))
    if user_id is None:
        raise HttpError(400, "name the user: user_id in the body or query, or X-User-Id")
    return user_id


def _admin(request: Request, what: str) -> None:
    principal = _principal(request)
    if principal is not None:
        principal.check_admin(what)


async def _call(function: Callable[..., Any], pool: Executor | None = None,
                **kwargs: Any) -> Any:
    """Run a Memory call in a thread (of `pool`, else asyncio's); its errors as HTTP errors."""
    try:
        if pool is None:
            return await asyncio.to_thread(function, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(pool, partial(function,
                                                                              **kwargs))
    except InferScaleError as exc:
        raise http_error(exc) from None


def _filter_pool(request: Request, filter: Any) -> Executor | None:
    """The pool a call with this metadata filter runs in (SeamState.filter_pool)."""
    return request.app.state.inferscale.filter_pool if filter else None


async def _owned(request: Request, memory_id: int, event: bool = False) -> str:
    """The owner of a memory id, if this key may reach it.

    event=True: also of an asynchronous add's event whose row is gone (background.py).
    404 when there is none AND when the key may not see it: the answer tells nothing about
    other tenants' ids (neither that they exist nor whose they are).
    """
    owner = await _call(_memory(request).owner_of, fact_id=memory_id)
    if owner is None and event:
        owner = _memory(request).event_owner(memory_id)
    principal = _principal(request)
    if owner is None or (principal is not None and not principal.allows(owner)):
        raise HttpError(404, f"no memory with id {memory_id}", "not_found_error")
    return str(owner)


def _record(fact: Any, stored: Any = None) -> dict[str, Any]:
    out = {"id": int(fact.fact_id), "memory": fact.text, "user_id": fact.user_id}
    if stored is not None:
        out.update(metadata=stored.metadata, session_id=stored.session_id,
                   created_at=stored.created_at, updated_at=stored.updated_at,
                   agent_id=stored.agent_id, run_id=stored.run_id,
                   expires_at=stored.expires_at, valid_from=stored.valid_from,
                   valid_to=stored.valid_to, superseded_by=stored.superseded_by,
                   pinned=stored.pinned)
    return out


def _scope(name: str, given: str | None, ids: dict[str, Any]) -> str | None:
    """An agent or run id named in the body and/or in its filters (400 if they differ)."""
    if given is not None and ids.get(name, given) != given:
        raise HttpError(400, f"{name}={given!r:.60} and filters.{name}={ids[name]!r:.60} "
                        "differ; name it once")
    return given if given is not None else ids.get(name)


def found_by_id(found: Any) -> dict[int, str]:
    """A SearchResult's signal per fact id ('embedding', 'keywords' or 'both')."""
    return {int(f.fact_id): by for (f, _), by in zip(found.hits, found.found_by, strict=False)}


def stored_hits(memory: Any, user_id: str, hits: list[tuple[Any, float]]
                ) -> list[tuple[Any, float]]:
    """The hits' records (metadata, scopes, times), leaving out any deleted since the search."""
    out = []
    for fact, score in hits:
        try:
            out.append((memory.get(user_id=user_id, fact_id=fact.fact_id), score))
        except FactNotFoundError:
            continue
    return out


@router.post("")
async def add(request: Request, body: AddBody) -> dict[str, Any]:
    """Remember facts (texts) or a conversation's turns (messages)."""
    user_id = _user(request, ("user_id", body.user_id))
    state = request.app.state.inferscale
    state.check_add_size(len(body.texts or ()) + len(body.messages or ()))
    wait = not body.async_mode
    if body.messages is not None and body.texts is None:  # long turns are cut, not refused
        indexed = await _call(state.add_messages, user_id=user_id,
                              messages=body.messages, metadata=body.metadata,
                              session_id=body.session_id, agent_id=body.agent_id,
                              run_id=body.run_id, expiration_date=body.expiration_date,
                              timestamp=body.timestamp, wait=wait,
                              pinned=body.pinned)
    else:
        indexed = [(None, r) for r in await _call(
            _memory(request).add, user_id=user_id, texts=body.texts, messages=body.messages,
            metadata=body.metadata, session_id=body.session_id, agent_id=body.agent_id,
            run_id=body.run_id, expiration_date=body.expiration_date,
            timestamp=body.timestamp, wait=wait, pinned=body.pinned)]
    return {"results": [{"id": int(r.fact_id), "memory": r.text, "event": r.event,
                         **({"similarity": r.similarity} if r.similarity else {}),
                         **({"message_index": i} if i is not None else {}),
                         **({"event_id": str(r.fact_id), "status": r.status} if r.status
                            else {})}
                        for i, r in indexed], "pending": not wait}


@router.get("/events/{event_id}")
async def event(request: Request, event_id: int) -> dict[str, Any]:
    """The status of one fact's asynchronous add (its event id is its fact id)."""
    user_id = await _owned(request, event_id, event=True)
    return event_record(await _call(_memory(request).add_status, user_id=user_id,
                                    fact_id=event_id))


def event_record(status: Any) -> dict[str, Any]:
    """An AddStatus as JSON (mem0's event fields where they fit)."""
    results = ([{"id": str(r.fact_id), "event": r.event, "data": {"memory": r.text}}
                for r in status.inferred] if status.event == "INFER" else
               [{"id": str(status.fact_id), "event": status.event,
                 **({"duplicate_of": str(status.duplicate_of)}
                    if status.duplicate_of is not None else {})}])
    return {"id": str(status.fact_id), "event_type": "ADD", "status": status.status,
            "results": results, **({"error": status.error} if status.error else {})}


@router.get("")
async def get_all(request: Request, user_id: str | None = Query(default=None),
                  agent_id: str | None = Query(default=None),
                  run_id: str | None = Query(default=None),
                  as_of: str | None = Query(default=None),
                  include_superseded: bool = Query(default=False)) -> dict[str, Any]:
    """Every current memory of a user (added in agent_id / run_id, if given), oldest first.

    as_of: the memories true then; include_superseded: every stored one.
    """
    user_id = _user(request, ("user_id", user_id))
    found = await _call(_memory(request).records, user_id=user_id, agent_id=agent_id,
                        run_id=run_id, as_of=as_of, include_superseded=include_superseded)
    return {"results": [_record(r, r) for r in found]}


@router.get("/{memory_id}")
async def get_one(request: Request, memory_id: int) -> dict[str, Any]:
    """One memory with its metadata and timestamps."""
    user_id = await _owned(request, memory_id)
    stored = await _call(_memory(request).get, user_id=user_id, fact_id=memory_id)
    return _record(stored, stored)


@router.put("/{memory_id}")
async def update(request: Request, memory_id: int, body: UpdateBody) -> dict[str, Any]:
    """Replace a memory's text (its KV is rebuilt), pin or unpin it."""
    user_id = await _owned(request, memory_id)
    memory = _memory(request)
    if body.text is None and (body.pinned is None or body.metadata is not None):
        raise HttpError(400, "give the memory's new text, or pinned (true or false), or both")
    if body.text is not None:
        await _call(memory.update, user_id=user_id, fact_id=memory_id, text=body.text,
                    metadata=body.metadata)
    if body.pinned is not None:
        await _call(memory.pin if body.pinned else memory.unpin, user_id=user_id,
                    fact_ids=[memory_id])
    stored = await _call(memory.get, user_id=user_id, fact_id=memory_id)
    return _record(stored, stored)


@router.delete("/{memory_id}")
async def delete(request: Request, memory_id: int) -> dict[str, Any]:
    """Delete one memory."""
    user_id = await _owned(request, memory_id)
    await _call(_memory(request).delete, user_id=user_id, fact_ids=[memory_id])
    return {"message": "Memory deleted", "id": memory_id}


@router.get("/{memory_id}/history")
async def history(request: Request, memory_id: int) -> dict[str, Any]:
    """A memory's events, oldest first (a deleted memory's too)."""
    user_id = await _owned(request, memory_id)
    events = await _call(_memory(request).history, user_id=user_id, fact_id=memory_id)
    return {"results": [{"id": e.event_id, "memory_id": e.fact_id, "user_id": e.user_id,
                         "event": e.event, "old_memory": e.old_text, "new_memory": e.new_text,
                         "created_at": e.created_at} for e in events]}


@router.post("/{memory_id}/supersede")
async def supersede(request: Request, memory_id: int, body: SupersedeBody) -> dict[str, Any]:
    """Replace a memory by a newer one (or end it, without text); the old one stays as history."""
    user_id = await _owned(request, memory_id)
    result = await _call(_memory(request).supersede, user_id=user_id, fact_id=memory_id,
                         text=body.text, timestamp=body.timestamp, metadata=body.metadata)
    return {"superseded": memory_id, "result": None if result is None else {
        "id": int(result.fact_id), "memory": result.text, "event": result.event}}


@router.post("/search")
async def search(request: Request, body: SearchBody) -> dict[str, Any]:
    """A user's memories most similar to a query, best first."""
    ids, rest = split_filters(body.filters)
    user_id = _user(request, ("user_id", body.user_id), ("filters.user_id", ids.get("user_id")))
    memory = _memory(request)
    found = await _call(memory.search, _filter_pool(request, rest), user_id=user_id,
                        query=body.query, k=body.top_k, filter=rest or None,
                        agent_id=_scope("agent_id", body.agent_id, ids),
                        run_id=_scope("run_id", body.run_id, ids),
                        search_mode=body.search_mode, as_of=body.as_of,
                        hide_older_versions=body.hide_older_versions)
    hits = [(f, s) for f, s in found.hits if body.threshold is None or s >= body.threshold]
    stored = await _call(stored_hits, memory=memory, user_id=user_id, hits=hits)
    found_by = found_by_id(found)
    return {"results": [{**_record(r, r), "score": score, "found_by": found_by.get(r.fact_id)}
                        for r, score in stored],
            "older_versions": [int(f) for f in found.older_versions]}


@router.delete("")
async def delete_user(request: Request, user_id: str | None = Query(default=None),
                      agent_id: str | None = Query(default=None),
                      run_id: str | None = Query(default=None)) -> dict[str, Any]:
    """The user's memories of an agent or run; without them every memory and turn (admin)."""
    user_id = _user(request, ("user_id", user_id))
    if agent_id is None and run_id is None:
        _admin(request, "deleting a whole user")
    deleted = await _call(_memory(request).delete_all, user_id=user_id, agent_id=agent_id,
                          run_id=run_id)
    return {"message": "Memories deleted", "deleted": deleted}


@router.post("/reset")
async def reset(request: Request, body: ResetBody | None = None) -> dict[str, Any]:
    """Reset a user: every memory and turn (admin keys only)."""
    user_id = _user(request, ("user_id", body.user_id if body is not None else None))
    _admin(request, "resetting a user")
    deleted = await _call(_memory(request).reset, user_id=user_id)
    return {"message": "Memory reset", "deleted": deleted}


def split_filters(filters: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(user/agent/run ids, the metadata filter) of a mem0 filter, checked.

    An AND of entity equalities counts as the flat form. The filter's size and grammar are
    checked here, before the call is queued (memory/search/filters.py: the limits).

    Raises:
        HttpError: 400 for a filter over a limit or not of the grammar, or an agent or run id
            that is not a string.
    """
    try:
        check_size(filters or {})
    except InferScaleError as exc:
        raise http_error(exc) from None
    rest = dict(filters or {})
    ids = {key: rest.pop(key) for key in ENTITIES if key in rest}
    parts = rest.pop("AND", None)
    if not isinstance(parts, list):  # not a list: left for the filter check to refuse
        if parts is not None:
            rest["AND"] = parts
    else:
        kept = []
        for part in parts:
            if isinstance(part, dict) and len(part) == 1 and next(iter(part)) in ENTITIES:
                ids.update(part)
            else:
                kept.append(part)
        if kept:
            rest["AND"] = kept
    for key, value in ids.items():  # the user id is checked with the other channels' (422)
        if key != "user_id" and not isinstance(value, str):
            raise HttpError(400, f"filters.{key} must be a string id, got {value!r:.80}")
    try:
        check_filter(rest)
    except InferScaleError as exc:
        raise http_error(exc) from None
    return ids, rest


def http_error_response(exc: HttpError) -> JSONResponse:
    """The JSON answer of an HttpError."""
    return JSONResponse(exc.body(), status_code=exc.status)
