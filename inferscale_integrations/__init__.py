"""InferScale for LangChain, LangGraph and LlamaIndex: memories, chat models, stores.

KVMemory, ChatInferScale and InferScaleLLM, the create_agent middleware, the LangGraph store,
the LlamaIndex memory block.

MemoryClient is the memory REST API of `inferscale serve` (KVMemory(base_url=...) uses it).

  memory.py    KVMemory (LangChain and LlamaIndex at once); base.py the state both share
  chat.py      the answering pipeline both chat-model wrappers share; tools.py tool calls
  handles.py   how a memory handle rides in a chat message
  registry.py  live Memories by name (copies restored from JSON or pickle find them)
  client.py    MemoryClient, MemoryItem: a server's memory API
  langchain/   ChatInferScale, LangChainKVMemory, the middleware, KVMemoryStore
  llamaindex/  InferScaleLLM, LlamaIndexKVMemory, KVMemoryBlock
Names resolve lazily (PEP 562), so importing this package imports no framework; a missing
framework raises ImportError naming the extra to install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and IDEs see (the names resolve lazily at run time)
    from inferscale_integrations.client import MemoryClient
    from inferscale_integrations.langchain.chat_model import ChatInferScale
    from inferscale_integrations.langchain.middleware import KVMemoryMiddleware
    from inferscale_integrations.langchain.store import KVMemoryStore, kv_context
    from inferscale_integrations.llamaindex.block import KVMemoryBlock
    from inferscale_integrations.llamaindex.llm import InferScaleLLM
    from inferscale_integrations.memory import KVMemory
    from inferscale_integrations.registry import register_memory

_EXPORTS = {
    "KVMemory": "inferscale_integrations.memory",
    "ChatInferScale": "inferscale_integrations.langchain.chat_model",
    "KVMemoryMiddleware": "inferscale_integrations.langchain.middleware",
    "KVMemoryStore": "inferscale_integrations.langchain.store",
    "kv_context": "inferscale_integrations.langchain.store",
    "MemoryClient": "inferscale_integrations.client",
    "InferScaleLLM": "inferscale_integrations.llamaindex.llm",
    "KVMemoryBlock": "inferscale_integrations.llamaindex.block",
    "register_memory": "inferscale_integrations.registry",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'inferscale_integrations' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
