"""The worker's index math for a load: vectorized, checked against a per-token reference."""

from __future__ import annotations

import pickle
import random
from array import array
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from inferscale_engine.config import ConnectorConfig
from inferscale_engine.connector.metadata import InferScaleMetadata, LoadSpec
from inferscale_engine.connector.slab import KVSlab, SlabEntry
from inferscale_engine.connector.worker import InferScaleWorker
from inferscale_engine.protocol.plan import SYSTEM_OWNER

BLOCK_SIZE = 16
PAGE_TOKENS = 16


def make_worker() -> InferScaleWorker:
    from transformers import LlamaConfig

    hf_config = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                            num_key_value_heads=1, architectures=["LlamaForCausalLM"])
    vllm_config = SimpleNamespace(
        model_config=SimpleNamespace(hf_config=hf_config, max_model_len=4096,
                                     dtype=torch.float32,
                                     get_num_kv_heads=lambda parallel: 1,
                                     get_head_size=lambda: 8),
        parallel_config=None,
        cache_config=SimpleNamespace(block_size=BLOCK_SIZE, cache_dtype="auto"))
    config = ConnectorConfig(slab_pages=256, page_tokens=PAGE_TOKENS, max_positions=4096)
    worker = InferScaleWorker(vllm_config, config)  # type: ignore[arg-type]
    worker.slab = KVSlab(1, 256, PAGE_TOKENS, 1, 8, torch.float32, torch.device("cpu"))
    return worker


def make_load(worker: InferScaleWorker, rng: random.Random, user: str = "alice"
              ) -> LoadSpec:
    """A preamble and facts in scattered slab pages, and a random block table."""
    assert worker.slab is not None
    lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 12))]
    pages = rng.sample(range(256), sum(-(-n // PAGE_TOKENS) for n in lengths))
    keys = rng.sample(range(1, 10_000), len(lengths))
    for i, (key, n) in enumerate(zip(keys, lengths)):
        num_pages = -(-n // PAGE_TOKENS)
        mine, pages = pages[:num_pages], pages[num_pages:]
        worker.slab.entries[key] = SlabEntry(SYSTEM_OWNER if i == 0 else user,
                                             worker.slab.rows_for(mine, n), n,
                                             rng.randint(0, 500))
    num_tokens = sum(lengths)
    lo = rng.randint(0, num_tokens - 1)
    hi = rng.randint(lo + 1, num_tokens)
    blocks = rng.sample(range(1000), -(-(num_tokens + 5) // BLOCK_SIZE))
    return LoadSpec("req", user, np.array(keys, dtype=np.int64),
                    np.array(lengths, dtype=np.int64), lo, hi, np.array(blocks, dtype=np.int64))


def as_arrays(load: LoadSpec) -> LoadSpec:
    """The same load with array('q') fields, as the scheduler builds it (numpy: unpickled)."""
    return LoadSpec(load.req_id, load.user_id, array("q", load.slab_keys),
                    array("q", load.lengths), load.load_start, load.load_end,
                    array("q", load.block_ids))


def reference_indices(worker: InferScaleWorker, load: LoadSpec) -> np.ndarray:
    """The same four rows, one token at a time."""
    assert worker.slab is not None
    out, start = [], 0
    for key, n in zip(load.slab_keys.tolist(), load.lengths.tolist()):
        entry = worker.slab.entries[key]
        for i in range(n):
            position = start + i
            if load.load_start <= position < load.load_end:
                block = int(load.block_ids[position // BLOCK_SIZE])
                out.append((int(entry.rows[i]), block * BLOCK_SIZE + position % BLOCK_SIZE,
                            entry.origin + i, position))
        start += n
    return np.array(out, dtype=np.int64).T


@pytest.mark.parametrize("seed", range(40))
def test_load_indices_match_a_per_token_reference(seed):
    worker = make_worker()
    load = make_load(worker, random.Random(seed))
    load = as_arrays(load) if seed % 2 else load
    got = worker._load_indices(load)
    assert got is not None and np.array_equal(got, reference_indices(worker, load))
    assert not worker.take_failed_block_ids()


def break_entry(worker: InferScaleWorker, key: int, problem: str) -> None:
    """Make slab entry `key` fail a load's check: missing, another user's, or shorter."""
    assert worker.slab is not None
    entry = worker.slab.entries[key]
    if problem == "missing":
        del worker.slab.entries[key]
    elif problem == "foreign":
        worker.slab.entries[key] = SlabEntry("mallory", entry.rows, entry.num_tokens, 0)
    else:
        worker.slab.entries[key] = SlabEntry("alice", entry.rows[:-1], entry.num_tokens - 1, 0)


@pytest.mark.parametrize("problem", ["missing", "foreign", "length"])
def test_a_bad_segment_fails_the_whole_load(problem):
    worker = make_worker()
    assert worker.slab is not None
    load = make_load(worker, random.Random(7))
    load = LoadSpec(load.req_id, load.user_id, load.slab_keys, load.lengths, 0,
                    sum(load.lengths), load.block_ids)
    break_entry(worker, int(load.slab_keys[-1]), problem)
    worker.paged = SimpleNamespace(inject_=lambda *a: pytest.fail("injected"))  # type: ignore
    worker._rope = SimpleNamespace()  # type: ignore[assignment]
    worker.start_load(InferScaleMetadata(loads=[load]))
    num_blocks = -(-load.load_end // BLOCK_SIZE)
    assert worker.take_failed_block_ids() == set(load.block_ids[:num_blocks].tolist())
    assert worker.counters["load_errors"] == 1 and worker.counters["injected_tokens"] == 0


@pytest.mark.parametrize("arrays", [False, True], ids=["numpy", "array"])
def test_load_spec_pickles_its_arrays_as_bytes(arrays):
    load = make_load(make_worker(), random.Random(3))
    load = as_arrays(load) if arrays else load
    data = pickle.dumps(InferScaleMetadata(loads=[load]))
    back = pickle.loads(data).loads[0]
    assert (back.req_id, back.user_id, back.load_start, back.load_end) == (
        load.req_id, load.user_id, load.load_start, load.load_end)
    for name in ("slab_keys", "lengths", "block_ids"):
        assert np.array_equal(getattr(back, name), getattr(load, name))
        assert getattr(back, name).dtype == np.int64
    assert b"numpy" not in data


def whole(load: LoadSpec) -> LoadSpec:
    """The same load over every plan token (the usual case: load_start 0, load_end = all)."""
    return LoadSpec(load.req_id, load.user_id, load.slab_keys, load.lengths, 0,
                    sum(load.lengths), load.block_ids)


@pytest.mark.parametrize("seed", range(10))
def test_whole_plan_loads_match_the_reference(seed):
    worker = make_worker()
    load = whole(make_load(worker, random.Random(100 + seed)))
    got = worker._load_indices(load)
    assert got is not None and np.array_equal(got, reference_indices(worker, load))


def test_a_step_of_several_loads_uploads_the_good_ones_back_to_back():
    """One index for the step: the loads' columns in order, a failed load leaving no gap."""
    worker = make_worker()
    assert worker.slab is not None
    rng = random.Random(5)
    loads = [whole(make_load(worker, rng, user)) for user in ("alice", "bob", "carol")]
    bad = LoadSpec("bad", "bob", loads[1].slab_keys, loads[1].lengths, 0,
                   sum(loads[1].lengths), loads[1].block_ids)
    del worker.slab.entries[int(bad.slab_keys[-1])]  # not resident any more: this load fails
    seen: list[torch.Tensor] = []
    worker.paged = SimpleNamespace(  # type: ignore[assignment]
        inject_=lambda slab, index, rope: seen.append(index.clone()))
    worker._rope = SimpleNamespace()  # type: ignore[assignment]
    worker.start_load(InferScaleMetadata(loads=[loads[0], bad, loads[2]]))
    want = np.concatenate([reference_indices(worker, loads[0]),
                           reference_indices(worker, loads[2])], axis=1)
    assert len(seen) == 1 and np.array_equal(seen[0].numpy(), want)
    assert worker.counters["injected_requests"] == 2
    assert worker.counters["injected_tokens"] == want.shape[1]
    assert worker.counters["load_errors"] == 1
    assert [rid for rid, _ in worker.recent_loads] == ["req", "req"]
    assert np.array_equal(worker.recent_loads[-1][1], want[1, -loads[2].load_end:])


def test_a_load_with_a_short_block_table_fails_alone():
    """Blocks for fewer tokens than the load: that load fails (its blocks recomputed), the
    step's other loads are injected, nothing raises."""
    worker = make_worker()
    seen: list[torch.Tensor] = []
    worker.paged = SimpleNamespace(  # type: ignore[assignment]
        inject_=lambda slab, index, rope: seen.append(index.clone()))
    worker._rope = SimpleNamespace()  # type: ignore[assignment]
    rng = random.Random(11)
    good, bad = (whole(make_load(worker, rng, user)) for user in ("alice", "bob"))
    short = bad.block_ids[:(bad.load_end - 1) // BLOCK_SIZE]
    bad = LoadSpec("short", "bob", bad.slab_keys, bad.lengths, 0, bad.load_end, short)
    worker.start_load(InferScaleMetadata(loads=[bad, good]))
    assert len(seen) == 1 and np.array_equal(seen[0].numpy(), reference_indices(worker, good))
    assert worker.counters["injected_requests"] == 1 and worker.counters["load_errors"] == 1
    assert worker.take_failed_block_ids() == set(short.tolist())
