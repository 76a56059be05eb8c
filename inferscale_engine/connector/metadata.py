"""Step metadata: built by the scheduler-side connector, read by the worker-side connector.

One record per request and direction (two typed lists, never a load/save flag). Block ids are
sent instead of per-token slots: the worker derives slots with one vectorized expression, and
the record stays small when pickled to worker processes every step. A load's per-segment and
per-block fields are int64 arrays, so the worker's index math never loops over Python ints.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

Int64s: TypeAlias = "np.ndarray | array[int]"
"""A C-contiguous int64 array: array('q') as the scheduler builds it (each per request costs
a third of a numpy array's construction with cold caches), numpy after unpickling."""


@dataclass(slots=True)
class LoadSpec:
    """Inject stored KV into prompt positions [load_start, load_end) of one request."""

    req_id: str
    user_id: str
    slab_keys: Int64s
    """[num_segments] int64: slab entry of each plan segment, in prompt order."""
    lengths: Int64s
    """[num_segments] int64: tokens of each segment; they tile the prompt from position 0."""
    load_start: int
    load_end: int
    block_ids: Int64s
    """[num_blocks] int64: the request's block table (covering at least [0, load_end))."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # The arrays travel as raw bytes: the metadata is pickled every step when the workers
        # run in processes of their own, and an ndarray pickles ~20x slower than its bytes.
        return _load_spec, (self.req_id, self.user_id, _int64_bytes(self.slab_keys),
                            _int64_bytes(self.lengths), self.load_start, self.load_end,
                            _int64_bytes(self.block_ids))


@dataclass(slots=True)
class CaptureSpec:
    """Copy prompt positions [start, start + num_tokens) of one request into slab pages."""

    req_id: str
    user_id: str
    slab_key: int
    start: int
    num_tokens: int
    pages: list[int]
    block_ids: list[int]
    key_scale: list[float] = field(default_factory=list)
    """Scale of the stored keys: [] = 1, one value, or one per layer."""


@dataclass(slots=True)
class InferScaleMetadata(KVConnectorMetadata):
    """Everything the workers do for InferScale in one engine step."""

    loads: list[LoadSpec] = field(default_factory=list)
    captures: list[CaptureSpec] = field(default_factory=list)
    num_rejected: int = 0
    """Plans the scheduler refused since the last step (workers count them for metrics)."""
    num_mismatched: int = 0
    """Authentic plans that did not fit their prompt, since the last step."""


def _int64_bytes(values: Int64s) -> bytes:
    if type(values) is array and values.typecode == "q":  # native int64 already
        return values.tobytes()
    return np.ascontiguousarray(values, dtype=np.int64).tobytes()


def _load_spec(req_id: str, user_id: str, slab_keys: bytes, lengths: bytes, load_start: int,
               load_end: int, block_ids: bytes) -> LoadSpec:
    """Unpickle a LoadSpec (read-only arrays over the pickled bytes)."""
    return LoadSpec(req_id, user_id, np.frombuffer(slab_keys, np.int64),
                    np.frombuffer(lengths, np.int64), load_start, load_end,
                    np.frombuffer(block_ids, np.int64))
