"""Export and import of a user's memories over REST (Memory.export / Memory.import_).

  GET  /v1/memories/export?user_id=     every stored fact of the user with its history, as
                                        InferScale's JSON Lines (application/x-ndjson)
  POST /v1/memories/import?user_id=&format=   the body is a file (our export, mem0's export or
                                        a LangGraph store dump) -> {format, imported, skipped,
                                        ids}; a bad record is a 400 naming its line, and
                                        nothing is imported; a second import adds nothing

The user is resolved and checked exactly as on the other memory routes (routes._user: the
query or X-User-Id, normalized, then allowed by the key: 403 for another tenant's user). The
body is bounded like every request's (limits.MAX_BODY_BYTES, 413 beyond): import a larger file
with `inferscale import --db` where the store is. This router is included before routes.py's,
whose /v1/memories/{memory_id} would otherwise take these paths.
"""

from __future__ import annotations

import io
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from inferscale_engine.server.auth import HttpError
from inferscale_engine.server.routes import _call, _memory, _user

router = APIRouter(prefix="/v1/memories", tags=["memory"])


@router.get("/export")
async def export(request: Request, user_id: str | None = Query(default=None)
                 ) -> StreamingResponse:
    """Every stored fact of a user (current, superseded, expired) with its history."""
    user_id = _user(request, ("user_id", user_id))
    lines = await _call(_memory(request).export, user_id=user_id)
    return StreamingResponse(lines, media_type="application/x-ndjson", headers={
        "Content-Disposition": 'attachment; filename="memories.jsonl"'})


@router.post("/import")
async def import_(request: Request, user_id: str | None = Query(default=None),
                  format: str | None = Query(default=None)) -> dict[str, Any]:
    """Import a file of facts into a user's memory (the body is the file)."""
    user_id = _user(request, ("user_id", user_id))
    try:
        text = (await request.body()).decode("utf-8")
    except UnicodeDecodeError:
        raise HttpError(400, "the body is not UTF-8; send the file's UTF-8 bytes") from None
    result = await _call(_memory(request).import_, user_id=user_id, file=io.StringIO(text),
                         format=format)
    return {"format": result.format, "imported": len(result.fact_ids),
            "skipped": result.num_skipped, "ids": [int(i) for i in result.fact_ids]}
