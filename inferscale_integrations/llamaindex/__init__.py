"""LlamaIndex adapters: KVMemory for chat engines and agents, and InferScaleLLM.

Needs the `llamaindex` extra: pip install 'inferscale[llamaindex]'.
"""

from __future__ import annotations

try:
    import llama_index.core.memory  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "inferscale_integrations.llamaindex needs llama-index-core; install it with: "
        "pip install 'inferscale[llamaindex]'") from exc

from inferscale_integrations.llamaindex.llm import InferScaleLLM
from inferscale_integrations.llamaindex.memory import LlamaIndexKVMemory

__all__ = ["InferScaleLLM", "LlamaIndexKVMemory"]
