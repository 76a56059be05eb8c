"""KVMemory: ONE object that is both a LangChain memory and a LlamaIndex memory.

It serves a LangChain chain and a LlamaIndex engine alternately over the same conversation.
LangChain comes first in the MRO (the other order breaks langchain_core.load.dumpd), so
`to_json()` is LangChain's (a dict); `json()` returns LlamaIndex's JSON string, and
`from_json` accepts either. Needs both extras; each framework alone has its own class:
LangChainKVMemory, LlamaIndexKVMemory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

try:
    from inferscale_integrations.langchain.memory import LangChainKVMemory
    from inferscale_integrations.llamaindex.memory import LlamaIndexKVMemory
except ImportError as exc:  # pragma: no cover - exercised only without an extra
    raise ImportError(
        f"KVMemory needs both LangChain and LlamaIndex ({exc}); install them with: pip install "
        "'inferscale-kv[langchain,llamaindex]', or use LangChainKVMemory / LlamaIndexKVMemory "
        "from inferscale_integrations.langchain / .llamaindex") from exc

from llama_index.core.schema import BaseComponent


# Both bases define to_json (LangChain: a dict, LlamaIndex: a str); LangChain's wins by MRO and
# json() returns LlamaIndex's string (README.md: LlamaIndex json() / from_json).
class KVMemory(LangChainKVMemory, LlamaIndexKVMemory):  # type: ignore[misc]
    """Long-term memory served as injected KV, for LangChain and LlamaIndex alike."""

    @classmethod
    def class_name(cls) -> str:
        return "InferScaleKVMemory"

    def json(self, **kwargs: Any) -> str:  # type: ignore[override]
        """LlamaIndex's JSON string (to_json() is LangChain's dict)."""
        return BaseComponent.to_json(self, **kwargs)

    @classmethod
    def from_json(cls, data: str | Mapping[str, Any],  # type: ignore[override]
                  **kwargs: Any) -> KVMemory:
        """Rebuild from LlamaIndex's JSON string (json()) or LangChain's to_json() dict."""
        if isinstance(data, Mapping):
            if data.get("type") != "constructor" or "kwargs" not in data:
                raise ValueError("expected KVMemory.to_json() output (a LangChain constructor "
                                 "dict) or KVMemory.json() output (a string)")
            return cls.from_dict(dict(data["kwargs"]), **kwargs)
        return cls.from_dict(json.loads(data), **kwargs)
