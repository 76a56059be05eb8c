"""The public surface is pinned: changing it is a decision, not an accident."""

from __future__ import annotations

import subprocess
import sys

import inferscale_engine


def test_engine_exports():
    assert inferscale_engine.__all__ == sorted([
        "ConfigError", "Engine", "EngineClosedError", "EngineConfig", "EngineStats", "Fact",
        "FactId", "FactNotFoundError", "Generation", "HandleError", "InferScaleError",
        "InvalidFactError", "InvalidRequestError", "MemoryHandle", "PlanError", "SlabFullError",
        "UnsupportedModelError",
        # the memory layer
        "AddResult", "InvalidTurnError", "InvalidUserIdError", "Memory", "MemoryConfig",
        "MemoryItem", "SearchResult", "StoreError",
    ])
    for name in inferscale_engine.__all__:
        assert getattr(inferscale_engine, name) is not None


def test_connector_imports_stay_light():
    """Every vLLM process imports the connector: it must add no engine, store, embedder or
    framework module to what vLLM itself imports."""
    code = (
        "import sys, torch, vllm.distributed.kv_transfer.kv_connector.v1.base; "
        "before = set(sys.modules); import inferscale_engine.connector; "
        "new = set(sys.modules) - before; "
        "bad = [m for m in new if m.split('.')[0] in ('sqlite3', 'sentence_transformers',"
        " 'langchain_core', 'langchain_classic', 'llama_index', 'transformers')"
        " or m.startswith('inferscale_engine.memory')"
        " or m in ('inferscale_engine.runtime.engine', 'inferscale_engine.prompting.prompt',"
        " 'inferscale_engine.runtime.runner', 'inferscale_engine.runtime.residency')]; "
        "print(','.join(sorted(bad)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
