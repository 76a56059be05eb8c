"""One real engine (tiny Qwen2) and one Memory for the whole integrations package.

The Memory is registered as 'default', the name every framework object resolves by default.
Tests isolate themselves with their own user ids (the `user_id` fixture). The tiny model
answers gibberish: tests assert on mechanics (engine counters, plan status, handles, turns).
"""

from __future__ import annotations

import hashlib
import warnings

import pytest

from tests.conftest import running_engine
from tests.engine.memory.memory_support import HashEmbedder

MAX_TOKENS = 3
"""Answer length in tests: enough to see text, short enough for 2 shared CPU cores."""


TINY_SYSTEM_PROMPT = ("You are a helpful assistant. Facts you remember about the user are listed "
                      "below; use them to answer in a few words.\nMemory:\n")


@pytest.fixture(scope="package")
def engine(tiny_models):
    # A 64 MiB slab (16k tiny-model tokens): every test's facts AND every distinct system
    # prompt fit. The engine keeps each distinct preamble (system message) in the slab and
    # never evicts it; agents and ContextChatEngine make a new one per tool set / context.
    # The random model's answers depend on the prompt only by chance; LangChain's standard
    # suite wants non-empty ones, which this system prompt gives (the product default does not).
    with running_engine(tiny_models["qwen2"], context_window_tokens=32, max_model_len=2048,
                        slab_capacity_bytes=64 * 2**20, system_prompt=TINY_SYSTEM_PROMPT) as eng:
        yield eng


@pytest.fixture(scope="package")
def memory(engine, tmp_path_factory):
    from inferscale_engine.memory import Memory
    from inferscale_integrations.registry import register_memory, unregister_memory

    mem = Memory(engine, str(tmp_path_factory.mktemp("integrations") / "memory.db"),
                 HashEmbedder(), progress_bar=False)
    register_memory(mem)
    try:
        yield mem
    finally:
        unregister_memory()
        mem.close()


@pytest.fixture()
def user_id(request) -> str:
    """A user of this test only."""
    return "u-" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:10]


@pytest.fixture(autouse=True)
def _quiet_langchain_deprecations():
    """Classic chains and memories are deprecated upstream; that is what users run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def injected_tokens(engine) -> int:
    """Tokens the worker-side connector has written from the slab into the paged cache."""
    return sum(w.get("injected_tokens", 0) for w in engine.stats().workers)


class InjectionProbe:
    """Engine counters before and after a block: proof that answers came from injected KV."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.tokens_before = injected_tokens(engine)
        self.requests_before = engine.counters["requests_kv"]

    @property
    def injected_tokens(self) -> int:
        return injected_tokens(self.engine) - self.tokens_before

    @property
    def kv_requests(self) -> int:
        return self.engine.counters["requests_kv"] - self.requests_before

    def report(self, label: str) -> str:
        line = (f"{label}: kv requests +{self.kv_requests}, injected tokens "
                f"+{self.injected_tokens}")
        print(line)
        return line


@pytest.fixture()
def sent(engine, monkeypatch) -> list[tuple]:
    """Every engine.generate and engine.stream call of the test, as (handle, messages, mode)."""
    calls: list[tuple] = []
    real = engine.generate

    def recording(handle, messages, sampling=None, mode="kv", **options):
        calls.append((handle, list(messages), mode))
        return real(handle, messages, sampling, mode, **options)

    real_stream = engine.stream

    def recording_stream(handle, messages, sampling=None, mode="kv", **options):
        calls.append((handle, list(messages), mode))
        return real_stream(handle, messages, sampling, mode, **options)

    monkeypatch.setattr(engine, "generate", recording)
    monkeypatch.setattr(engine, "stream", recording_stream)
    return calls


@pytest.fixture()
def probe(engine, memory):
    """Start an InjectionProbe (the Memory is registered by then)."""
    return InjectionProbe(engine)
