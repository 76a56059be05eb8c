"""The one seam between vLLM's OpenAI server and the memory: its render step.

MemoryServingChat and MemoryServingCompletion are vLLM's own serving classes. Their
render_*_request lets vLLM validate and render the request, then stores its memory.add facts
and, for a request with a user, retrieves the user's top-k facts, builds [preamble][facts][rest]
from token ids, signs the plan and salts the prompt; everything after (generate, streaming,
tools, usage) is vLLM's, unchanged. create_* wraps the call: identity and access first,
client-sent kv_transfer_params / vllm_xargs stripped, the request salted with its tenant's
salt, then what was served is reported (headers, a `memory` field) and, if asked, the exchange
is written back as conversation turns; a request vLLM refuses after its render has its
memory.add rolled back.

Every prompt is salted (vLLM's prefix cache shares blocks only between prompts of one salt): a
prompt without memory with its API key's tenant_salt, a prompt with a user's memory with its
plan's cache_salt (or, as text, the user's text_salt). A client's own cache_salt is combined
into whichever applies (protocol/plan.py), so no tenant can reach another's blocks, and a
client can still keep its own prompts apart, as vLLM alone allows.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import quote

from inferscale_engine.checks import FACT_ROLES, check_messages, has_visible
from inferscale_engine.config import plan_secret
from inferscale_engine.errors import InferScaleError
from inferscale_engine.memory.fallback import PreparedPrompt
from inferscale_engine.prompting.tool_calls import format_tool_call
from inferscale_engine.protocol.plan import tenant_salt
from inferscale_engine.runtime.generation import RESULT_KEY
from inferscale_engine.server.auth import HttpError, Principal, http_error
from inferscale_engine.server.identity import MemoryOptions, identify, strip_client_fields
from inferscale_engine.server.limits import DEFAULT_MAX_ADD_FACTS
from inferscale_engine.server.vllm_compat import OpenAIServingChat, OpenAIServingCompletion


@dataclass(slots=True)
class RequestScope:
    """One HTTP request's memory state, from create_* through render_* to the response."""

    options: MemoryOptions
    stripped: list[str]
    client_salt: str = ""
    """The client's own cache_salt ("": none), combined into every salt the request gets."""
    prepared: list[PreparedPrompt] = field(default_factory=list)
    question: str = ""
    added: list[Any] = field(default_factory=list)
    """memory.add's AddResults, stored before the answer was prepared."""
    timings: dict[str, float] = field(default_factory=dict)
    """ms per phase of the seam's own work (the Server-Timing header)."""


_SCOPE: contextvars.ContextVar[RequestScope | None] = contextvars.ContextVar(
    "inferscale_scope", default=None)


class SeamState:
    """What the seam and the routes share: the Memory, its defaults, pending write-backs.

    One per server (app.state.inferscale); a request's own state is its RequestScope.
    """

    def __init__(self, memory: Any, default_k: int = 5,
                 max_add_facts: int = DEFAULT_MAX_ADD_FACTS, replica_id: str | None = None,
                 async_adds: bool = True) -> None:
        self.memory = memory
        self.async_adds = async_adds
        """Chat-borne adds (memory.add, write-back) return once stored: Memory.add(wait=False)."""
        self.replica_id = replica_id
        self.default_k = default_k
        self.max_add_facts = max_add_facts
        self.pending: set[asyncio.Task[Any]] = set()
        self.refusals: Counter[int] = Counter()
        """Requests answered with a 4xx status, by status (limits.CountRefusals)."""
        self.secret = plan_secret()
        """The key of the salts (the process's plan secret: the engine's)."""
        self.filter_pool = ThreadPoolExecutor(1, thread_name_prefix="inferscale-filters")
        """Where memory calls with a metadata filter run (routes._call): not in the pool that
        serves every chat's retrieval (asyncio.to_thread), so that no tenant's filters queue
        another tenant's chats."""

    def scope(self, request: Any, raw_request: Any) -> RequestScope:
        """Identity, access and stripped fields of a request (raises HttpError).

        The request is salted with its tenant's salt (the client's own combined into it).
        """
        headers = raw_request.headers if raw_request is not None else {}
        principal: Principal | None = getattr(getattr(raw_request, "state", None), "principal",
                                              None)
        options = identify(request, headers, self.default_k, principal)
        scope = RequestScope(options, strip_client_fields(request),
                             getattr(request, "cache_salt", None) or "")
        request.cache_salt = tenant_salt(self.secret, principal.tenant if principal else "",
                                         scope.client_salt)
        return scope

    def check_add_size(self, num_facts: int) -> None:
        """Refuse (413) an add of more than max_add_facts facts or turns."""
        if num_facts > self.max_add_facts:
            raise HttpError(413, f"{num_facts} memories in one add; at most "
                                 f"{self.max_add_facts} per request (--max-add-facts): split "
                                 "the add into several requests", "request_too_large")

    def add_messages(self, *, user_id: str, session_id: str | None,
                     messages: Sequence[Mapping[str, Any]],
                     metadata: Mapping[str, Any] | None = None, wait: bool = True,
                     **options: Any) -> list[tuple[int, Any]]:
        """Memory.add of turns; per fact, (index of its message, AddResult). Blocking.

        A turn too long for one fact is cut in pieces (as the local KVMemory does), so a long
        turn is never refused. options: Memory.add's agent_id, run_id, expiration_date.
        """
        turns = check_messages(messages)  # the layer's own checks and messages, before cutting
        pieces = [(index, role, part) for index, (role, content) in enumerate(turns)
                  for part in (self.memory.split_text(content)
                               if role in FACT_ROLES and has_visible(content) else [content])]
        self.check_add_size(len(pieces))  # long turns cut into more facts than the limit
        results = self.memory.add(
            user_id=user_id, session_id=session_id, metadata=metadata, wait=wait, **options,
            messages=[{"role": role, "content": part} for _, role, part in pieces])
        return [(pieces[r.turn][0], r) for r in results]  # AddResult.turn: the piece's index

    async def add_facts(self, scope: RequestScope) -> None:
        """Store a request's memory.add facts (one transaction) before its answer is prepared.

        Called once vLLM has validated and rendered the request (render_*), so that a request
        vLLM refuses there stores nothing; a refusal after this point rolls the add back.
        With async_adds the embedding and KV follow in the background (this answer has the
        facts as text). Raises HttpError: 413 over max_add_facts; 400 for a fact the memory
        refuses; 429 when the add queue is full (nothing is stored).
        """
        options = scope.options
        if not options.add:
            return
        self.check_add_size(len(options.add))
        started = time.perf_counter()
        try:
            scope.added = await asyncio.to_thread(
                self.memory.add, user_id=options.user_id, texts=list(options.add),
                session_id=options.session_id, expiration_date=options.expiration_date,
                wait=not self.async_adds)
        except InferScaleError as exc:
            raise http_error(exc, "memory.add: ") from None
        scope.timings["add"] = (time.perf_counter() - started) * 1e3

    async def roll_back(self, scope: RequestScope) -> None:
        """Delete the facts a refused request's memory.add stored (not those it found stored).

        The facts' history keeps their ADD and DELETE.
        """
        added = [int(r.fact_id) for r in scope.added if r.event == "ADD"]
        scope.added = []
        if added:
            await asyncio.to_thread(self.memory.delete, user_id=scope.options.user_id,
                                    fact_ids=added)

    def write_back(self, options: MemoryOptions, question: str, answer: str) -> None:
        """Save the exchange as conversation turns, after the response (a background task)."""
        if not (options.active and options.write and question):
            return
        messages = [{"role": "user", "content": question},
                    {"role": "assistant", "content": answer}]
        assert options.user_id is not None  # active
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(
            self.add_messages, user_id=options.user_id, session_id=options.session_id,
            messages=messages, wait=not self.async_adds))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def drain(self) -> None:
        """Wait for pending write-backs (tests, shutdown)."""
        while self.pending:
            await asyncio.gather(*list(self.pending), return_exceptions=True)

    def close(self) -> None:
        """Stop the filter pool (shutdown, after drain)."""
        self.filter_pool.shutdown(wait=False, cancel_futures=True)


def report(scope: RequestScope, raw_request: Any, final: Mapping[str, Any] | None,
           replica_id: str | None = None) -> dict:
    """What was served: a dict for the response's `memory` field, also as headers."""
    options = scope.options
    planned = sum(p.plan.num_tokens for p in scope.prepared if p.plan is not None)
    result = (final or {}).get(RESULT_KEY, {}) if final is not None else {}
    status = result.get("status", "planned" if planned else "none") if options.active else "off"
    injected = int(result.get("claimed", 0)) if final is not None else planned
    info = {"user_id": options.user_id, "enabled": options.active,
            "facts": sum(p.num_facts for p in scope.prepared),
            "fact_ids": [int(f) for p in scope.prepared for f in p.handle.fact_ids],
            "injected_tokens": injected if status in ("inject", "planned") else 0,
            "plan_status": status, "stripped_fields": scope.stripped}
    if options.add:
        info["added"] = [{"id": int(r.fact_id), "event": r.event,
                          **({"status": r.status} if r.status else {})} for r in scope.added]
    if replica_id is not None:
        info["replica"] = replica_id
    state = getattr(raw_request, "state", None)
    if state is not None:
        state.inferscale_headers = {
            # Header values are Latin-1: the user id travels percent-encoded UTF-8 (ASCII ids
            # unchanged but for reserved characters other than ':' and '@').
            "X-InferScale-User": quote(options.user_id or "", safe=":@"),
            "X-InferScale-Injected-Tokens": str(info["injected_tokens"]),
            "X-InferScale-Plan-Status": status,
            "X-InferScale-Facts": str(info["facts"])}
        if scope.timings:
            state.inferscale_headers["Server-Timing"] = ", ".join(
                f"{name};dur={ms:.3f}" for name, ms in scope.timings.items())
    return info


class _Seam:
    """create_* / render_* overrides shared by the chat and completion classes."""

    _inferscale: SeamState

    @classmethod
    def adopt(cls, base: Any, state: SeamState) -> Any:
        """An instance of this class over vLLM's initialized serving object (same state)."""
        adopted = cls.__new__(cls)
        adopted.__dict__.update(base.__dict__)
        adopted._inferscale = state
        return adopted

    async def _serve(self, create: Any, request: Any, raw_request: Any) -> Any:
        started = time.perf_counter()
        try:
            scope = self._inferscale.scope(request, raw_request)
            scope.timings["identify"] = (time.perf_counter() - started) * 1e3
        except HttpError as exc:
            return self._refuse(exc)
        # Large memory adds wait between their chunks while a chat is served (memory/gate.py),
        # a streamed one until its last chunk.
        serving = ExitStack()
        serving.enter_context(self._inferscale.memory.interactive())
        token = _SCOPE.set(scope)
        try:
            result = await create(request, raw_request)
        except Exception:  # vLLM refused the request (its sampling parameters, say)
            serving.close()
            await self._inferscale.roll_back(scope)
            raise
        except BaseException:
            serving.close()
            raise
        finally:
            _SCOPE.reset(token)
        if hasattr(result, "__aiter__"):
            return self._stream(scope, raw_request, result, serving)
        serving.close()
        if not hasattr(result, "choices"):  # an error response: nothing served
            await self._inferscale.roll_back(scope)
            return result
        final = getattr(result, "kv_transfer_params", None)
        result.kv_transfer_params = None
        result.memory = report(scope, raw_request, final or {}, self._inferscale.replica_id)
        self._inferscale.write_back(scope.options, scope.question, _answer_text(result))
        return result

    async def _stream(self, scope: RequestScope, raw_request: Any,
                      chunks: AsyncIterator[str], serving: ExitStack) -> AsyncIterator[str]:
        with serving:
            report(scope, raw_request, None, self._inferscale.replica_id)
            pieces: list[str] = []
            async for chunk in chunks:
                if not pieces and _is_error(chunk):  # refused before its first token
                    await self._inferscale.roll_back(scope)
                pieces.append(_delta_text(chunk))
                yield chunk
        self._inferscale.write_back(scope.options, scope.question, "".join(pieces))

    async def _prepare(self, scope: RequestScope, engine_input: Any, **kwargs: Any) -> Any:
        options = scope.options
        memory = self._inferscale.memory
        timings = scope.timings
        submitted = time.perf_counter()

        def prepare() -> PreparedPrompt:
            timings["hop"] = (time.perf_counter() - submitted) * 1e3  # event loop -> thread
            return memory.prepare(  # type: ignore[no-any-return]
                user_id=options.user_id, k=options.k, session_id=options.session_id,
                recent_facts=options.recent_facts, timings=timings,
                client_salt=scope.client_salt, **kwargs)

        prepared = await asyncio.to_thread(prepare)
        timings["back"] = (time.perf_counter() - submitted) * 1e3 - sum(
            timings.get(n, 0.0) for n in ("hop", "retrieve", "plan"))  # thread -> event loop
        scope.prepared.append(prepared)
        new = dict(engine_input)
        new["prompt_token_ids"] = list(prepared.token_ids)
        new.pop("prompt", None)
        new.pop("prompt_token_offsets", None)
        new["cache_salt"] = prepared.cache_salt  # the plan's, or the user's text_salt
        return new, prepared

    def _get_data_parallel_rank(self, raw_request: Any) -> int | None:
        """The engine of the request's user, whose slab holds the user's facts.

        vLLM reads a client's X-data-parallel-rank header here; a memory request goes to its
        user's engine whatever the header says (inferscale_engine.runtime.shards).
        """
        scope = _SCOPE.get()
        if scope is not None and scope.options.active:
            return self._inferscale.memory.engine.rank_of(scope.options.user_id)
        return super()._get_data_parallel_rank(raw_request)  # type: ignore[misc]

    async def _add(self, scope: RequestScope) -> Any:
        """Store the request's memory.add facts; None, or the error response refusing them."""
        try:
            await self._inferscale.add_facts(scope)
        except HttpError as exc:
            return self._refuse(exc)
        return None

    def _refuse(self, error: HttpError) -> Any:
        return self._error(error.message, error.status, error.kind)

    def _error(self, message: str, status: int, kind: str = "BadRequestError") -> Any:
        return self.create_error_response(  # type: ignore[attr-defined]
            message, err_type=kind, status_code=HTTPStatus(status))


class MemoryServingChat(_Seam, OpenAIServingChat):
    """vLLM's chat serving with the user's facts injected as KV."""

    async def create_chat_completion(self, request: Any, raw_request: Any = None) -> Any:
        return await self._serve(super().create_chat_completion, request, raw_request)

    async def render_chat_request(self, request: Any) -> Any:
        started = time.perf_counter()
        result = await super().render_chat_request(request)
        scope = _SCOPE.get()
        if scope is None or not isinstance(result, tuple):
            return result
        scope.timings["vllm_render"] = (time.perf_counter() - started) * 1e3
        refused = await self._add(scope)  # vLLM validated and rendered the request
        if refused is not None or not scope.options.active:
            return refused or result
        conversation, engine_inputs = result
        messages = [_plain(m) for m in conversation]
        scope.question = next((m["content"] for m in reversed(messages)
                               if m["role"] == "user"), "")
        tools = ([t.model_dump(exclude_none=True) for t in request.tools]
                 if request.tools and request.tool_choice != "none" else None)
        try:
            engine_input, prepared = await self._prepare(
                scope, engine_inputs[0], query=scope.question, messages=messages, tools=tools)
        except InferScaleError as exc:
            return self._refuse(http_error(exc))
        if prepared.plan is not None:
            request.kv_transfer_params = prepared.plan.to_params()
        return conversation, [engine_input]


class MemoryServingCompletion(_Seam, OpenAIServingCompletion):
    """vLLM's completion serving with the user's facts in front of the prompt."""

    async def create_completion(self, request: Any, raw_request: Any = None) -> Any:
        return await self._serve(super().create_completion, request, raw_request)

    async def render_completion_request(self, request: Any) -> Any:
        result = await super().render_completion_request(request)
        scope = _SCOPE.get()
        if scope is None or not isinstance(result, list):
            return result
        if scope.options.active and len(result) != 1:
            return self._error("memory serves one prompt per completion request; send the "
                               "prompts separately or set memory.enabled=false", 400)
        if scope.options.active and getattr(request, "echo", False):  # the facts' tokens
            return self._error("echo is not supported with memory (the prompt vLLM sees holds "
                               "the user's facts); set echo=false or memory.enabled=false", 400)
        refused = await self._add(scope)  # vLLM validated and rendered the request
        if refused is not None or not scope.options.active:
            return refused or result
        tokenizer = self._inferscale.memory.engine.tokenizer
        first: dict[str, Any] = dict(result[0])
        ids = list(first["prompt_token_ids"])
        scope.question = str(first.get("prompt") or tokenizer.decode(ids))
        try:
            engine_input, prepared = await self._prepare(
                scope, result[0], query=scope.question, prompt_token_ids=ids)
        except InferScaleError as exc:
            return self._refuse(http_error(exc))
        if prepared.plan is not None:
            request.kv_transfer_params = prepared.plan.to_params()
        return [engine_input]


def _plain(message: Mapping[str, Any]) -> dict[str, str]:
    """A rendered conversation message as role + text (earlier tool calls as Hermes text)."""
    role = {"developer": "system", "function": "tool"}.get(message.get("role", ""),
                                                          message.get("role", "user"))
    content = message.get("content") or ""
    if not isinstance(content, str):
        content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        arguments = function.get("arguments") or "{}"
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = {"raw": arguments}
        content += ("\n" if content else "") + format_tool_call(function.get("name", ""),
                                                                  arguments)
    return {"role": role, "content": content}


def _answer_text(response: Any) -> str:
    choice = response.choices[0] if response.choices else None
    if choice is None:
        return ""
    message = getattr(choice, "message", None)
    return (getattr(message, "content", None) or "") if message is not None else (
        getattr(choice, "text", "") or "")


def _is_error(chunk: str) -> bool:
    """A streamed SSE chunk that reports an error (vLLM's refusal inside a stream)."""
    if not chunk.startswith("data: {"):
        return False
    try:
        return "error" in json.loads(chunk[6:])
    except ValueError:
        return False


def _delta_text(chunk: str) -> str:
    """The text a streamed SSE chunk adds (chat delta content or completion text)."""
    if not chunk.startswith("data: ") or chunk.startswith("data: [DONE]"):
        return ""
    try:
        payload = json.loads(chunk[6:])
    except ValueError:
        return ""
    choices = payload.get("choices") or [{}]
    delta = choices[0].get("delta") or {}
    return str(delta.get("content") or choices[0].get("text") or "")
