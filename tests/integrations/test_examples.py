"""The example scripts run on the tiny engine, and the KVMemory script differs from its
ConversationBufferMemory twin only in the memory line (and that line's import).

In-process runs call each script's main() with the shared test Memory (registered as
'default'); one script also runs as a user runs it (`python examples/... --model tiny`), in a
fresh interpreter that starts its own engine.
"""

from __future__ import annotations

import difflib
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inferscale_engine.cli import DEMO_FACTS
from tests.integrations.conftest import MAX_TOKENS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture()
def example(monkeypatch, memory, user_id):
    """Import an example module (its folder on sys.path); the user has the demo facts."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    memory.add(user_id=user_id, texts=DEMO_FACTS)

    def load(name: str):
        sys.modules.pop(name, None)
        return importlib.import_module(name)

    return load


def test_kv_script_differs_from_the_buffer_script_only_in_the_memory_line():
    buffer = (EXAMPLES / "langchain_buffer_memory.py").read_text().splitlines()
    kv = (EXAMPLES / "langchain_kv_memory.py").read_text().splitlines()
    diff = [line for line in difflib.unified_diff(buffer, kv, lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert diff == [
        "-from langchain_classic.memory import ConversationBufferMemory",
        "+from inferscale_integrations import KVMemory",
        "-    memory = ConversationBufferMemory(return_messages=True)",
        "+    memory = KVMemory(user_id=user_id, return_messages=True)",
    ]


@pytest.mark.vllm
@pytest.mark.parametrize(("script", "num_answers"), [
    ("langchain_kv_memory", 3), ("llamaindex_chat_engine", 2),
    ("llamaindex_function_agent", 1), ("langchain_create_agent", 1), ("langgraph_store", 2),
    ("llamaindex_memory_block", 1)])
def test_example_serves_from_injected_kv(example, user_id, probe, script, num_answers):
    result = example(script).main(user_id=user_id, max_tokens=MAX_TOKENS)
    probe.report(f"examples/{script}.py")
    # The tiny model never writes a tool call: one model call per answer.
    assert len(result["answers"]) == num_answers
    assert result["counters"]["injected"] == num_answers == probe.kv_requests
    assert probe.injected_tokens > 0 and "fallback_text" not in result["counters"]


@pytest.mark.vllm
def test_buffer_script_runs_without_handles(example, user_id, probe):
    result = example("langchain_buffer_memory").main(user_id=user_id, max_tokens=MAX_TOKENS)
    assert len(result["answers"]) == 3 and result["counters"]["requests"] == 3
    assert "requests_with_handle" not in result["counters"] and probe.kv_requests == 0
    assert result["transcript"].count("Human: ") == 3


@pytest.mark.vllm
def test_kv_script_runs_from_the_command_line(tiny_models, engine):
    """The user's way in: a fresh interpreter builds its own engine and Memory (serving.py)."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "langchain_kv_memory.py"), "--model",
         str(tiny_models["qwen2"]),
         "--max-tokens", str(MAX_TOKENS)],
        capture_output=True, text=True, timeout=600, env=env, cwd=EXAMPLES.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    served = out.stdout.strip().splitlines()[-1]
    print(served)
    assert served.startswith("served:") and "'injected': 3" in served
