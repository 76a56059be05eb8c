"""LangChain and LangGraph adapters: KVMemory, ChatInferScale, middleware, KVMemoryStore.

KVMemory for classic chains, ChatInferScale, the create_agent middleware and the LangGraph
store (KVMemoryStore).

chat_model.py  ChatInferScale         memory.py  LangChainKVMemory (classic chains)
middleware.py  KVMemoryMiddleware     store.py   KVMemoryStore (LangGraph's BaseStore)
ttl.py         KVMemoryStore's TTL (LangGraph's TTLConfig, the sweeper thread)
remote.py      chat_openai: a ChatOpenAI pointed at `inferscale serve`.
Needs the `langchain` extra: pip install 'inferscale-kv[langchain]' (chat_openai: 'client').
"""

from __future__ import annotations

try:
    import langchain.agents.middleware  # noqa: F401
    import langchain_classic.base_memory  # noqa: F401
    import langchain_core.language_models  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "inferscale_integrations.langchain needs LangChain (langchain-core, langchain-classic, "
        "langchain); install it with: pip install 'inferscale-kv[langchain]'") from exc

from inferscale_integrations.langchain.chat_model import ChatInferScale
from inferscale_integrations.langchain.memory import LangChainKVMemory
from inferscale_integrations.langchain.middleware import KVMemoryMiddleware
from inferscale_integrations.langchain.remote import chat_openai
from inferscale_integrations.langchain.store import KVMemoryStore, KVSearchItem, kv_context

__all__ = ["ChatInferScale", "KVMemoryMiddleware", "KVMemoryStore", "KVSearchItem",
           "LangChainKVMemory", "chat_openai", "kv_context"]
