"""InferScale engine: facts prefilled once, their KV injected into vLLM's paged KV cache.

Names are resolved lazily (PEP 562): vLLM's processes import `inferscale_engine.connector`,
which must not pull in the engine, the fact store or the embedder.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Engine": "engine", "EngineStats": "generation", "Generation": "generation",
    "EngineConfig": "config",
    "Fact": "facts", "FactId": "facts", "MemoryHandle": "facts",
    "ConfigError": "errors", "EngineClosedError": "errors", "FactNotFoundError": "errors",
    "HandleError": "errors", "InferScaleError": "errors", "InvalidFactError": "errors",
    "InvalidRequestError": "errors", "PlanError": "errors", "SlabFullError": "errors",
    "UnsupportedModelError": "errors", "InvalidTurnError": "errors",
    "InvalidUserIdError": "errors", "StoreError": "errors",
    "Memory": "memory.main", "MemoryConfig": "memory.config", "AddResult": "memory.types",
    "SearchResult": "memory.types",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'inferscale_engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f"inferscale_engine.{module}"), name)


def __dir__() -> list[str]:
    return __all__
