"""ChatInferScale: a LangChain chat model served by the co-located InferScale engine.

Memory handles reach it three ways: ``kv_handles=`` in the call (bind, LLMChain's llm_kwargs,
create_agent's model_settings), a handle message's additional_kwargs (MessagesPlaceholder), and
a marker in any message's text (string templates). They are merged, checked to belong to one
user, and the facts are injected as KV; when injection is impossible the same facts are sent as
text and `counters` records it. Streaming (stream / astream) yields text as the engine
produces it; a call with tools is answered whole and replayed (its tool calls are read from
the whole text).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.chat_models import BaseChatModel, LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field, PrivateAttr

from inferscale_engine.errors import InvalidRequestError
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
from inferscale_integrations.langchain.memory import LangChainSerializable, message_role
from inferscale_integrations.registry import DEFAULT_NAME
from inferscale_integrations.tools import format_tool_call

if TYPE_CHECKING:
    from inferscale_engine.runtime.generation import Generation

_IGNORED_KWARGS = ("ls_structured_output_format",)
"""Keys LangChain adds to calls for its own tracing."""
_MEDIA_BLOCKS = ("image", "image_url", "audio", "input_audio", "video", "file")


class ChatInferScale(LangChainSerializable, BaseChatModel):
    """LangChain chat model of the co-located InferScale engine (KV-injected memory).

    Instantiate (once per process, register the Memory whose engine serves the requests)::

        from inferscale_engine.memory import Memory, MemoryConfig
        from inferscale_integrations import ChatInferScale, KVMemory, register_memory

        register_memory(Memory.from_config(MemoryConfig(engine=EngineConfig(model=path))))
        llm = ChatInferScale(max_tokens=256)            # greedy by default (temperature 0)

    Invoke: with a KVMemory in a chain (ConversationChain, LLMChain, AgentExecutor) the
    memory's handle message reaches the model by itself; otherwise pass one::

        found = memory.search(user_id="caroline", query=question, k=5)
        llm.invoke(question, kv_handles=[found.handle])

    Stream: ``for chunk in llm.stream(question): ...`` (the finished answer is replayed token
    by token; usage rides on the last chunk). Async: ``await llm.ainvoke(...)``,
    ``llm.astream(...)``: the engine runs in a worker thread, the event loop never blocks.

    Tools: ``llm.bind_tools([tool], tool_choice="auto")``; calls are read from the answer by
    the parser named in `tool_parser` and arrive as ``message.tool_calls``.

    Fallback: if the facts' KV cannot be injected, the same facts are answered as text;
    ``llm.counters`` says so (``fallback_text``, ``fallback_refused``), and
    ``message.response_metadata`` carries ``mode``, ``plan_status`` and
    ``num_injected_tokens`` of every answer.
    """

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    memory_name: str = DEFAULT_NAME
    """Registered Memory whose engine serves the requests (see register_memory)."""
    model_name: str | None = Field(default=None, alias="model")
    """Name reported in traces and metadata; None: the engine's model folder name. The engine
    serves one model: a different per-call `model` is an error."""
    user_id: str | None = None
    """If set, every memory handle must be this user's (HandleError otherwise)."""
    mode: Literal["kv", "text"] = "kv"
    """'kv' injects the facts' KV; 'text' prefills them as text (the baseline)."""
    tool_parser: str = "hermes"
    """How tool calls are read from answers: a vLLM tool parser name (hermes for Qwen2.5,
    llama3_json, mistral, ...) or a name given to register_tool_parser."""
    temperature: float = 0.0
    """Sampling temperature; 0 is greedy."""
    max_tokens: int | None = 256
    """Most tokens per answer (None: up to the model's length)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    stop: list[str] | None = None
    """Strings that end the answer (not included in it)."""
    seed: int | None = None
    """Per-request sampling seed."""
    streaming: bool = False
    """Stream by default in invoke (LangChain's standard field)."""
    timeout: float | None = None
    """Accepted for LangChain's standard parameters; the engine runs in this process, so there
    is no network call to time out."""
    max_retries: int = 0
    """Accepted for LangChain's standard parameters; there is no network call to retry."""

    _counters: ServeCounters = PrivateAttr(default_factory=ServeCounters)

    @property
    def _llm_type(self) -> str:
        return "inferscale"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"memory_name": self.memory_name, "model_name": self.model_name,
                "mode": self.mode, "temperature": self.temperature,
                "max_tokens": self.max_tokens, "top_p": self.top_p, "stop": self.stop}

    @property
    def counters(self) -> dict[str, int]:
        """Requests, injections (and injected tokens) and fallbacks of this model object."""
        return self._counters.snapshot()

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider="inferscale", ls_model_name=kwargs.get("model") or self._model_label(),
            ls_model_type="chat", ls_temperature=kwargs.get("temperature", self.temperature))
        max_tokens = kwargs.get("max_tokens", self.max_tokens)
        if max_tokens is not None:
            params["ls_max_tokens"] = max_tokens
        if stop or self.stop:
            params["ls_stop"] = stop or self.stop
        return params

    def bind_tools(self, tools: Sequence[dict[str, Any] | type | Callable | BaseTool], *,
                   tool_choice: str | dict[str, Any] | bool | None = None,
                   **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        """Offer tools (rendered by the model's chat template, calls read by `tool_parser`).

        Extra keyword arguments (e.g. kv_handles) are bound as well and reach every call.
        """
        schemas = [convert_to_openai_tool(tool) for tool in tools]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=schemas, **kwargs)

    # ---- LangChain's hooks -------------------------------------------------------------
    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        _, message = self._answer(messages, stop, kwargs)
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> ChatResult:
        _, message = await asyncio.to_thread(self._answer, messages, stop, kwargs)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        for chunk in self._stream_chunks(messages, stop, kwargs):
            if run_manager and chunk.text:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        async for chunk in iterate_in_thread(
                lambda: self._stream_chunks(messages, stop, kwargs)):
            if run_manager and chunk.text:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    def _stream_chunks(self, messages: list[BaseMessage], stop: list[str] | None,
                       kwargs: dict[str, Any]) -> Iterator[ChatGenerationChunk]:
        """Chunks as the engine produces them; with tools, the whole answer replayed."""
        if kwargs.get("tools"):
            yield from self._chunks(*self._answer(messages, stop, kwargs))
            return
        self._check_model(kwargs)
        options = call_options(self, kwargs, stop, _IGNORED_KWARGS)
        last = None
        for delta, generation in stream_chat(self.memory_name, [_turn(m) for m in messages],
                                             options, self.user_id, self._counters):
            last = generation
            if delta:
                yield ChatGenerationChunk(message=AIMessageChunk(content=delta))
        assert last is not None
        yield ChatGenerationChunk(message=AIMessageChunk(
            content="", chunk_position="last", usage_metadata=_usage(last),
            response_metadata=self._metadata(last)))

    # ---- internals ---------------------------------------------------------------------
    def _answer(self, messages: list[BaseMessage], stop: list[str] | None,
                kwargs: dict[str, Any]) -> tuple[ChatAnswer, AIMessage]:
        """Run one request; the AIMessage has usage, tool calls and how it was served."""
        self._check_model(kwargs)
        options = call_options(self, kwargs, stop, _IGNORED_KWARGS)
        answer = answer_chat(self.memory_name, [_turn(m) for m in messages], options,
                             self.user_id, self._counters, self.tool_parser)
        message = AIMessage(
            content=answer.content,
            tool_calls=[{"name": c.name, "args": c.arguments, "id": c.call_id,
                         "type": "tool_call"} for c in answer.calls],
            usage_metadata=_usage(answer.generation),
            response_metadata=self._metadata(answer.generation))
        return answer, message

    def _check_model(self, kwargs: dict[str, Any]) -> None:
        model = kwargs.pop("model", None)
        if model is not None and model != self._model_label():
            raise InvalidRequestError(f"model={model!r}: this engine serves only "
                                      f"{self._model_label()!r}; build an Engine per model")

    def _chunks(self, answer: ChatAnswer, message: AIMessage) -> Iterator[ChatGenerationChunk]:
        for piece in answer.pieces:
            yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
        yield ChatGenerationChunk(message=AIMessageChunk(
            content="", chunk_position="last", usage_metadata=message.usage_metadata,
            response_metadata=message.response_metadata,
            tool_call_chunks=[{"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"],
                               "index": i, "type": "tool_call_chunk"}
                              for i, c in enumerate(message.tool_calls)]))

    def _metadata(self, generation: Generation) -> dict[str, Any]:
        return {"model_name": self._model_label(), "mode": generation.mode,
                "plan_status": generation.plan_status,
                "num_injected_tokens": generation.num_injected_tokens,
                "latency_ms": generation.latency_ms}

    def _model_label(self) -> str:
        return model_label(self.memory_name, self.model_name)


def _turn(message: BaseMessage) -> ChatTurn:
    """A LangChain message as the engine sees it; earlier tool calls become their text."""
    if isinstance(message.content, list):
        for block in message.content:
            if isinstance(block, dict) and block.get("type") in _MEDIA_BLOCKS:
                raise InvalidRequestError(f"{block.get('type')} content is not supported: the "
                                          "engine serves text-only models")
    text = str(message.text)
    for call in getattr(message, "tool_calls", None) or []:
        text += ("\n" if text else "") + format_tool_call(call["name"], call["args"])
    return ChatTurn(message_role(message), text, message.additional_kwargs.get(HANDLES_KEY))


def _usage(generation: Generation) -> UsageMetadata:
    output_tokens = len(generation.token_ids)
    return UsageMetadata(input_tokens=generation.num_prompt_tokens, output_tokens=output_tokens,
                         total_tokens=generation.num_prompt_tokens + output_tokens,
                         input_token_details={"cache_read": generation.num_cached_tokens})
