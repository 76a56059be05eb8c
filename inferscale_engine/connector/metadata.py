"""Step metadata: built by the scheduler-side connector, read by the worker-side connector.

One record per request and direction (two typed lists, never a load/save flag). Block ids are
sent instead of per-token slots: the worker derives slots with one vectorized expression, and
the record stays small when pickled to worker processes every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata


@dataclass(slots=True)
class LoadSpec:
    """Inject stored KV into prompt positions [load_start, load_end) of one request."""

    req_id: str
    user_id: str
    slab_keys: list[int]
    """Slab entry of each plan segment, in prompt order."""
    starts: list[int]
    """Serving position of each segment's first token."""
    lengths: list[int]
    load_start: int
    load_end: int
    block_ids: list[int]
    """The request's block table (covering at least [0, load_end))."""


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
