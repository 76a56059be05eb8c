"""The memory verbs as MCP tools (the official `mcp` SDK's MCPServer), written for a model to call.

  add_memory        remember facts about the user
  search_memories   the memories most relevant to a query (as of a date, if given)
  list_memories     every current memory (as of a date; or every stored one)
  get_memory        one memory by id
  update_memory     correct a memory's wording
  supersede_memory  a fact changed: the newer one replaces it, the older one stays as history
  delete_memory     forget a memory
  memory_history    a memory's changes

Each tool acts for ONE user, the session's: `inferscale mcp --user-id` (stdio), or on `inferscale
serve` the user the API key and the X-User-Id header name (mcp_http.py). No tool takes a user
id and an argument a tool does not declare is refused, so no argument reaches another user; a
memory id of another user's is answered as unknown. Bad arguments and refused calls come back
as tool results with isError set and a message that says what to do; the server keeps serving.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from typing import Annotated, Any, cast

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase
from mcp.types import ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field

from inferscale_engine.errors import FactNotFoundError, InferScaleError
from inferscale_engine.server.mcp_backends import MemoryVerbs, Opening

SERVER_NAME = "inferscale-memory"
INSTRUCTIONS = (
    "Long-term memory of the user this session belongs to. Search it before answering "
    "questions that may depend on what the user said earlier; add short, self-contained facts "
    "worth keeping; when a fact changes (a new address, a new job), supersede the old memory "
    "instead of adding a contradicting one.")

UserOf = Callable[[Context], str]
"""The session's user for a tool call (raises ToolError when the session names none)."""

MemoryId = Annotated[int, Field(ge=1, description="The memory's id, as add_memory, "
                                "search_memories or list_memories returned it.")]
When = Annotated[str | None, Field(description=(
    "An ISO 8601 date ('2024-05-01') or date and time ('2024-05-01T09:30:00Z'; UTC unless "
    "an offset is given)."), max_length=64)]
Metadata = Annotated[dict[str, Any] | None, Field(description=(
    "Optional key-value pairs stored with the memory (e.g. {\"topic\": \"travel\"})."))]


class MemoryRecord(BaseModel):
    """One memory."""

    id: int = Field(description="The memory's id.")
    memory: str = Field(description="The remembered fact.")
    score: float | None = Field(None, description="Cosine similarity to the query (search "
                                                  "results only; higher is closer).")
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: str | None = Field(None, description="When it was stored (ISO 8601, UTC).")
    updated_at: str | None = Field(None, description="When its text last changed.")
    valid_from: str | None = Field(None, description="When the fact became true, if it was "
                                                     "given; else created_at.")
    valid_to: str | None = Field(None, description="When a newer memory superseded it; null "
                                                   "while it is current.")
    superseded_by: int | None = Field(None, description="The id of the memory that "
                                                        "superseded it.")
    expires_at: str | None = Field(None, description="When it stops being served, if set.")


class MemoryList(BaseModel):
    """Memories, as a search or a listing returned them."""

    results: list[MemoryRecord]
    total: int = Field(description="How many matched before `limit` was applied.")


class AddedMemory(BaseModel):
    """What add_memory did with one text."""

    id: int = Field(description="The new memory's id; for DUPLICATE, the existing one's.")
    memory: str
    event: str = Field(description="'ADD': stored. 'DUPLICATE': not stored, an almost "
                                   "identical memory exists (its id is given).")


class AddedMemories(BaseModel):
    """add_memory's results, one per text, in order."""

    results: list[AddedMemory]


class Deleted(BaseModel):
    """delete_memory's result."""

    deleted: int = Field(description="The id of the memory deleted.")


class Superseded(BaseModel):
    """supersede_memory's result."""

    superseded: int = Field(description="The id of the memory that is no longer current.")
    replaced_by: MemoryRecord | None = Field(description="The new memory, when a text was "
                                                         "given.")


class HistoryEntry(BaseModel):
    """One change of a memory."""

    event: str = Field(description="ADD, UPDATE, SUPERSEDE, DELETE or EXPIRE.")
    old_memory: str | None
    new_memory: str | None
    created_at: str = Field(description="When it happened (ISO 8601, UTC).")


class History(BaseModel):
    """memory_history's result."""

    memory_id: int
    events: list[HistoryEntry] = Field(description="Oldest first.")


def build_server(backend: Opening, user_of: UserOf) -> MCPServer:
    """An MCPServer whose tools call `backend` for the user `user_of` names."""

    async def call(ctx: Context, verb: str, **kwargs: Any) -> Any:
        user_id = user_of(ctx)
        try:
            verbs: MemoryVerbs = await backend.get()
        except Exception as exc:  # noqa: BLE001 - any failure to open is the tool's answer
            raise ToolError(f"the memory could not be opened ({type(exc).__name__}: {exc}); "
                            "see the server's log") from None
        try:
            return await anyio.to_thread.run_sync(partial(getattr(verbs, verb),
                                                          user_id=user_id, **kwargs))
        except InferScaleError as exc:
            raise ToolError(_message(exc, kwargs.get("fact_id"))) from None

    async def add_memory(
            ctx: Context,
            texts: Annotated[list[Annotated[str, Field(min_length=1, max_length=8192)]], Field(
                min_length=1, max_length=100, description=(
                    "The facts to remember, one short self-contained statement each, e.g. "
                    "[\"The user is vegetarian.\", \"The user's sister Ana lives in Porto.\"]"))],
            metadata: Metadata = None,
            timestamp: Annotated[When, Field(description=(
                "When the facts became true, if not now (ISO 8601 date or date-time)."))] = None,
            expiration_date: Annotated[When, Field(description=(
                "When the facts stop being true and should no longer be served (ISO 8601 date "
                "or date-time)."))] = None) -> AddedMemories:
        """Remember facts about the user for later conversations.

        Store short facts that will matter later (preferences, people, plans, decisions), not
        whole conversations. A text almost identical to a stored memory is not stored again
        (event DUPLICATE). If a fact replaces one already stored, use supersede_memory instead.
        """
        results = await call(ctx, "add", texts=texts, metadata=metadata, timestamp=timestamp,
                             expiration_date=expiration_date)
        return AddedMemories(results=[AddedMemory(id=int(r.fact_id), memory=r.text,
                                                  event=r.event) for r in results])

    async def search_memories(
            ctx: Context,
            query: Annotated[str, Field(min_length=1, max_length=8192, description=(
                "What to look for, in natural language, e.g. 'where does the user live'."))],
            limit: Annotated[int, Field(ge=1, le=100, description=(
                "The most memories to return."))] = 5,
            as_of: Annotated[When, Field(description=(
                "Search the memories that were true at this time (superseded ones included), "
                "e.g. to answer 'where did I live in 2021'. Omit for the current ones."))] = None
            ) -> MemoryList:
        """Find the user's memories most relevant to a query, best first.

        Use it before answering anything that may depend on what the user told you earlier.
        """
        items = await call(ctx, "search", query=query, k=limit, as_of=as_of)
        return MemoryList(results=[_record(i) for i in items], total=len(items))

    async def list_memories(
            ctx: Context,
            as_of: Annotated[When, Field(description=(
                "List the memories that were true at this time instead of the current ones."))
                             ] = None,
            include_superseded: Annotated[bool, Field(description=(
                "List every stored memory, superseded ones included (not with as_of)."))
                                          ] = False,
            limit: Annotated[int, Field(ge=1, le=1000, description=(
                "The most memories to return: the most recent ones."))] = 100) -> MemoryList:
        """List the user's current memories, oldest first."""
        items = await call(ctx, "get_all", as_of=as_of, include_superseded=include_superseded)
        return MemoryList(results=[_record(i) for i in items[-limit:]], total=len(items))

    async def get_memory(ctx: Context, memory_id: MemoryId) -> MemoryRecord:
        """Read one memory by id, with its metadata and times."""
        return _record(await call(ctx, "get", fact_id=memory_id))

    async def update_memory(
            ctx: Context, memory_id: MemoryId,
            text: Annotated[str, Field(min_length=1, max_length=8192, description=(
                "The corrected text of the memory."))],
            metadata: Annotated[Metadata, Field(description=(
                "New metadata; omit to keep the current metadata."))] = None) -> MemoryRecord:
        """Correct a memory's wording in place (a typo, a clearer phrasing).

        When the fact itself changed (the user moved, changed jobs), use supersede_memory, which
        keeps the old fact as history for questions about the past.
        """
        await call(ctx, "update", fact_id=memory_id, text=text, metadata=metadata)
        return _record(await call(ctx, "get", fact_id=memory_id))

    async def supersede_memory(
            ctx: Context, memory_id: MemoryId,
            text: Annotated[str | None, Field(min_length=1, max_length=8192, description=(
                "The fact that is true now, e.g. 'The user lives in Lisbon.'; omit when the "
                "old fact simply stopped being true."))] = None,
            timestamp: Annotated[When, Field(description=(
                "When the change happened, if not now."))] = None,
            metadata: Annotated[Metadata, Field(description=(
                "Metadata of the new memory; omit to keep the old memory's."))] = None
            ) -> Superseded:
        """Record that a remembered fact changed: the new fact replaces it from now on.

        The old memory is kept as history (list_memories or search_memories with as_of still
        find it) and stops being served as current.
        """
        result = await call(ctx, "supersede", fact_id=memory_id, text=text,
                            timestamp=timestamp, metadata=metadata)
        new = None if result is None else _record(await call(ctx, "get",
                                                             fact_id=int(result.fact_id)))
        return Superseded(superseded=memory_id, replaced_by=new)

    async def delete_memory(ctx: Context, memory_id: MemoryId) -> Deleted:
        """Forget a memory for good (its history keeps the deletion).

        Use it when the user asks you to forget something or a memory is wrong; when a fact
        merely changed, use supersede_memory.
        """
        await call(ctx, "delete", fact_ids=[memory_id])
        return Deleted(deleted=memory_id)

    async def memory_history(ctx: Context, memory_id: MemoryId) -> History:
        """Show how a memory changed: when it was added, updated, superseded or deleted."""
        events = await call(ctx, "history", fact_id=memory_id)
        return History(memory_id=memory_id, events=[
            HistoryEntry(event=e.event, old_memory=e.old_text, new_memory=e.new_text,
                         created_at=_iso(e.created_at) or "") for e in events])

    read = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    tools = [
        _strict(add_memory, ToolAnnotations(read_only_hint=False, destructive_hint=False,
                                            open_world_hint=False)),
        _strict(search_memories, read), _strict(list_memories, read),
        _strict(get_memory, read),
        _strict(update_memory, ToolAnnotations(read_only_hint=False, destructive_hint=True,
                                               idempotent_hint=True, open_world_hint=False)),
        _strict(supersede_memory, ToolAnnotations(read_only_hint=False,
                                                  destructive_hint=False,
                                                  open_world_hint=False)),
        _strict(delete_memory, ToolAnnotations(read_only_hint=False, destructive_hint=True,
                                               idempotent_hint=True, open_world_hint=False)),
        _strict(memory_history, read)]
    return MCPServer(SERVER_NAME, instructions=INSTRUCTIONS, tools=tools, log_level="WARNING",
                     lifespan=_opening(backend))


def _opening(backend: Opening) -> Any:
    """The server's lifespan: start opening the backend when serving starts."""
    @asynccontextmanager
    async def lifespan(_server: MCPServer) -> Any:
        backend.start()
        yield {}

    return lifespan


def _strict(fn: Callable[..., Any], annotations: ToolAnnotations) -> Tool:
    """A Tool of `fn` that refuses arguments it does not declare (additionalProperties false).

    The SDK's argument models ignore unknown names; a misspelled option, or a `user_id` meant
    to reach another user, must fail loudly instead.
    """
    tool = Tool.from_function(fn, description=inspect.cleandoc(fn.__doc__ or ""),
                              annotations=annotations)
    loose = tool.fn_metadata.arg_model
    strict = cast("type[ArgModelBase]", type(loose.__name__, (loose,), {
        "model_config": ConfigDict(**{**loose.model_config, "extra": "forbid"})}))
    tool.fn_metadata.arg_model = strict
    tool.parameters = strict.model_json_schema(by_alias=True)
    return tool


def _message(exc: InferScaleError, fact_id: Any) -> str:
    """A tool error's text: what failed and what to do."""
    status = getattr(exc, "status", None)  # MemoryServerError: the server's HTTP status
    if isinstance(exc, FactNotFoundError) or status == 404:
        return (f"no memory with id {fact_id} among this user's memories; find ids with "
                "search_memories or list_memories")
    return str(exc)


def _iso(seconds: float | None) -> str | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC).isoformat()


def _record(item: Any) -> MemoryRecord:
    """A MemoryItem as the tools return it (times in ISO 8601)."""
    return MemoryRecord(id=int(item.fact_id), memory=item.text, score=item.score,
                        metadata=dict(item.metadata or {}), created_at=_iso(item.created_at),
                        updated_at=_iso(item.updated_at), valid_from=_iso(item.valid_from),
                        valid_to=_iso(item.valid_to),
                        superseded_by=None if item.superseded_by is None
                        else int(item.superseded_by), expires_at=_iso(item.expires_at))
