"""InferScale engine: facts prefilled once, their KV injected into vLLM's paged KV cache.

Names are resolved lazily (PEP 562): vLLM's processes import `inferscale_engine.connector`,
which must not pull in the engine, the fact store or the embedder. Type checkers and IDEs see
the real classes (the imports under TYPE_CHECKING).

  errors.py   InferScaleError and its kinds     config.py  EngineConfig, ConnectorConfig
  facts.py    Fact, FactId, MemoryHandle        checks.py  every input rule, one place
  cli.py      the `inferscale` command
  data_commands.py  `inferscale export | import | backup | restore`
  protocol/   the plan protocol (kv_transfer_params) between the app and vLLM's processes
  model/      model support: RoPE, architecture checks, calibration, the small model
  prompting/  prompts from token ids, layouts, encoding contexts, tool calls
  runtime/    the Engine and what drives vLLM (write path, read path, residency)
  kernels/    Chunked RoPE (Triton) and its reference
  connector/  what vLLM loads in its processes (scheduler and worker halves)
  memory/     Memory: users, durable facts, retrieval, serving
  server/     `inferscale serve`
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferscale_engine.config import EngineConfig
    from inferscale_engine.errors import (
        ConfigError,
        EngineClosedError,
        FactNotFoundError,
        HandleError,
        InferScaleError,
        InvalidFactError,
        InvalidRequestError,
        InvalidTurnError,
        InvalidUserIdError,
        PlanError,
        SlabFullError,
        StoreError,
        UnsupportedModelError,
    )
    from inferscale_engine.facts import Fact, FactId, MemoryHandle
    from inferscale_engine.memory.config import MemoryConfig
    from inferscale_engine.memory.main import Memory
    from inferscale_engine.memory.types import AddResult, MemoryItem, SearchResult
    from inferscale_engine.runtime.engine import Engine
    from inferscale_engine.runtime.generation import EngineStats, Generation

_EXPORTS = {
    "Engine": "runtime.engine", "EngineStats": "runtime.generation",
    "Generation": "runtime.generation", "EngineConfig": "config",
    "Fact": "facts", "FactId": "facts", "MemoryHandle": "facts",
    "ConfigError": "errors", "EngineClosedError": "errors", "FactNotFoundError": "errors",
    "HandleError": "errors", "InferScaleError": "errors", "InvalidFactError": "errors",
    "InvalidRequestError": "errors", "PlanError": "errors", "SlabFullError": "errors",
    "UnsupportedModelError": "errors", "InvalidTurnError": "errors",
    "InvalidUserIdError": "errors", "StoreError": "errors",
    "Memory": "memory.main", "MemoryConfig": "memory.config", "AddResult": "memory.types",
    "SearchResult": "memory.types", "MemoryItem": "memory.types",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'inferscale_engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f"inferscale_engine.{module}"), name)


def __dir__() -> list[str]:
    return __all__
