"""The front door of serving: one handle's facts answered, as KV when possible, never lost.

Every app-facing path (Memory.generate, Memory.answer, the LangChain and LlamaIndex wrappers)
ends here. A request with a handle goes in KV mode; facts deleted since the handle was made
are left out (counted); if injection raises for a reason other than a bad handle or request,
the same facts are answered as text and the Generation says so (`fallback`), never hidden.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections import Counter
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from inferscale_engine.config import plan_secret
from inferscale_engine.errors import (
    EngineClosedError,
    FactNotFoundError,
    HandleError,
    InvalidRequestError,
    SlabFullError,
)
from inferscale_engine.facts import MemoryHandle
from inferscale_engine.prompting.layout import Layout
from inferscale_engine.protocol.plan import InjectionPlan, text_salt
from inferscale_engine.runtime.engine import Engine, Generation, Messages

logger = logging.getLogger(__name__)


def serve(engine: Engine, handle: MemoryHandle | None, messages: Messages | str,
          sampling: Any, mode: str, counters: Counter[str], *, layout: Layout | None = None,
          tools: Sequence[Mapping[str, Any]] | None = None) -> Generation:
    """Answer `messages` with the handle's facts (None: no memory, text mode).

    A handle with no facts still gets the preamble's KV injected in kv mode.

    Raises:
        HandleError: the handle names another user's facts (never served as text instead).
        InvalidRequestError: the messages or settings are invalid, or too long even as text.
        EngineClosedError: the engine was closed.
    """
    def call(handle: MemoryHandle | None, mode: str, layout: Layout | None) -> Generation:
        return engine.generate(handle, messages, sampling, mode=mode, layout=layout,
                               tools=tools)

    generation, stale, fallback = _served(engine, handle, mode, counters, layout, call)
    return _marked(generation, stale, fallback)


def serve_stream(engine: Engine, handle: MemoryHandle | None, messages: Messages | str,
                 sampling: Any, mode: str, counters: Counter[str], *,
                 layout: Layout | None = None, tools: Sequence[Mapping[str, Any]] | None = None
                 ) -> Generator[Generation, None, None]:
    """serve(), streamed: the answer so far after every engine step (Engine.stream).

    Stale facts and injection errors are handled as serve() handles them: they show up before
    the first token, so the stream starts with the facts that can be served.
    """
    def call(handle: MemoryHandle | None, mode: str, layout: Layout | None
             ) -> tuple[Generation, Generator[Generation, None, None]]:
        stream = engine.stream(handle, messages, sampling, mode=mode, layout=layout,
                               tools=tools)
        return next(stream), stream  # errors of the prompt or the plan surface here

    (first, rest), stale, fallback = _served(engine, handle, mode, counters, layout, call)
    try:
        for generation in itertools.chain([first], rest):
            yield _marked(generation, stale, fallback)
    finally:
        rest.close()


def _marked(generation: Generation, stale: int, fallback: str | None) -> Generation:
    """The generation with the stale facts left out and the fallback taken, if any."""
    if not stale and not fallback:
        return generation
    return replace(generation, num_stale_facts=stale, fallback=fallback or generation.fallback)


T = TypeVar("T")


def _served(engine: Engine, handle: MemoryHandle | None, mode: str, counters: Counter[str],
            layout: Layout | None, call: Callable[[MemoryHandle | None, str, Layout | None], T]
            ) -> tuple[T, int, str | None]:
    """call() with the handle's facts, falling back to text if injection fails.

    Returns the result, the number of stale facts left out, and the fallback taken.
    """
    if handle is None:
        return call(None, "text", None), 0, None
    try:
        result, stale = _call_existing(engine, handle, mode, counters, layout, call)
        return result, stale, None
    except (HandleError, EngineClosedError, InvalidRequestError):
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to inject: serve the facts as text
        if mode == "text":
            raise
        logger.warning("KV injection failed (%s: %s); answering with the facts as text",
                       type(exc).__name__, exc)
        counters["fallback_injection_error"] += 1
        result, stale = _call_existing(engine, handle, "text", counters, layout, call)
        return result, stale, "injection_error"


def _call_existing(engine: Engine, handle: MemoryHandle, mode: str, counters: Counter[str],
                   layout: Layout | None,
                   call: Callable[[MemoryHandle | None, str, Layout | None], T]
                   ) -> tuple[T, int]:
    """call(), leaving out facts deleted after the handle was made; how many were left out."""
    try:
        return call(handle, mode, layout), 0
    except FactNotFoundError:
        known = {f.fact_id for f in engine.get_facts(handle.user_id)}
        keep = [i for i, f in enumerate(handle.fact_ids) if f in known]
        stale = len(handle.fact_ids) - len(keep)
        counters["stale_facts"] += stale
        kept = MemoryHandle(handle.user_id, tuple(handle.fact_ids[i] for i in keep),
                            tuple(handle.scores[i] for i in keep) if handle.scores else ())
        if layout is not None and layout.repair_facts > len(keep):  # r was sized for the handle
            layout = dataclasses.replace(layout, repair_facts=len(keep))
        return call(kept if keep else None, mode if keep else "text", layout), stale


@dataclass(frozen=True, slots=True)
class PreparedPrompt:
    """A prompt for a client that runs vLLM itself (`inferscale serve`), and its plan."""

    token_ids: list[int]
    plan: InjectionPlan | None
    """None: the facts are in the prompt as text (they could not be made resident)."""
    handle: MemoryHandle
    cache_salt: str
    """What to send the prompt with: the plan's cache_salt, or the user's text_salt (either
    combined with the client's own)."""

    @property
    def num_facts(self) -> int:
        """Facts of the user in the prompt."""
        return len(self.handle.fact_ids)


def prepare(engine: Engine, handle: MemoryHandle, counters: Counter[str], *,
            messages: Messages | None = None, prompt_token_ids: Sequence[int] | None = None,
            layout: Layout | None = None, tools: Sequence[Mapping[str, Any]] | None = None,
            client_salt: str = "") -> PreparedPrompt:
    """The prompt and signed plan for a chat (`messages`) or a raw completion prompt.

    When the facts cannot be made resident the same facts go as text (no plan, counted),
    salted with the user's text_salt. `client_salt`, the client's own cache_salt, is combined
    into the salt either way.
    """
    secret = plan_secret()
    try:
        return _planned(engine, handle, messages, prompt_token_ids, layout, tools, secret,
                        client_salt)
    except SlabFullError:
        counters["fallback_text_evicted"] += 1
    salt = text_salt(secret, handle.user_id, client_salt)
    if prompt_token_ids is not None:
        by_id = {f.fact_id: f for f in engine.get_facts(handle.user_id)}
        ids = list(engine.prompts.encode(engine.config.system_prompt))
        for fact_id in handle.fact_ids:
            ids.extend(by_id[fact_id].token_ids)
        return PreparedPrompt([*ids, *prompt_token_ids], None, handle, salt)
    assert messages is not None
    prompt = engine.render_prompt(handle, messages, layout=layout, tools=tools)
    return PreparedPrompt(prompt.token_ids(), None, handle, salt)


def _planned(engine: Engine, handle: MemoryHandle, messages: Messages | None,
             prompt_token_ids: Sequence[int] | None, layout: Layout | None,
             tools: Sequence[Mapping[str, Any]] | None, secret: bytes, client_salt: str
             ) -> PreparedPrompt:
    """prepare()'s KV path: the prompt and its signed plan (SlabFullError: not resident)."""
    if prompt_token_ids is not None:
        prompt, plan = engine.prepare_completion(handle, prompt_token_ids, layout=layout)
    else:
        assert messages is not None
        prompt, plan = engine.prepare_request(handle, messages, layout=layout, tools=tools)
    plan = plan.with_client_salt(secret, client_salt)
    return PreparedPrompt(prompt.token_ids(), plan, handle, plan.cache_salt)
