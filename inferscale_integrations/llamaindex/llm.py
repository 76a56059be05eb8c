"""InferScaleLLM: a LlamaIndex LLM (function calling) served by the co-located engine.

Handles arrive in message additional_kwargs (chat engines, agents), as markers in text (the
condense prompt of CondensePlusContextChatEngine, complete()), or as ``kv_handles=`` in the
call. Async methods run the engine in a worker thread and never block the event loop.
Streaming yields text as the engine produces it; a call with tools is answered whole and
replayed (its tool calls are read from the whole text).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection

from inferscale_engine.memory.aio import iterate_in_thread
from inferscale_integrations.chat import (
    ChatAnswer,
    ServeCounters,
    answer_chat,
    call_options,
    model_label,
    stream_chat,
)
from inferscale_integrations.handles import HANDLES_KEY, ChatTurn
from inferscale_integrations.llamaindex.memory import message_role
from inferscale_integrations.registry import DEFAULT_NAME, MemoryNotRegisteredError, get_memory
from inferscale_integrations.tools import format_tool_call

if TYPE_CHECKING:
    from inferscale_engine.runtime.generation import Generation

_IGNORED_KWARGS = ("formatted",)
_DEFAULT_CONTEXT_WINDOW = 4096


class InferScaleLLM(FunctionCallingLLM):
    """LlamaIndex LLM of the co-located InferScale engine (KV-injected memory).

    Instantiate (register the Memory whose engine serves the requests once per process)::

        from inferscale_integrations import InferScaleLLM, KVMemory, register_memory

        register_memory(memory)
        llm = InferScaleLLM(max_tokens=256)             # greedy by default (temperature 0)

    Invoke: chat engines and agents given a KVMemory pass its handle message themselves::

        SimpleChatEngine.from_defaults(llm=llm, memory=KVMemory(user_id="caroline")).chat(q)

    or pass one: ``llm.chat(messages, kv_handles=[memory.search(...).handle])``;
    ``llm.complete(prompt)`` works too.

    Stream: ``llm.stream_chat(...)`` / ``stream_complete`` replay the finished answer token
    by token. Async: ``achat``, ``astream_chat``, ``acomplete``, ``astream_complete`` run the
    engine in a worker thread.

    Tools: FunctionAgent and ``llm.chat_with_tools(tools, ...)`` offer tools; calls are read
    by the parser named in `tool_parser` and land in
    ``response.message.additional_kwargs["tool_calls"]``.

    Fallback: if the facts' KV cannot be injected, the same facts are answered as text;
    ``llm.counters`` says so, and ``response.raw`` carries ``mode``, ``plan_status`` and
    ``num_injected_tokens``.
    """

    memory_name: str = Field(default=DEFAULT_NAME,
                             description="Registered Memory whose engine serves the requests.")
    model_name: str | None = Field(default=None, description=(
        "Name reported in metadata; None: the engine's model folder name."))
    user_id: str | None = Field(default=None, description=(
        "If set, every memory handle must be this user's (HandleError otherwise)."))
    mode: Literal["kv", "text"] = Field(default="kv", description=(
        "'kv' injects the facts' KV; 'text' prefills them as text (the baseline)."))
    tool_parser: str = Field(default="hermes", description=(
        "How tool calls are read from answers: a vLLM tool parser name (hermes for Qwen2.5, "
        "llama3_json, mistral, ...) or a name given to register_tool_parser."))
    temperature: float = Field(default=0.0, ge=0.0, description="0 is greedy.")
    max_tokens: int | None = Field(default=256, description="Most tokens per answer.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    stop: list[str] | None = Field(default=None, description="Strings that end the answer.")
    seed: int | None = Field(default=None, description="Per-request sampling seed.")
    context_window: int | None = Field(default=None, description=(
        "Tokens per request reported to LlamaIndex; None: the engine's max_model_len."))

    _counters: ServeCounters = PrivateAttr(default_factory=ServeCounters)

    @classmethod
    def class_name(cls) -> str:
        return "InferScaleLLM"

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(context_window=self._context_window(),
                           num_output=self.max_tokens or 256, is_chat_model=True,
                           is_function_calling_model=True, model_name=self._model_label(),
                           system_role=MessageRole.SYSTEM)

    @property
    def counters(self) -> dict[str, int]:
        """Requests, injections (and injected tokens) and fallbacks of this LLM object."""
        return self._counters.snapshot()

    # ---- chat --------------------------------------------------------------------------
    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._response(*self._answer(messages, kwargs))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return self._live(messages, kwargs)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._response(*await asyncio.to_thread(self._answer, messages, kwargs))

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage],
                           **kwargs: Any) -> ChatResponseAsyncGen:
        async def live() -> ChatResponseAsyncGen:
            async for response in iterate_in_thread(lambda: self._live(messages, kwargs)):
                yield response

        return live()

    # ---- completion (the prompt is one user message) -----------------------------------
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any
                 ) -> CompletionResponse:
        return _completion(self._response(*self._answer(_as_chat(prompt), kwargs)))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any
                        ) -> CompletionResponseGen:
        return (_completion(r) for r in self._live(_as_chat(prompt), kwargs))

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any
                        ) -> CompletionResponse:
        answer = await asyncio.to_thread(self._answer, _as_chat(prompt), kwargs)
        return _completion(self._response(*answer))

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any
                               ) -> CompletionResponseAsyncGen:
        async def live() -> CompletionResponseAsyncGen:
            async for response in iterate_in_thread(lambda: self._live(_as_chat(prompt),
                                                                       kwargs)):
                yield _completion(response)

        return live()

    # ---- function calling --------------------------------------------------------------
    def _prepare_chat_with_tools(self, tools: Sequence[Any],
                                 user_msg: str | ChatMessage | None = None,
                                 chat_history: list[ChatMessage] | None = None,
                                 verbose: bool = False, allow_parallel_tool_calls: bool = False,
                                 tool_required: bool = False, tool_choice: Any = None,
                                 **kwargs: Any) -> dict[str, Any]:
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(ChatMessage(role=MessageRole.USER, content=user_msg)
                            if isinstance(user_msg, str) else user_msg)
        if tool_choice is None and tool_required:
            tool_choice = "any"
        return {"messages": messages, "tools": [t.metadata.to_openai_tool() for t in tools],
                "tool_choice": tool_choice, "parallel_tool_calls": allow_parallel_tool_calls,
                **kwargs}

    def get_tool_calls_from_response(self, response: ChatResponse,
                                     error_on_no_tool_call: bool = True,
                                     **kwargs: Any) -> list[ToolSelection]:
        calls = response.message.additional_kwargs.get("tool_calls") or []
        if not calls and error_on_no_tool_call:
            raise ValueError(f"expected at least one tool call, got {len(calls)}")
        return [ToolSelection(tool_id=c["id"], tool_name=c["name"], tool_kwargs=c["arguments"])
                for c in calls]

    # ---- internals ---------------------------------------------------------------------
    def _answer(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
                ) -> tuple[ChatAnswer, ChatMessage]:
        """Run one request; the message carries tool calls and how it was served."""
        options = call_options(self, kwargs, None, _IGNORED_KWARGS)
        turns = [_turn(m) for m in self._extend_messages(list(messages))]
        answer = answer_chat(self.memory_name, turns, options, self.user_id, self._counters,
                             self.tool_parser)
        extra: dict[str, Any] = {}
        if answer.calls:
            extra["tool_calls"] = [{"id": c.call_id, "name": c.name, "arguments": c.arguments}
                                   for c in answer.calls]
        return answer, ChatMessage(role=MessageRole.ASSISTANT, content=answer.content,
                                   additional_kwargs=extra)

    def _response(self, answer: ChatAnswer, message: ChatMessage) -> ChatResponse:
        return ChatResponse(message=message, raw=_raw(answer.generation),
                            additional_kwargs=_usage(answer.generation))

    def _live(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
              ) -> ChatResponseGen:
        """Responses as the engine produces the answer; with tools, the whole answer replayed."""
        if kwargs.get("tools"):
            yield from self._stream(*self._answer(messages, kwargs))
            return
        options = call_options(self, kwargs, None, _IGNORED_KWARGS)
        turns = [_turn(m) for m in self._extend_messages(list(messages))]
        text = ""
        for delta, generation in stream_chat(self.memory_name, turns, options, self.user_id,
                                             self._counters):
            text += delta
            if delta or generation.finished:
                yield ChatResponse(
                    message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta=delta,
                    raw=_raw(generation) if generation.finished else None,
                    additional_kwargs=_usage(generation) if generation.finished else {})

    def _stream(self, answer: ChatAnswer, message: ChatMessage) -> ChatResponseGen:
        generation = answer.generation
        pieces = answer.pieces or [""]
        text = ""
        for i, piece in enumerate(pieces):
            text += piece
            last = i == len(pieces) - 1
            yield ChatResponse(
                message=ChatMessage(role=MessageRole.ASSISTANT, content=text,
                                    additional_kwargs=message.additional_kwargs if last else {}),
                delta=piece, raw=_raw(generation) if last else None,
                additional_kwargs=_usage(generation) if last else {})

    def _model_label(self) -> str:
        return model_label(self.memory_name, self.model_name)

    def _context_window(self) -> int:
        if self.context_window:
            return self.context_window
        try:
            return get_memory(self.memory_name).max_model_len
        except MemoryNotRegisteredError:
            return _DEFAULT_CONTEXT_WINDOW


def _turn(message: ChatMessage) -> ChatTurn:
    """A LlamaIndex message as the engine sees it; earlier tool calls become their text."""
    text = message.content or ""
    for call in message.additional_kwargs.get("tool_calls") or []:
        name, arguments = _call_parts(call)
        text += ("\n" if text else "") + format_tool_call(name, arguments)
    return ChatTurn(message_role(message), text, message.additional_kwargs.get(HANDLES_KEY))


def _call_parts(call: Any) -> tuple[str, dict[str, Any]]:
    """Name and arguments of a tool call in our dict form or as a ToolSelection."""
    if isinstance(call, ToolSelection):
        return call.tool_name, call.tool_kwargs
    return call["name"], call["arguments"]


def _as_chat(prompt: str) -> list[ChatMessage]:
    return [ChatMessage(role=MessageRole.USER, content=prompt)]


def _completion(response: ChatResponse) -> CompletionResponse:
    return CompletionResponse(text=response.message.content or "", delta=response.delta,
                              raw=response.raw, additional_kwargs=response.additional_kwargs)


def _raw(generation: Generation) -> dict[str, Any]:
    return {"mode": generation.mode, "plan_status": generation.plan_status,
            "num_injected_tokens": generation.num_injected_tokens,
            "num_cached_tokens": generation.num_cached_tokens,
            "latency_ms": generation.latency_ms}


def _usage(generation: Generation) -> dict[str, int]:
    return {"prompt_tokens": generation.num_prompt_tokens,
            "completion_tokens": len(generation.token_ids),
            "total_tokens": generation.num_prompt_tokens + len(generation.token_ids)}
