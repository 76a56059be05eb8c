"""Fixtures of the memory tests that share one tiny engine per module."""

from __future__ import annotations

import pytest

from tests.conftest import engine_config, running_engine
from tests.engine.memory.memory_support import HashEmbedder
from tests.fake_runner import FakeRunner


@pytest.fixture(scope="module")
def module_engine(tiny_models):
    """A tiny Qwen2 engine for one test module."""
    with running_engine(tiny_models["qwen2"], context_window_tokens=32) as eng:
        yield eng


@pytest.fixture()
def fake_engine(tiny_models):
    """A tiny Qwen2 engine driven by FakeRunner (no vLLM), for one test."""
    from inferscale_engine.runtime.engine import Engine

    with Engine(engine_config(tiny_models["qwen2"]), runner=FakeRunner) as eng:
        yield eng


@pytest.fixture()
def fresh_memory(module_engine, tmp_path):
    """A Memory over the module's engine with a database of its own."""
    from inferscale_engine.memory import Memory

    with Memory(module_engine, tmp_path / "memory.db", HashEmbedder(),
                progress_bar=False) as mem:
        yield mem
