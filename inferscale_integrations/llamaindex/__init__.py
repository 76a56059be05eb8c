"""LlamaIndex adapters: KVMemory, KVMemoryBlock, KVStaticBlock and InferScaleLLM.

KVMemory for chat engines and agents, KVMemoryBlock for LlamaIndex's block-based Memory,
KVStaticBlock for facts always in context (pinned).

llm.py     InferScaleLLM             memory.py  LlamaIndexKVMemory
block.py   KVMemoryBlock, KVStaticBlock  remote.py  openai_like: an OpenAILike pointed at
`inferscale serve`.
Needs the `llamaindex` extra: pip install 'inferscale-kv[llamaindex]'
(openai_like: 'client').
"""

from __future__ import annotations

try:
    import llama_index.core.memory  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "inferscale_integrations.llamaindex needs llama-index-core; install it with: "
        "pip install 'inferscale-kv[llamaindex]'") from exc

from inferscale_integrations.llamaindex.block import KVMemoryBlock, KVStaticBlock
from inferscale_integrations.llamaindex.llm import InferScaleLLM
from inferscale_integrations.llamaindex.memory import LlamaIndexKVMemory
from inferscale_integrations.llamaindex.remote import openai_like

__all__ = ["InferScaleLLM", "KVMemoryBlock", "KVStaticBlock", "LlamaIndexKVMemory",
           "openai_like"]
