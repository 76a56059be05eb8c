"""The inspector's JSON routes (/ui/api), behind the server's API keys.

  GET    /ui/api/whoami                  the key's tenant, whether it is an admin key
  GET    /ui/api/users?q=                the users the key reaches (with facts or turns)
  GET    /ui/api/user?user_id=           the user id as the server reads it, if the key reaches it
  GET    /ui/api/memories?user_id=       a user's memories: times, session, tokens, KV tier
  GET    /ui/api/history?id=             one memory's ADD / UPDATE / DELETE events
  POST   /ui/api/search                  {user_id, query, top_k}: memories with scores
  POST   /ui/api/ask                     {user_id, question, k, max_tokens}: the retrieved
                                         facts, the answer in kv and in text mode
  POST   /ui/api/memories/{id}           {text}: replace a memory's text
  DELETE /ui/api/memories/{id}           delete one memory
  DELETE /ui/api/memories?user_id=&confirm=   delete every memory of a user (confirm: its id)
  GET    /ui/api/sessions?user_id=       a user's conversations
  GET    /ui/api/turns?user_id=&session_id=   a conversation's turns (none: turns without one)
  GET    /ui/api/server                  the server's metrics (admin keys: they are server-wide)

Users are resolved and checked as on every memory route (routes._user: normalized, then the
key's users); a memory id the key may not see is 404. Every POST and DELETE also passes
page.check_same_origin (a browser's cross-site request is refused).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from inferscale_engine.server.auth import HttpError
from inferscale_engine.server.routes import (
    _admin,
    _call,
    _memory,
    _owned,
    _principal,
    _user,
    found_by_id,
)
from inferscale_engine.server.ui import panel
from inferscale_engine.server.ui.page import check_same_origin

MAX_USERS = 500
"""Users listed at most (filter with q= for others)."""
MAX_TURNS = 500
"""Turns of a conversation shown at most (its last ones)."""

router = APIRouter(prefix="/ui/api", include_in_schema=False,
                   dependencies=[Depends(check_same_origin)])  # every POST and DELETE


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SearchBody(_Body):
    """POST /ui/api/search."""

    user_id: str
    query: str
    top_k: int = Field(default=10, ge=1, le=100)


class AskBody(_Body):
    """POST /ui/api/ask."""

    user_id: str
    question: str
    k: int | None = Field(default=None, ge=0, le=64)
    max_tokens: int = Field(default=48, ge=1, le=512)


class UpdateBody(_Body):
    """POST /ui/api/memories/{id}."""

    text: str


@router.get("/whoami")
async def whoami(request: Request) -> dict[str, Any]:
    """Who the key is (the page's sign-in: a wrong key never gets here, 401)."""
    principal = _principal(request)
    if principal is None:  # a server without keys (loopback only): everything
        return {"tenant": None, "admin": True, "keys": False, "users": ["*"]}
    return {"tenant": principal.tenant, "admin": principal.admin, "keys": True,
            "users": list(principal.users)}


@router.get("/users")
async def users(request: Request, q: str = Query(default="", max_length=256)
                ) -> dict[str, Any]:
    """The users this key reaches, sorted; `q` keeps those containing it."""
    principal = _principal(request)
    everyone = await _call(_memory(request).users)
    mine = [u for u in everyone if (principal is None or principal.allows(u))
            and q.lower() in u.lower()]
    return {"users": mine[:MAX_USERS], "total": len(mine)}


@router.get("/user")
async def user(request: Request, user_id: str | None = Query(default=None)) -> dict[str, Any]:
    """The user id normalized, or 403: what the page checks before it shows a user."""
    return {"user_id": _user(request, ("user_id", user_id))}


@router.get("/memories")
async def memories(request: Request, user_id: str | None = Query(default=None)
                   ) -> dict[str, Any]:
    """A user's memories, oldest first, each with where its KV is now."""
    user_id = _user(request, ("user_id", user_id))
    memory = _memory(request)
    records = await _call(memory.records, user_id=user_id)
    tiers = await _call(memory.engine.tiers_of, fact_ids=[r.fact_id for r in records])
    return {"user_id": user_id, "memories": [
        {"id": int(r.fact_id), "memory": r.text, "created_at": r.created_at,
         "updated_at": r.updated_at, "session_id": r.session_id, "agent_id": r.agent_id,
         "run_id": r.run_id, "expires_at": r.expires_at, "pinned": r.pinned,
         "metadata": r.metadata,
         "tokens": len(r.token_ids),
         "tiers": list(tiers.get(r.fact_id, ()))} for r in records]}


@router.get("/history")
async def history(request: Request, memory_id: int = Query(alias="id", ge=1)
                  ) -> dict[str, Any]:
    """One memory's events, oldest first (also a deleted memory's)."""
    user_id = await _owned(request, memory_id)
    events = await _call(_memory(request).history, user_id=user_id, fact_id=memory_id)
    return {"id": memory_id, "user_id": user_id, "events": [
        {"event": e.event, "old": e.old_text, "new": e.new_text, "at": e.created_at}
        for e in events]}


@router.post("/search")
async def search(request: Request, body: SearchBody) -> dict[str, Any]:
    """A user's memories most similar to a query, best first, with their cosine scores."""
    user_id = _user(request, ("user_id", body.user_id))
    found = await _call(_memory(request).search, user_id=user_id, query=body.query,
                        k=body.top_k)
    return {"user_id": user_id, "results": _hits(found)}


@router.post("/ask")
async def ask(request: Request, body: AskBody) -> dict[str, Any]:
    """Retrieve for a question, then answer it with those facts as KV and as text.

    Both answers go through Memory.generate (the serving path of every adapter) with the same
    handle, greedy, one after the other; TTFT is vLLM's (arrival to first token). Nothing is
    written back. Asked again, a question's prompt is found in vLLM's prefix cache (the KV of
    the first ask is still there): prefix_cached_tokens says so, and fewer are injected.
    """
    from vllm import SamplingParams

    user_id = _user(request, ("user_id", body.user_id))
    memory = _memory(request)
    k = request.app.state.inferscale.default_k if body.k is None else body.k
    found = await _call(memory.search, user_id=user_id, query=body.question, k=k)
    sampling = SamplingParams(max_tokens=body.max_tokens, temperature=0.0)
    answers = {}
    for mode in ("kv", "text"):
        out = await _call(memory.generate, user_id=user_id, query=body.question,
                          handle=found.handle, mode=mode, sampling=sampling)
        answers[mode] = {"answer": out.text, "ttft_ms": out.ttft_ms,
                         "latency_ms": out.latency_ms, "prompt_tokens": out.num_prompt_tokens,
                         "injected_tokens": out.num_injected_tokens,
                         "prefix_cached_tokens": max(0, out.num_cached_tokens
                                                     - out.num_injected_tokens),
                         "prefilled_tokens": out.num_prompt_tokens - out.num_cached_tokens,
                         "plan_status": out.plan_status,
                         "fallback": out.fallback, "repaired_facts": out.num_repaired_facts}
    return {"user_id": user_id, "question": body.question, "k": k,
            "facts": _hits(found), **answers}


def _hits(found: Any) -> list[dict[str, Any]]:
    """A search's hits for the page: id, text, cosine score and the signal that found it."""
    by = found_by_id(found)
    return [{"id": int(f.fact_id), "memory": f.text, "score": score,
             "found_by": by.get(int(f.fact_id))} for f, score in found.hits]


@router.post("/memories/{memory_id}")
async def update(request: Request, memory_id: int, body: UpdateBody) -> dict[str, Any]:
    """Replace a memory's text (its KV is encoded again)."""
    user_id = await _owned(request, memory_id)
    fact = await _call(_memory(request).update, user_id=user_id, fact_id=memory_id,
                       text=body.text)
    return {"id": int(fact.fact_id), "memory": fact.text, "user_id": user_id}


@router.delete("/memories/{memory_id}")
async def delete(request: Request, memory_id: int) -> dict[str, Any]:
    """Delete one memory (its history keeps the DELETE)."""
    user_id = await _owned(request, memory_id)
    await _call(_memory(request).delete, user_id=user_id, fact_ids=[memory_id])
    return {"deleted": [memory_id], "user_id": user_id}


@router.delete("/memories")
async def delete_all(request: Request, user_id: str | None = Query(default=None),
                     confirm: str | None = Query(default=None)) -> dict[str, Any]:
    """Delete every memory of a user, in one transaction; `confirm` must repeat the user id.

    The memories only (the user's turns and the history stay): any key that reaches the user
    may delete each of them anyway. A whole user (turns, history) is an admin's reset.
    """
    user_id = _user(request, ("user_id", user_id))
    if confirm is None or _user(request, ("confirm", confirm)) != user_id:
        raise HttpError(400, "confirm= must repeat the user id: deleting every memory of a "
                             "user cannot be undone")
    memory = _memory(request)
    ids = [int(r.fact_id) for r in await _call(memory.records, user_id=user_id)]
    if ids:
        await _call(memory.delete, user_id=user_id, fact_ids=ids)
    return {"deleted": ids, "user_id": user_id}


@router.get("/sessions")
async def sessions(request: Request, user_id: str | None = Query(default=None)
                   ) -> dict[str, Any]:
    """A user's conversations (stored turns), the most recently active first."""
    user_id = _user(request, ("user_id", user_id))
    found = await _call(_memory(request).sessions, user_id=user_id)
    return {"user_id": user_id, "sessions": [
        {"session_id": s.session_id, "turns": s.num_turns, "first_at": s.first_at,
         "last_at": s.last_at} for s in found]}


@router.get("/turns")
async def turns(request: Request, user_id: str | None = Query(default=None),
                session_id: str | None = Query(default=None)) -> dict[str, Any]:
    """A conversation's last turns, oldest first."""
    user_id = _user(request, ("user_id", user_id))
    found = await _call(_memory(request).turns, user_id=user_id, session_id=session_id,
                        limit=MAX_TURNS)
    return {"user_id": user_id, "session_id": session_id, "turns": [
        {"id": t.turn_id, "role": t.role, "content": t.content, "at": t.created_at}
        for t in found]}


@router.get("/server")
async def server(request: Request) -> dict[str, Any]:
    """The server's metrics, for the panel (admin keys: they are server-wide)."""
    _admin(request, "the server panel")
    return await asyncio.to_thread(panel.snapshot)
