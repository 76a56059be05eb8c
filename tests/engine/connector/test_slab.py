"""Slab allocator and storage."""

from __future__ import annotations

import pytest
import torch

from inferscale_engine.connector.slab import KVSlab
from inferscale_engine.errors import SlabFullError
from inferscale_engine.runtime.residency import SlabAllocator


def test_allocator_all_or_nothing_and_reuse():
    alloc = SlabAllocator(num_pages=4, page_tokens=16)
    a = alloc.allocate(20)  # 2 pages
    assert len(a) == 2 and alloc.num_free_pages == 2
    with pytest.raises(SlabFullError, match="slab is full"):
        alloc.allocate(40)  # 3 pages
    assert alloc.num_free_pages == 2
    alloc.free(a)
    assert sorted(alloc.allocate(64)) == [0, 1, 2, 3]


def test_rows_follow_pages():
    slab = KVSlab(num_layers=2, num_pages=4, page_tokens=4, num_kv_heads=1, head_dim=8,
                  dtype=torch.float32, device=torch.device("cpu"))
    assert slab.rows_for([2, 0], 6).tolist() == [8, 9, 10, 11, 0, 1]
    with pytest.raises(ValueError):
        slab.rows_for([9], 2)
    with pytest.raises(ValueError):
        slab.rows_for([1], 5)
    assert slab.stats()["capacity_bytes"] == 16 * slab.bytes_per_token == 16 * 2 * 2 * 8 * 4
