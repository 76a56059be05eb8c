"""The CPU layout probe: reads back exactly what vLLM's own cache-write op wrote."""

from __future__ import annotations

import pytest
import torch

from inferscale_engine.connector.paged import CpuPackedPagedKV, strided_views


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size,head_dim", [(128, 64), (32, 128)])
def test_probe_reads_back_vllm_writes(dtype, block_size, head_dim):
    torch.manual_seed(0)
    heads = 2
    caches = [torch.zeros(6, heads, block_size, 2 * head_dim, dtype=dtype) for _ in range(2)]
    paged = CpuPackedPagedKV(caches, "vec")
    slots = torch.randperm(6 * block_size)[:50]
    keys = torch.randn(50, heads, head_dim).to(dtype)
    values = torch.randn(50, heads, head_dim).to(dtype)
    paged._write(caches[1], slots, keys, values)
    got_keys, got_values = paged.read(1, slots)
    assert torch.equal(got_keys, keys) and torch.equal(got_values, values)
    assert not caches[0].any()


def test_strided_views_of_known_gpu_shapes():
    kv = torch.arange(2 * 3 * 16 * 2 * 8).view(2, 3, 16, 2, 8)
    keys, values = strided_views(kv, 2, 8)
    assert keys.shape == (3, 16, 2, 8) and torch.equal(values, kv[1])
    flashinfer = kv.permute(1, 0, 2, 3, 4)
    keys, values = strided_views(flashinfer, 2, 8)
    assert torch.equal(keys, kv[0])
    unified = torch.zeros(3, 2, 16, 16)
    keys, values = strided_views(unified, 2, 8)
    assert keys.shape == (3, 16, 2, 8)
    with pytest.raises(NotImplementedError, match="unrecognized"):
        strided_views(torch.zeros(3, 16, 5), 2, 8)
