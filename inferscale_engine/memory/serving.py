"""The front door of serving: one handle's facts answered, as KV when possible, never lost.

Every app-facing path (Memory.generate, Memory.answer, the LangChain and LlamaIndex wrappers)
ends here. A request with a handle goes in KV mode; facts deleted since the handle was made
are left out (counted); if injection raises for a reason other than a bad handle or request,
the same facts are answered as text and the Generation says so (`fallback`), never hidden.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from typing import Any

from inferscale_engine.engine import Engine, Generation, Messages
from inferscale_engine.errors import (
    EngineClosedError,
    FactNotFoundError,
    HandleError,
    InvalidRequestError,
)
from inferscale_engine.facts import MemoryHandle

logger = logging.getLogger(__name__)


def serve(engine: Engine, handle: MemoryHandle | None, messages: Messages | str,
          sampling: Any, mode: str, counters: Counter[str]) -> Generation:
    """Answer `messages` with the handle's facts (None: no memory, text mode).

    A handle with no facts still gets the preamble's KV injected in kv mode.

    Raises:
        HandleError: the handle names another user's facts (never served as text instead).
        InvalidRequestError: the messages or settings are invalid, or too long even as text.
        EngineClosedError: the engine was closed.
    """
    if handle is None:
        return engine.generate(None, messages, sampling, mode="text")
    try:
        return _generate_existing(engine, handle, messages, sampling, mode, counters)
    except (HandleError, EngineClosedError, InvalidRequestError):
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to inject: serve the facts as text
        if mode == "text":
            raise
        logger.warning("KV injection failed (%s: %s); answering with the facts as text",
                       type(exc).__name__, exc)
        counters["fallback_injection_error"] += 1
        generation = _generate_existing(engine, handle, messages, sampling, "text", counters)
        return replace(generation, fallback="injection_error")


def _generate_existing(engine: Engine, handle: MemoryHandle, messages: Messages | str,
                       sampling: Any, mode: str, counters: Counter[str]) -> Generation:
    """engine.generate, leaving out facts deleted after the handle was made."""
    try:
        return engine.generate(handle, messages, sampling, mode=mode)
    except FactNotFoundError:
        known = {f.fact_id for f in engine.get_facts(handle.user_id)}
        kept = tuple(f for f in handle.fact_ids if f in known)
        stale = len(handle.fact_ids) - len(kept)
        counters["stale_facts"] += stale
        generation = engine.generate(MemoryHandle(handle.user_id, kept) if kept else None,
                                     messages, sampling, mode=mode if kept else "text")
        return replace(generation, num_stale_facts=stale)
