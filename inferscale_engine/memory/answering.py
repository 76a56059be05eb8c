"""Answering: the verbs that answer (generate, answer, streams, prepare), adapters' needs.

A plain part Memory holds and forwards to (main.py `forward`), as the connector's facade
forwards to its scheduler and worker halves. Every answer ends in fallback.py; the verbs are
interactive calls that large adds yield to (gate.py). A user's facts still pending (an
asynchronous add, background.py: not yet embedded, no KV) join every handle after the top-k
and are written as text among the repaired facts while the others are injected (counters
'pending_served_as_text'): an acknowledged fact is never missing from an answer.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from inferscale_engine import checks
from inferscale_engine.errors import HandleError, InvalidRequestError
from inferscale_engine.facts import FactId, MemoryHandle
from inferscale_engine.memory.fallback import PreparedPrompt, prepare, serve, serve_stream
from inferscale_engine.memory.gate import InteractiveGate, interactive_call
from inferscale_engine.memory.registration import RegisteredFacts
from inferscale_engine.memory.scope import Scopes
from inferscale_engine.memory.search.retrieval import serve_handle
from inferscale_engine.memory.store import FactStore
from inferscale_engine.memory.types import SearchResult
from inferscale_engine.prompting.layout import Layout
from inferscale_engine.prompting.tool_calls import ToolCall
from inferscale_engine.runtime.engine import Engine, Generation, Messages

PENDING_PROMPT_TOKENS = 512
"""Tokens of a user's pending facts a request serves at most (the newest first): a bulk
asynchronous add's facts beyond it are served once embedded, ranked like any other."""


class Answering:
    """The answering half of Memory: reads its served facts, answers through the engine."""

    def __init__(self, engine: Engine, store: FactStore, served: RegisteredFacts,
                 gate: InteractiveGate, counters: Counter[str], scopes: Scopes,
                 search: Callable[..., SearchResult],
                 pins: Callable[[str, Sequence[int]], list[FactId]]) -> None:
        self._engine, self._store, self._served = engine, store, served
        self._gate, self.counters, self._scopes = gate, counters, scopes
        self._lock: threading.RLock = scopes.lock
        self._search = search
        """Memory.search (the index, the filters, the served facts)."""
        self._pins = pins
        """The user's served pinned facts, less those excluded (pinning.py)."""

    @interactive_call
    def generate(self, *, user_id: str, query: str, k: int = 5,
                 messages: Messages | None = None, sampling: Any = None, mode: str = "kv",
                 handle: MemoryHandle | None = None, layout: Layout | None = None,
                 as_of: Any = None) -> Generation:
        """Answer from the user's memory: search(query, k), then answer().

        Args:
            user_id: whose memory to use.
            query: what to retrieve by; also the question unless `messages` is given.
            k: facts to retrieve.
            messages: the chat to answer (role/content dicts); default: `query` as a user turn.
            sampling: vllm.SamplingParams (default: greedy, 64 tokens).
            mode: 'kv' injects the facts' KV; 'text' prefills them as text.
            handle: serve these facts instead of searching; it must be this user's.
            layout: where facts go and which are repaired as text (default: the engine's).
            as_of: answer from the facts true at this time (see Memory.search).

        Raises:
            HandleError: `handle` is not a MemoryHandle of this user.
        """
        user_id = self._scopes.user(user_id).user_id
        query = checks.check_text(query, "query", InvalidRequestError)
        if handle is None:
            handle = (self._search(user_id=user_id, query=query, k=k, as_of=as_of).handle
                      if as_of is not None else
                      self.handle_for(user_id=user_id, query=query, k=k))
        return self.answer(messages=query if messages is None else messages, handle=handle,
                           user_id=user_id, sampling=sampling, mode=mode, layout=layout)

    @interactive_call
    def answer(self, *, messages: Messages | str, handle: MemoryHandle | None,
               user_id: str | None = None, sampling: Any = None, mode: str = "kv",
               layout: Layout | None = None, tools: Sequence[Mapping[str, Any]] | None = None
               ) -> Generation:
        """Answer a chat with a handle's facts: the one serving entry of every adapter.

        Facts deleted since the handle was made are left out (Generation.num_stale_facts);
        if injection fails the same facts are answered as text (Generation.fallback).

        Args:
            messages: the chat (role/content dicts) or one question.
            handle: facts to use (from search()), or None for no memory.
            user_id: if given, the handle must be this user's.
            sampling: vllm.SamplingParams (default: greedy, 64 tokens).
            mode: 'kv' (inject) or 'text' (prefill the facts as text).
            layout: where facts go and which are repaired as text (default: the engine's).
            tools: tool schemas (OpenAI function format) for the model's chat template.

        Raises:
            HandleError: `handle` is not a MemoryHandle, or not `user_id`'s, or names another
                user's facts.
        """
        self._check_handle(handle, user_id)
        return serve(self._engine, handle, messages, sampling, mode, self.counters,
                     layout=self._pending_as_text(handle, mode, layout), tools=tools)

    def stream(self, *, user_id: str, query: str, k: int = 5, messages: Messages | None = None,
               sampling: Any = None, mode: str = "kv", handle: MemoryHandle | None = None,
               layout: Layout | None = None) -> Iterator[Generation]:
        """generate(), streamed: a Generation of the answer so far after every engine step.

        The last one is finished (plan status, usage). Bad input raises here, before the
        iterator is returned; close the iterator (or exhaust it) to free the engine.
        """
        user_id = self._scopes.user(user_id).user_id
        query = checks.check_text(query, "query", InvalidRequestError)
        if handle is None:
            handle = self.handle_for(user_id=user_id, query=query, k=k)
        return self.answer_stream(messages=query if messages is None else messages,
                                  handle=handle, user_id=user_id, sampling=sampling, mode=mode,
                                  layout=layout)

    def answer_stream(self, *, messages: Messages | str, handle: MemoryHandle | None,
                      user_id: str | None = None, sampling: Any = None, mode: str = "kv",
                      layout: Layout | None = None,
                      tools: Sequence[Mapping[str, Any]] | None = None) -> Iterator[Generation]:
        """answer(), streamed (see stream())."""
        self._check_handle(handle, user_id)
        stack = ExitStack()
        stack.enter_context(self._gate.interactive())  # held until the stream ends
        try:
            stream = serve_stream(self._engine, handle, messages, sampling, mode,
                                  self.counters,
                                  layout=self._pending_as_text(handle, mode, layout),
                                  tools=tools)
            first = next(stream)  # the prompt and the plan are checked here
        except BaseException:
            stack.close()
            raise
        return _closing(itertools.chain([first], stream), stream, stack)

    def _pending_as_text(self, handle: MemoryHandle | None, mode: str,
                         layout: Layout | None) -> Layout | None:
        """`layout`, with the handle's pending facts (no KV yet) sent as text, counted.

        In kv mode the facts whose KV is ready are injected and the pending ones written
        among the repaired facts (Layout.text_facts); in text mode every fact is text anyway.
        """
        with self._lock:
            pending = self._served.pending_among(
                checks.check_user_id(handle.user_id, HandleError), handle.fact_ids
            ) if handle is not None else frozenset()
            if pending:
                self.counters["pending_served_as_text"] += len(pending)
        if not pending or mode != "kv":
            return layout
        if layout is not None:
            return dataclasses.replace(layout, text_facts=layout.text_facts | pending)
        base = self._engine.config.layout  # the default's r is at most the handle's size
        assert handle is not None
        return dataclasses.replace(base, text_facts=pending, repair_facts=min(
            base.repair_facts, len(handle.fact_ids)))

    def _check_handle(self, handle: MemoryHandle | None, user_id: str | None) -> None:
        if handle is not None and not isinstance(handle, MemoryHandle):
            raise HandleError(f"handle must be a MemoryHandle (from search()), got "
                              f"{type(handle).__name__}")
        if handle is None or user_id is None:
            self._scopes.check_open()
            return
        owner = checks.check_user_id(handle.user_id, HandleError)  # the handle's, not a verb's
        if owner != self._scopes.user(user_id).user_id:
            with self._lock:
                self.counters["foreign_handles"] += 1
            raise HandleError(f"the handle belongs to {handle.user_id!r:.40}, not to "
                              f"user_id={user_id!r:.40}; use a handle from this user's "
                              "search()")
        with self._scopes.user(owner):  # a shared store: the handle may name facts written
            pass                        # elsewhere, synced here

    @interactive_call
    def prepare(self, *, user_id: str, query: str | None, k: int = 5,
                messages: Messages | None = None, prompt_token_ids: Sequence[int] | None = None,
                session_id: str | None = None, recent_facts: int = 0,
                layout: Layout | None = None, tools: Sequence[Mapping[str, Any]] | None = None,
                timings: dict[str, float] | None = None, client_salt: str = ""
                ) -> PreparedPrompt:
        """The prompt, its salt and signed plan for a client that runs vLLM itself (the server).

        The user's top-k facts for `query`, then the session's last `recent_facts` facts, in
        front of a chat (`messages`, rendered with the model's template) or of a raw
        completion prompt (`prompt_token_ids`). `timings`, if given, receives the ms spent in
        "retrieve" (query embedding and search) and "plan" (prompt and plan). `client_salt`
        (a client's own cache_salt) is combined into the prompt's salt.
        """
        started = time.perf_counter()
        user = self._scopes.user(user_id)
        recent: list[int] = []
        if recent_facts and session_id is not None:
            with user as uid:
                recent = [f.fact_id for f in self._store.recent_facts(
                    user_id=uid, session_id=session_id, limit=recent_facts)
                    if f.fact_id in self._served]
        handle = self.handle_for(user_id=user.user_id, query=query, k=k, recent=recent)
        retrieved = time.perf_counter()
        self._scopes.check_open()
        prepared = prepare(self._engine, handle, self.counters, messages=messages,
                           prompt_token_ids=prompt_token_ids,
                           layout=self._pending_as_text(handle, "kv", layout), tools=tools,
                           client_salt=client_salt)
        if timings is not None:
            timings["retrieve"] = (retrieved - started) * 1e3
            timings["plan"] = (time.perf_counter() - retrieved) * 1e3
        return prepared

    @interactive_call
    def handle_for(self, *, user_id: str, query: str | None, k: int = 5,
                   recent: Sequence[int] = (), exclude: Sequence[int] = ()) -> MemoryHandle:
        """The facts one request is served with: pinned, top-k, then recent (the one rule).

        The user's pinned facts (pinning.py), then the user's k facts most similar to `query`
        that are neither pinned nor in `recent` nor in `exclude` (k new facts; fewer only where
        older versions are left out, search/versions.py), best first, then `recent` in its
        order (a fact listed twice keeps its first place), then the user's pending facts (an
        asynchronous add's, not yet searchable; the newest within
        PENDING_PROMPT_TOKENS). A blank or None query: pinned, `recent` and pending only.

        Args:
            recent: facts the conversation just produced (its last turns' facts).
            exclude: facts not to serve (e.g. turns the caller sends as text).
        """
        user_id = self._scopes.user(user_id).user_id
        with self._lock:
            pending = [i for i in self._served.pending_of(user_id, PENDING_PROMPT_TOKENS)
                       if i not in exclude]
            self.counters["pending_left_out"] += len(self._served.pending_of(user_id)) - len(
                pending)
            pinned = self._pins(user_id, exclude)
        recent = [*recent, *pending]
        return serve_handle(user_id, query, k, recent, exclude, lambda text, n, skip: self._search(
            user_id=user_id, query=text, k=n, exclude=skip).handle, pinned)

    @contextmanager
    def interactive(self) -> Iterator[None]:
        """Mark a latency-sensitive call made outside this class (a server's chat request).

        Large adds wait between their chunks until it is done.
        """
        with self._gate.interactive():
            yield

    # ---- what adapters need from the engine ------------------------------------------
    def split_text(self, text: str) -> list[str]:
        """`text` cut into pieces that each fit in one fact (long turns become several)."""
        return self._engine.split_text(text)

    def parse_tool_calls(self, text: str, tools: Sequence[Mapping[str, Any]],
                         parser: str = "hermes") -> tuple[str, list[ToolCall]]:
        """An answer's text without tool calls, and the calls (vLLM's parser `parser`)."""
        return self._engine.parse_tool_calls(text, tools, parser)

    def text_pieces(self, generation: Generation) -> list[str]:
        """A finished answer as per-token text pieces (for streaming replays)."""
        return self._engine.text_pieces(generation)

    @property
    def model_name(self) -> str:
        """The served model's folder name."""
        return os.path.basename(os.path.normpath(self._engine.config.model))

    @property
    def max_model_len(self) -> int:
        """Longest prompt + answer the engine serves, in tokens."""
        return self._engine.config.max_model_len


def _closing(items: Iterator[Generation], stream: Generator[Generation, None, None],
             stack: ExitStack) -> Generator[Generation, None, None]:
    """`items`, then (also when closed early) the stream closed and the stack unwound."""
    try:
        yield from items
    finally:
        stream.close()
        stack.close()
