"""Shared fixtures: tiny random-init models built locally and real vLLM engines on them."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ARCHS = ("llama", "qwen2")


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, Path]:
    """Both tiny fixtures (Llama with llama3 RoPE scaling, Qwen2 with qkv bias), built once."""
    from tests.tiny_model import TinyModelSpec, tiny_model_path

    return {arch: tiny_model_path(TinyModelSpec(arch)) for arch in ARCHS}


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """A throwaway PostgreSQL server for the session (tests/pgserver.py).

    Skipped where PostgreSQL or psycopg is missing, unless INFERSCALE_REQUIRE_SERVICES is set
    (CI): then those tests fail, so a broken install cannot pass as skips.
    """
    from tests.pgserver import REQUIRE_ENV, PostgresServer, unavailable_reason

    reason = unavailable_reason()
    if reason:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{reason} ({REQUIRE_ENV} is set, so this is an error, not a skip)")
        pytest.skip(reason)
    with PostgresServer() as server:
        yield server


@pytest.fixture()
def postgres_url(postgres_server) -> Iterator[str]:
    """The URL of a fresh, empty database on the session's server, dropped after the test."""
    name = postgres_server.create_database()
    yield postgres_server.url_for(name)
    postgres_server.drop_database(name)


def engine_config(model: Path, **overrides: Any):
    """Small, fp32, eager engine settings for tests on 2 CPU cores."""
    from inferscale_engine.config import EngineConfig
    from inferscale_engine.prompting.layout import Layout

    # Every fact injected and encoded alone (after the facts right before it when a test
    # gives it a window) unless a test asks otherwise: the invariants compare injection with
    # plain prefills; the product defaults (W=256, similar-facts contexts, the 2 most relevant
    # facts repaired as text) have tests of their own (test_memory_defaults.py) and serve the
    # real-model acceptance tests.
    settings: dict[str, Any] = dict(
        model=str(model), dtype="float32", max_model_len=1024, enforce_eager=True,
        kv_cache_memory_bytes=64 * 2**20, slab_capacity_bytes=16 * 2**20,
        context_window_tokens=0, context_run_tokens=0, context_source="recent",
        layout=Layout(),
        vllm_overrides={"max_logprobs": 1024},
    )
    settings.update(overrides)
    return EngineConfig(**settings)


@contextlib.contextmanager
def running_engine(model: Path, **overrides: Any) -> Iterator[Any]:
    """An Engine for the duration of the block. vLLM keeps one KV connector per process
    (MP=0), so tests never hold two in-process engines at once."""
    from inferscale_engine.runtime.engine import Engine

    engine = Engine(engine_config(model, **overrides))
    try:
        yield engine
    finally:
        engine.close()
        del engine
        gc.collect()


def greedy(max_tokens: int = 6, logprobs: int | None = 1):
    """Greedy sampling that reports the sampled tokens' logprobs."""
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=logprobs)


def plain_prefill(engine, token_ids: list[int], sampling):
    """Text-mode generation under a fresh cache_salt: never served from the prefix cache."""
    import uuid

    from vllm import TokensPrompt

    from inferscale_engine.runtime.generation import from_output as _generation

    prompt = TokensPrompt(prompt_token_ids=token_ids, cache_salt=uuid.uuid4().hex)
    out = engine.llm.generate([prompt], [sampling], use_tqdm=False)[0]
    return _generation(out, "text", len(token_ids), 0.0)


def max_abs_diff(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    assert len(a) == len(b) and a, (a, b)
    return max(abs(x - y) for x, y in zip(a, b))


FACTS = [
    "Alice likes chess and lives in Paris.",
    "Bob has two cats and went to Kyoto last year.",
    "Caroline teaches yoga near the river in Lima.",
    "Melanie started pottery and has a turtle.",
    "John plays jazz violin in Boston.",
]
QUESTIONS = ["What does Alice like?", "Where did Bob go last year?", "Who has a turtle?"]
