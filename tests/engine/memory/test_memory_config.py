"""MemoryConfig validation, the fingerprint, Memory.from_config end to end, a model change."""

from __future__ import annotations

import dataclasses
import json

import pytest

from inferscale_engine.errors import ConfigError
from inferscale_engine.facts import MemoryHandle
from inferscale_engine.memory import Memory
from inferscale_engine.memory.config import MemoryConfig
from inferscale_engine.memory.store.fact_store import FactStore
from inferscale_engine.memory.store.fingerprint import stale_parts
from tests.conftest import FACTS, engine_config, greedy, max_abs_diff


@pytest.fixture(scope="module")
def config(tiny_models):
    return engine_config(tiny_models["qwen2"])


@pytest.mark.parametrize("overrides,message", [
    (dict(engine="model"), "EngineConfig"),
    (dict(db_path=""), "db_path"),
    (dict(embedding_model=" "), "embedding_model"),
    (dict(dedupe_threshold=0.0), "dedupe_threshold"),
    (dict(dedupe_threshold=1.5), "dedupe_threshold"),
    (dict(dedupe_threshold=float("nan")), "dedupe_threshold"),
    (dict(dedupe_threshold=True), "dedupe_threshold"),
    (dict(startup="eager"), "startup"),
    (dict(device=0), "device"),
    (dict(encode_on_add="yes"), "encode_on_add"),
    (dict(half_scan_min_rows=-1), "half_scan_min_rows"),
    (dict(half_scan_min_rows=True), "half_scan_min_rows"),
    (dict(half_scan_min_rows=1.5), "half_scan_min_rows"),
])
def test_invalid_config_is_refused(config, overrides, message):
    with pytest.raises(ConfigError, match=message):
        MemoryConfig(**{"engine": config, **overrides})


def test_config_is_frozen_and_slotted(config):
    memory_config = MemoryConfig(config)
    assert memory_config.db_path == "~/.inferscale/memory.db"
    assert memory_config.dedupe_threshold == 0.95 and memory_config.startup == "encode"
    with pytest.raises(dataclasses.FrozenInstanceError):
        memory_config.startup = "lazy"
    assert not hasattr(memory_config, "__dict__")


def test_stale_parts():
    current = {"tokenizer": "t", "fact_format": "f", "embedder": "e", "model": "m"}
    assert stale_parts(json.dumps(current), current) == set()
    assert stale_parts(json.dumps({**current, "model": "other"}), current) == set()
    assert stale_parts(json.dumps({**current, "embedder": "x"}), current) == {"embeddings"}
    assert stale_parts(json.dumps({**current, "tokenizer": "x"}), current) == {"tokens"}
    assert stale_parts(None, current) == stale_parts("not json", current) == {
        "tokens", "embeddings"}


@pytest.mark.vllm
def test_from_config_builds_everything_and_a_model_change_rebuilds_kv(config, tiny_models,
                                                                         tmp_path):
    db = str(tmp_path / "sub" / "m.db")
    memory_config = MemoryConfig(config, db_path=db, device="cpu", half_scan_min_rows=2)
    with Memory.from_config(memory_config) as memory:
        ids = [r.fact_id for r in memory.add(user_id="alice", texts=FACTS[:3])]
        assert memory._index._users["alice"]._half is not None  # float16 copies from 2 facts
        out = memory.generate(user_id="alice", query="What does Alice like?", k=1,
                              sampling=greedy(2))
        assert out.plan_status == "inject" and memory.engine.is_resident(ids[0])
        engine = memory.engine
    assert engine.closed
    with FactStore(db) as store:  # closed by the Memory, still there
        assert [f.text for f in store.get_all(user_id="alice")] == FACTS[:3]
        assert json.loads(store.fingerprint())["embedder"] == memory_config.embedding_model

    # Restart on another model (same tokenizer): the facts are kept, their KV is encoded by
    # the new model (KV is never persisted, so never reused): a fact injected where it was
    # encoded reproduces the new model's text mode.
    llama = MemoryConfig(engine_config(tiny_models["llama"]), db_path=db, device="cpu")
    with Memory.from_config(llama) as memory:
        assert memory.stats().counters["startup_facts"] == 3
        assert memory._index._users["alice"]._half is None  # the CPU default: from 8,192
        assert all(memory.engine.is_resident(i) for i in ids)
        assert json.loads(memory._store.fingerprint())["model"] == str(tiny_models["llama"])
        for fact_id in ids:
            kv, text = (memory.generate(user_id="alice", query="Who lives in Paris?",
                                        handle=MemoryHandle("alice", (fact_id,)),
                                        sampling=greedy(4), mode=mode) for mode in ("kv", "text"))
            assert kv.plan_status == "inject" and kv.num_injected_tokens > 0
            assert kv.token_ids == text.token_ids
            assert max_abs_diff(kv.logprobs, text.logprobs) <= 1e-5
