"""The worker's compiled load index (load_index.c; built by inferscale_engine/native.py).

A load's index is ~20 numpy and C-level calls in Python (`InferScaleWorker._load_indices`):
~40 us warm and 100-200 us cold per request at k=100, on the critical path of every injected
request. load_index.c does the same in one call; where it cannot be built the worker keeps its
numpy path, which gives the same index (tests/engine/connector/test_native_index.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from inferscale_engine.native import compiled

MODULE_NAME = "inferscale_load_index"
SOURCE = Path(__file__).with_name("load_index.c")

LoadIndexFill = Callable[..., int]
"""fill(entries, slab_keys, lengths, user_id, system_owner, lo, hi, block_ids, block_size, out,
column) -> hi - lo, or -(i + 1) when segment i fails its check (see load_index.c)."""


def load_index_fill() -> LoadIndexFill | None:
    """The compiled fill, or None (turned off, or it cannot be built here: logged once)."""
    module = compiled(SOURCE, MODULE_NAME)
    return None if module is None else module.fill
