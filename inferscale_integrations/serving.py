"""One chat through the co-located engine: the handle's facts injected as KV, text as fallback.

Both chat-model wrappers (ChatInferScale, InferScaleLLM) end here. A request with a handle is
sent in KV mode. If the engine cannot inject (it raises for a reason other than a bad handle,
or its connector refuses the plan and prefills the facts itself) the answer is still produced
with the same facts as text, and the event is counted, never hidden.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferscale_engine.errors import (
    EngineClosedError,
    FactNotFoundError,
    HandleError,
    InvalidRequestError,
)
from inferscale_engine.facts import MemoryHandle
from inferscale_integrations.handles import HANDLES_KEY, ChatTurn, PreparedChat, prepare_chat
from inferscale_integrations.registry import MemoryNotRegisteredError, get_memory
from inferscale_integrations.tools import ToolCall, add_tools_prompt, tool_choice_name

if TYPE_CHECKING:  # the engine module imports vLLM: only a running engine needs it
    from inferscale_engine.engine import Engine, Generation

logger = logging.getLogger(__name__)

MODES = ("kv", "text")
_SETTINGS = ("max_tokens", "temperature", "top_p", "seed", "stop", "mode")


class ServeCounters:
    """Per-wrapper event counts (requests, injections, fallbacks). Thread-safe."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, name: str, value: int = 1) -> None:
        with self._lock:
            self._counts[name] += value

    def __getstate__(self) -> dict[str, int]:
        return self.snapshot()

    def __setstate__(self, state: dict[str, int]) -> None:
        self._counts = Counter(state)
        self._lock = threading.Lock()

    def snapshot(self) -> dict[str, int]:
        """A copy of the counts."""
        with self._lock:
            return dict(self._counts)


def engine_for(memory_name: str) -> Engine:
    """The engine of the Memory registered as `memory_name`."""
    return get_memory(memory_name).engine


def sampling_params(*, max_tokens: int | None, temperature: float, top_p: float,
                    stop: list[str] | None, seed: int | None) -> Any:
    """vllm.SamplingParams for one request (temperature 0 is greedy)."""
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                          stop=list(stop or []), seed=seed)


@dataclass(frozen=True, slots=True)
class CallOptions:
    """What one call asks for, from the wrapper's fields and the call's keyword arguments."""

    sampling: Any
    """vllm.SamplingParams."""
    mode: str
    handles: object
    """The call's kv_handles (any form as_handles accepts)."""
    tools: list[dict[str, Any]]
    """Tool schemas in OpenAI function format."""
    tool_choice: str | None
    parallel_tool_calls: bool


def call_options(wrapper: object, kwargs: Mapping[str, Any], stop: list[str] | None = None,
                 ignored: Iterable[str] = ()) -> CallOptions:
    """Merge per-call keyword arguments over the wrapper's settings.

    Args:
        wrapper: the chat model; its max_tokens, temperature, top_p, seed, stop and mode
            fields are the defaults.
        kwargs: the call's keyword arguments: those settings, kv_handles, tools, tool_choice,
            parallel_tool_calls.
        stop: the framework's separate stop argument (wins over kwargs and defaults).
        ignored: framework-internal keys that carry nothing for the engine.

    Raises:
        InvalidRequestError: an unknown option or an invalid value.
    """
    rest = dict(kwargs)
    handles = rest.pop(HANDLES_KEY, None)
    tools = list(rest.pop("tools", None) or [])
    tool_choice = tool_choice_name(rest.pop("tool_choice", None))
    parallel = rest.pop("parallel_tool_calls", None)
    settings = {key: rest.pop(key, getattr(wrapper, key)) for key in _SETTINGS}
    stop = stop if stop is not None else settings["stop"]
    for key in ignored:
        rest.pop(key, None)
    if rest:
        raise InvalidRequestError(f"unknown option(s) {sorted(rest)}; the engine understands "
                                  f"{sorted((*_SETTINGS, HANDLES_KEY, 'tools', 'tool_choice'))}")
    check_options(max_tokens=settings["max_tokens"], temperature=settings["temperature"],
                  top_p=settings["top_p"], mode=settings["mode"])
    sampling = sampling_params(max_tokens=settings["max_tokens"],
                               temperature=float(settings["temperature"]),
                               top_p=float(settings["top_p"]), stop=stop, seed=settings["seed"])
    return CallOptions(sampling, settings["mode"], handles, tools,
                       tool_choice if tools else None, parallel is not False)


def check_options(*, max_tokens: object, temperature: object, top_p: object,
                  mode: object) -> None:
    """Raise InvalidRequestError for sampling settings vLLM would reject later."""
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(
            max_tokens, int) or max_tokens < 1):
        raise InvalidRequestError(f"max_tokens={max_tokens!r} must be a positive int or None")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or (
            temperature < 0):
        raise InvalidRequestError(f"temperature={temperature!r} must be >= 0 (0 = greedy)")
    if isinstance(top_p, bool) or not isinstance(top_p, int | float) or not 0 < top_p <= 1:
        raise InvalidRequestError(f"top_p={top_p!r} must be in (0, 1]")
    if mode not in MODES:
        raise InvalidRequestError(f"mode={mode!r} must be 'kv' (inject the facts' KV) or "
                                  "'text' (prefill them as text)")


ToolCallParser = Callable[[str, CallOptions, list[dict[str, str]]], tuple[str, list[ToolCall]]]
"""(answer text, options, chat sent) -> (text without the calls, the calls)."""


def answer_chat(memory_name: str, turns: Sequence[ChatTurn], options: CallOptions,
                user_id: str | None, counters: ServeCounters, parse_tool_calls: ToolCallParser
                ) -> tuple[Generation, str, list[ToolCall]]:
    """One wrapper call: handles collected, tools offered, served, tool calls read back.

    Returns:
        The engine's generation, the answer's text without tool calls, and the calls.
    """
    chat = prepare_chat(turns, options.handles, user_id)
    if options.tools:
        chat.messages = add_tools_prompt(chat.messages, options.tools, options.tool_choice)
    generation = serve(engine_for(memory_name), chat, options.sampling, options.mode, counters)
    content, calls = parse_tool_calls(generation.text, options, chat.messages)
    return generation, content, calls if options.parallel_tool_calls else calls[:1]


def model_label(memory_name: str, model_name: str | None) -> str:
    """The name a wrapper reports: its model_name, else the engine's model folder name."""
    if model_name:
        return model_name
    try:
        return Path(get_memory(memory_name).engine.config.model).name
    except MemoryNotRegisteredError:
        return "inferscale"


def serve(engine: Engine, chat: PreparedChat, sampling: Any, mode: str,
          counters: ServeCounters) -> Generation:
    """Answer a prepared chat; fall back to text mode when the facts cannot be injected.

    Raises:
        HandleError: the handle names another user's facts (never served as text instead).
        InvalidRequestError: the chat is empty or too long even as text.
    """
    if not chat.messages:
        raise InvalidRequestError("nothing to answer: the messages held only memory handles; "
                                  "add the user's question")
    counters.add("requests")
    if chat.num_unknown_markers:
        counters.add("unknown_markers", chat.num_unknown_markers)
        logger.warning("%d memory marker(s) name handles this process does not know (made in "
                       "another process, or dropped from the recent-handle registry); pass "
                       "the handle in additional_kwargs or kv_handles=", chat.num_unknown_markers)
    handle = chat.handle
    if handle is None or not handle.fact_ids:
        return engine.generate(None, chat.messages, sampling, mode="text")
    counters.add("requests_with_handle")
    try:
        generation = _generate(engine, handle, chat, sampling, mode, counters)
    except (HandleError, EngineClosedError, InvalidRequestError):
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to inject: serve the facts as text
        if mode == "text":
            raise
        logger.warning("KV injection failed (%s: %s); answering with the facts as text",
                       type(exc).__name__, exc)
        counters.add("fallback_text")
        generation = engine.generate(handle, chat.messages, sampling, mode="text")
    if mode == "kv" and generation.plan_status == "inject":
        counters.add("injected")
        counters.add("injected_tokens", generation.num_injected_tokens)
    elif mode == "kv":
        counters.add("fallback_refused")  # the engine prefilled the facts itself
    return generation


def _generate(engine: Engine, handle: MemoryHandle, chat: PreparedChat, sampling: Any,
              mode: str, counters: ServeCounters) -> Generation:
    try:
        return engine.generate(handle, chat.messages, sampling, mode=mode)
    except FactNotFoundError:
        # A fact was deleted after the handle was made: serve the ones that still exist.
        known = {f.fact_id for f in engine.get_facts(handle.user_id)}
        kept = tuple(f for f in handle.fact_ids if f in known)
        counters.add("stale_facts", len(handle.fact_ids) - len(kept))
        return engine.generate(MemoryHandle(handle.user_id, kept) if kept else None,
                               chat.messages, sampling, mode=mode if kept else "text")


def text_deltas(tokenizer: Any, generation: Generation) -> Iterator[str]:
    """The answer as per-token text pieces whose concatenation is exactly generation.text.

    The engine returns whole answers (vLLM's offline API), so streaming replays the tokens
    after generation; it is not incremental.
    """
    emitted = ""
    for end in range(1, len(generation.token_ids) + 1):
        prefix = tokenizer.decode(generation.token_ids[:end], skip_special_tokens=True)
        if prefix.endswith("\ufffd") or not generation.text.startswith(prefix):
            continue  # a partial UTF-8 sequence, or a stop string vLLM cut off
        if len(prefix) > len(emitted):
            yield prefix[len(emitted):]
            emitted = prefix
    if len(generation.text) > len(emitted):
        yield generation.text[len(emitted):]
