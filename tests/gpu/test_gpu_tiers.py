"""KV tiers on a GPU: demotion to pinned host RAM and promotion back on the tier's own CUDA
stream, disk entries loaded into the slab, and a restart from disk, in bf16 through the Triton
path (vLLM 0.26, H200): every round trip injects bit-identical KV (|dlogprob| = 0 against the
answer given before the fact left the slab). Run by benchmarks/gpu/run_h200.sh; skipped
without CUDA."""

from __future__ import annotations

import pytest
import torch

from inferscale_engine.model.check import kv_bytes_per_token
from tests.conftest import FACTS, engine_config, running_engine
from tests.gpu.test_gpu_engine import GPU
from tests.invariants.test_tiers import _answer, _counter, _fill

pytestmark = [pytest.mark.gpu, pytest.mark.vllm,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _model(tiny_models, name: str):
    from tests.tiny_model import dummy_model_path

    if name.startswith("tiny"):
        return tiny_models[name.split("-")[1]], {}
    return dummy_model_path(name), {"load_format": "dummy"}


def _tokens(model, tokens: int, **extra) -> int:
    from transformers import AutoConfig

    config = engine_config(model, dtype="bfloat16", **extra)
    return tokens * kv_bytes_per_token(AutoConfig.from_pretrained(str(model)), config)


@pytest.mark.parametrize("name", ["tiny-llama", "llama-3.1-8b"])
def test_tier_round_trips_and_restart_are_bit_identical_on_gpu(tiny_models, tmp_path, name):
    model, extra = _model(tiny_models, name)
    disk = tmp_path / "disk"
    settings = {**GPU, **extra, "dtype": "bfloat16", "disk_tier_path": str(disk),
                "slab_capacity_bytes": _tokens(model, 640, **extra),
                "host_tier_bytes": _tokens(model, 400, **extra)}
    with running_engine(model, **settings) as engine:
        ids = engine.add_facts("alice", FACTS[:3], fact_ids=[1, 2, 3])
        reference = _answer(engine, "alice", ids)
        _fill(engine, "bob", 12)  # out of the slab, into pinned host RAM
        assert not any(engine.is_resident(f) for f in ids)
        hits = _counter(engine, "host_hits")
        assert _answer(engine, "alice", ids) == reference
        assert _counter(engine, "host_hits") - hits == 3
        _fill(engine, "carol", 30)  # out of host RAM too: only the disk has them
        hits, encoded = _counter(engine, "disk_hits"), _counter(engine, "encoded_facts")
        assert _answer(engine, "alice", ids) == reference
        assert _counter(engine, "disk_hits") - hits == 3
        assert _counter(engine, "encoded_facts") == encoded
        totals = engine.stats().worker_totals
        print(f"\n[gpu {name} tiers] host in/out {totals['host_bytes_in']}/"
              f"{totals['host_bytes_out']} B, disk read {totals['disk_bytes_read']} B, "
              f"{totals['disk_writes']} entries written")
    with running_engine(model, **settings) as engine:  # a restart: nothing encoded again
        assert engine.add_facts("alice", FACTS[:3], fact_ids=[1, 2, 3]) == ids
        assert _counter(engine, "encoded_facts") == 1  # the preamble
        assert _answer(engine, "alice", ids) == reference
        assert _counter(engine, "disk_hits") == 3
