"""KVMemoryMiddleware: long-term KV memory for LangChain 1.x `create_agent`.

Before each model call it retrieves the user's pinned facts and top-k facts for the latest
user message (Memory.handle_for) and attaches their handle as
``model_settings["kv_handles"]``, which create_agent forwards to the chat model
(ChatInferScale reads it; other chat models do not understand it). After the agent finishes
it writes the exchange (user message, final answer) to the memory layer. The thread's own
messages stay in the agent state (the checkpointer); only long-term facts travel as KV.
The user comes from the constructor or from the run's context (``context={"user_id": ...}``).

With ``namespace=("memories", "{user_id}")`` the facts are those of that namespace of the
agent's LangGraph store (``create_agent(..., store=KVMemoryStore(memory))``), where the agent's
tools keep them with ``runtime.store.put``; labels are formatted with the run's context. An
item put with ``pinned=True`` (KVMemoryStore.put) is attached to every call, first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.runtime import Runtime

from inferscale_engine.errors import InvalidRequestError
from inferscale_integrations.chat import ServeCounters
from inferscale_integrations.handles import HANDLES_KEY
from inferscale_integrations.registry import DEFAULT_NAME, check_name, get_memory

if TYPE_CHECKING:
    from inferscale_engine.memory import Memory


class KVMemoryMiddleware(AgentMiddleware):
    """Attach a user's memory handle to every model call; save each finished exchange."""

    def __init__(self, memory_name: str = DEFAULT_NAME, *, user_id: str | None = None,
                 session_id: str | None = None, k: int = 5, save_turns: bool = True,
                 namespace: Sequence[str] | None = None) -> None:
        """Configure the middleware (nothing is looked up until the first call).

        Args:
            memory_name: registered Memory to search and write (see register_memory).
            user_id: the user; None: read ``user_id`` from the run's context.
            session_id: session of the saved turns; None: the context's ``session_id``.
            k: facts retrieved per model call.
            save_turns: write each finished exchange to the memory layer.
            namespace: search (and save to) this namespace of the agent's KVMemoryStore
                instead of a registered Memory's user; labels like "{user_id}" are filled
                from the run's context.
        """
        super().__init__()
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"k={k!r} must be an int >= 0 (facts per model call)")
        self.memory_name = check_name(memory_name)
        self.user_id = user_id
        self.session_id = session_id
        self.k = k
        self.save_turns = save_turns
        self.namespace = tuple(namespace) if namespace is not None else None
        self._counters = ServeCounters()

    @property
    def counters(self) -> dict[str, int]:
        """Handles attached and exchanges saved."""
        return self._counters.snapshot()

    def wrap_model_call(self, request: ModelRequest,
                        handler: Callable[[ModelRequest], ModelResponse]) -> ModelResponse:
        return handler(self._with_handle(request))

    async def awrap_model_call(self, request: ModelRequest,
                               handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
                               ) -> ModelResponse:
        return await handler(await asyncio.to_thread(self._with_handle, request))

    def after_agent(self, state: AgentState, runtime: Runtime) -> dict[str, Any] | None:
        self._save(state, runtime)
        return None

    async def aafter_agent(self, state: AgentState, runtime: Runtime) -> dict[str, Any] | None:
        await asyncio.to_thread(self._save, state, runtime)
        return None

    # ---- internals ---------------------------------------------------------------------
    def _with_handle(self, request: ModelRequest) -> ModelRequest:
        query = _last_user_text(request.messages)
        if not query or not self.k:
            return request
        memory, user_id = self._target(request.runtime)
        handle = memory.handle_for(user_id=user_id, query=query, k=self.k)  # pinned first
        self._counters.add("handles_attached")
        self._counters.add("facts_attached", len(handle.fact_ids))
        settings = {**request.model_settings, HANDLES_KEY: [handle.to_dict()]}
        return request.override(model_settings=settings)

    def _save(self, state: AgentState, runtime: Runtime) -> None:
        if not self.save_turns:
            return
        messages: list[BaseMessage] = list(state.get("messages", []))
        starts = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
        if not starts or not messages[starts[-1]].text.strip():
            return
        turns = [{"role": "user", "content": messages[starts[-1]].text}]
        answers = [m for m in messages[starts[-1] + 1:]
                   if isinstance(m, AIMessage) and not m.tool_calls and m.text.strip()]
        if answers:
            turns.append({"role": "assistant", "content": answers[-1].text})
        memory, user_id = self._target(runtime)
        memory.add(
            user_id=user_id,
            session_id=self._scope(runtime, "session_id", self.session_id, required=False),
            messages=turns)
        self._counters.add("exchanges_saved")

    def _target(self, runtime: Runtime | None) -> tuple[Memory, str]:
        """The Memory and the user id (or store namespace scope) this run reads and writes."""
        if self.namespace is None:
            return (get_memory(self.memory_name),
                    self._scope(runtime, "user_id", self.user_id))
        from inferscale_integrations.langchain.store import KVMemoryStore, scope_of

        store = getattr(runtime, "store", None)
        if not isinstance(store, KVMemoryStore):
            raise InvalidRequestError(
                "KVMemoryMiddleware(namespace=...) reads the agent's store: pass "
                "create_agent(..., store=KVMemoryStore(memory)), got "
                f"{type(store).__name__ if store is not None else 'no store'}")
        context = getattr(runtime, "context", None)
        values = (dict(context) if isinstance(context, Mapping) else
                  dict(vars(context)) if context is not None and hasattr(context, "__dict__")
                  else {})
        if self.user_id is not None:
            values.setdefault("user_id", self.user_id)
        try:
            labels = tuple(label.format(**values) for label in self.namespace)
        except (KeyError, IndexError) as exc:
            raise InvalidRequestError(f"KVMemoryMiddleware namespace {self.namespace!r} needs "
                                      f"{exc} in the run's context") from exc
        return store.memory, scope_of(labels)

    @staticmethod
    def _scope(runtime: Runtime | None, key: str, value: str | None,
               required: bool = True) -> Any:
        if value is None and runtime is not None:
            context = runtime.context
            value = (context.get(key) if isinstance(context, Mapping)
                     else getattr(context, key, None))
        if value is None and required:
            raise InvalidRequestError(f"KVMemoryMiddleware does not know the {key}: pass "
                                      f"KVMemoryMiddleware({key}=...) or invoke the agent with "
                                      f"context={{'{key}': ...}}")
        return value


def _last_user_text(messages: Sequence[BaseMessage]) -> str | None:
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            return message.text
    return None
