"""The serving pipeline both chat-model wrappers share (ChatInferScale, InferScaleLLM).

call_options() merges a call's keyword arguments over the wrapper's fields; answer_chat()
collects the memory handles, offers tools, serves through Memory.answer (KV when possible,
the same facts as text when not: counted, never hidden) and reads tool calls back.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferscale_engine.errors import InvalidRequestError
from inferscale_engine.facts import MemoryHandle
from inferscale_engine.runtime.generation import Generation
from inferscale_integrations.handles import HANDLES_KEY, ChatTurn, prepare_chat
from inferscale_integrations.registry import MemoryNotRegisteredError, get_memory
from inferscale_integrations.tools import (
    ToolCall,
    read_tool_calls,
    tool_choice_name,
    with_tool_choice,
)

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


@dataclass(frozen=True, slots=True)
class ChatAnswer:
    """One wrapper call's result: the generation, its text without tool calls, the calls."""

    generation: Generation
    content: str
    """The answer's text with tool calls cut out."""
    calls: list[ToolCall]
    pieces: list[str]
    """`content` as per-token pieces, for streaming replays."""


def answer_chat(memory_name: str, turns: Sequence[ChatTurn], options: CallOptions,
                user_id: str | None, counters: ServeCounters,
                tool_parser: str = "hermes") -> ChatAnswer:
    """One wrapper call: handles collected, tools offered, served by Memory, calls read back.

    The same pipeline serves ChatInferScale and InferScaleLLM; Memory.answer (the one front
    door) handles stale facts and falls back to text when injection fails.

    Args:
        tool_parser: the parser that reads tool calls: a name given to
            register_tool_parser, else a vLLM tool parser name (hermes, llama3_json, ...).

    Raises:
        HandleError: the handles name another user (or several users).
        InvalidRequestError: the chat is empty or too long even as text.
    """
    memory, chat = _open_chat(memory_name, turns, options, user_id, counters)
    if options.tools:
        chat.messages = with_tool_choice(chat.messages, options.tool_choice)
    generation = memory.answer(messages=chat.messages, handle=chat.handle,
                               sampling=options.sampling, mode=options.mode,
                               tools=options.tools or None)
    _count(counters, generation, chat.handle, options.mode)
    content, calls = (read_tool_calls(memory, tool_parser, generation.text, options.tools,
                                      chat.messages) if options.tools
                      else (generation.text, []))
    if not options.parallel_tool_calls:
        calls = calls[:1]
    pieces = (memory.text_pieces(generation) if content == generation.text
              else [content] if content else [])
    return ChatAnswer(generation, content, calls, pieces)


def stream_chat(memory_name: str, turns: Sequence[ChatTurn], options: CallOptions,
                user_id: str | None, counters: ServeCounters
                ) -> Iterator[tuple[str, Generation]]:
    """answer_chat() for a call without tools, as vLLM produces the answer.

    Yields (new text, the Generation so far) per engine step; the last Generation is finished
    and counted.
    """
    if options.tools:
        raise InvalidRequestError("stream_chat serves calls without tools (tool calls are read "
                                  "from the whole answer): use answer_chat")
    memory, chat = _open_chat(memory_name, turns, options, user_id, counters)
    sent = ""
    last: Generation | None = None
    for generation in memory.answer_stream(messages=chat.messages, handle=chat.handle,
                                           sampling=options.sampling, mode=options.mode):
        delta = ""
        if generation.text.startswith(sent):  # detokenized text only grows
            delta, sent = generation.text[len(sent):], generation.text
        last = generation
        yield delta, generation
    assert last is not None
    _count(counters, last, chat.handle, options.mode)


def _open_chat(memory_name: str, turns: Sequence[ChatTurn], options: CallOptions,
               user_id: str | None, counters: ServeCounters) -> tuple[Any, Any]:
    """The Memory and the chat ready for it (handles collected, markers stripped)."""
    memory = get_memory(memory_name)
    chat = prepare_chat(turns, options.handles, user_id)
    if not chat.messages:
        raise InvalidRequestError("nothing to answer: the messages held only memory handles; "
                                  "add the user's question")
    counters.add("requests")
    if chat.num_unknown_markers:
        counters.add("unknown_markers", chat.num_unknown_markers)
        logger.warning("%d memory marker(s) name handles this process does not know (made in "
                       "another process, or dropped from the recent-handle registry); pass "
                       "the handle in additional_kwargs or kv_handles=", chat.num_unknown_markers)
    return memory, chat


def _count(counters: ServeCounters, generation: Generation, handle: MemoryHandle | None,
           mode: str) -> None:
    if handle is None or not handle.fact_ids:
        return
    counters.add("requests_with_handle")
    if generation.num_stale_facts:
        counters.add("stale_facts", generation.num_stale_facts)
    if generation.fallback == "injection_error":
        counters.add("fallback_text")
    elif mode == "kv" and generation.plan_status == "inject":
        counters.add("injected")
        counters.add("injected_tokens", generation.num_injected_tokens)
    elif mode == "kv":
        counters.add("fallback_refused")  # the engine prefilled the facts itself


def model_label(memory_name: str, model_name: str | None) -> str:
    """The name a wrapper reports: its model_name, else the served model's folder name."""
    if model_name:
        return model_name
    try:
        return get_memory(memory_name).model_name
    except MemoryNotRegisteredError:
        return "inferscale"
