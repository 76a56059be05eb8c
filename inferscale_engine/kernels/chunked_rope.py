"""Chunked RoPE in Triton: KV moves between the slab and vLLM's paged cache, keys re-rotated.

The same two operations as `reference.py` (the test oracle), each in ONE launch per call: program
(token block, layer, head block) moves BLOCK_T tokens x BLOCK_H heads of one layer. K is rotated
from `from_positions` to `to_positions` in fp32, with the angle difference composed from the fp32
tables exactly as `reference.rerotate_keys` does, and cast once; V is copied.

Shapes: T tokens, L layers, H kv heads, D head_dim, R rotary_dim (<= D), P table positions.
The tables come as one RopeTables (rope_tables.py): [P, R // 2] (every layer) or [G, P, R // 2]
with `layer_tables` [L] naming each layer's table, as in reference.py.
Index values (rows, slots, positions) are not checked on the host, since that would synchronize
the device. A token with any of them out of range is skipped (nothing read or written), so a bad
index never touches memory out of bounds. Destination slots (inject) and rows (capture) must be
unique: two tokens writing one place race.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from inferscale_engine.kernels.rope_tables import INTERLEAVED, ROTATE_HALF, RopeTables

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INDEX_DTYPES = (torch.int32, torch.int64)
_TILE_ELEMENTS = 4096
"""Elements of one [BLOCK_T, BLOCK_H, head_dim] tile: 8 KiB of bf16 K, as much V, per program."""
_MAX_OFFSET_ALIGN = 16
"""Largest alignment (elements) promised to the compiler for layer offsets; 16 B vectors need 8."""


class PagedKVPointers:
    """Every layer's paged K and V views, addressed from one base tensor. Build once, at start.

    Triton takes tensors, not arrays of pointers, and its CPU interpreter cannot turn an integer
    into a pointer. So the kernels index all layers from `base`, the view with the lowest address:
    element (block, offset, head, dim) of layer l's K (c = 0) or V (c = 1) is at
        base + layer_offsets[l, c] + block * strides[0] + offset * strides[1]
             + head * strides[2] + dim.
    Layers may be separate allocations; K and V may share one (kv[0] / kv[1], or
    kv[..., :D].transpose(1, 2)). Strides are kept as given, so NHD and HND orders both work;
    only head_dim must be contiguous. The object holds the views, so the caches outlive it.
    """

    def __init__(self, key_caches: Sequence[torch.Tensor],
                 value_caches: Sequence[torch.Tensor]) -> None:
        """Record the layout and each layer's offsets; raise ValueError on views it cannot serve.

        Args:
            key_caches: per layer [num_blocks, block_size, H, D] K views, bf16, fp16 or fp32.
            value_caches: per layer V views of the same shape, strides, dtype and device.
        """
        views = _check_views(key_caches, value_caches)
        first = views[0]
        self.num_layers = len(key_caches)
        self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim = first.shape
        self.num_slots = self.num_blocks * self.block_size
        self.dtype = first.dtype
        self.device = first.device
        stride_block, stride_slot, stride_head, _ = first.stride()
        self.strides = (stride_block, stride_slot, stride_head)
        """Element strides of block, offset (slot in block) and head; head_dim's is 1."""
        self.base = min(views, key=lambda view: view.data_ptr())
        offsets = [[_element_offset(self.base, k), _element_offset(self.base, v)]
                   for k, v in zip(key_caches, value_caches, strict=True)]
        self.layer_offsets = torch.tensor(offsets, dtype=torch.int64, device=self.device)
        """[L, 2] int64 element offsets of layer l's K and V views from `base`."""
        self.offset_alignment = math.gcd(_MAX_OFFSET_ALIGN, *(o for pair in offsets for o in pair))
        """Power of two (<= 16) dividing every layer offset: lets the compiler vectorize."""
        self.one_table = torch.zeros(self.num_layers, dtype=torch.int64, device=self.device)
        """[L] layer_tables of a single [P, R // 2] table (every layer uses table 0)."""
        self._views = views


def inject_(cache: PagedKVPointers, slab_keys: torch.Tensor, slab_values: torch.Tensor,
            src_rows: torch.Tensor, dst_slots: torch.Tensor, from_positions: torch.Tensor,
            to_positions: torch.Tensor, rope: RopeTables) -> None:
    """Write slab rows into paged slots of every layer, keys rotated to serving positions.

    Args:
        cache: the paged K and V views of every layer.
        slab_keys: [L, num_rows, H, D] stored keys (canonical positions), of the cache's dtype
            and device, head_dim contiguous.
        slab_values: [L, num_rows, H, D] stored values, same dtype, device and strides.
        src_rows: [T] int64 (or int32) slab rows.
        dst_slots: [T] int64 (or int32) paged slots, block * block_size + offset; unique.
        from_positions: [T] int64 (or int32) canonical positions.
        to_positions: [T] int64 (or int32) serving positions.
        rope: fp32 cos/sin [P, R // 2] of the model's RoPE (RopeSpec.tables), or [G, P, R // 2]
            tables, one per distinct layer RoPE, with layer_tables [L] int64 (values are not
            checked on the host: a layer naming no table is skipped); its style pairs dims.
    """
    _launch(cache, slab_keys, slab_values, src_rows, dst_slots, from_positions, to_positions,
            rope, to_cache=True,
            index_names=("src_rows", "dst_slots", "from_positions", "to_positions"))


def capture_(cache: PagedKVPointers, slab_keys: torch.Tensor, slab_values: torch.Tensor,
             src_slots: torch.Tensor, dst_rows: torch.Tensor, from_positions: torch.Tensor,
             to_positions: torch.Tensor, rope: RopeTables) -> None:
    """Copy paged slots of every layer into slab rows, keys rotated to canonical positions.

    Same shapes as `inject_`, with src_slots / dst_rows (unique) in place of src_rows /
    dst_slots, from_positions = serving positions and to_positions = canonical positions.
    """
    _launch(cache, slab_keys, slab_values, dst_rows, src_slots, from_positions, to_positions,
            rope, to_cache=False,
            index_names=("dst_rows", "src_slots", "from_positions", "to_positions"))


def _launch(cache: PagedKVPointers, slab_keys: torch.Tensor, slab_values: torch.Tensor,
            rows: torch.Tensor, slots: torch.Tensor, from_positions: torch.Tensor,
            to_positions: torch.Tensor, rope: RopeTables, to_cache: bool,
            index_names: tuple[str, str, str, str]) -> None:
    """Check the arguments, then one launch over (token blocks, layers, head blocks)."""
    indices = dict(zip(index_names, (rows, slots, from_positions, to_positions), strict=True))
    static = StaticArgs.build(cache, slab_keys, slab_values, rope, to_cache)
    num_tokens = _check_indices(cache, indices)
    if num_tokens:
        launch(static, torch.stack([i.to(torch.int64) for i in indices.values()]))


@dataclass(frozen=True, slots=True)
class StaticArgs:
    """Every argument of one direction's launch except the step's index: checked once."""

    head: tuple[Any, ...]
    """Arguments before the index (cache base, layer offsets and tables, slab keys/values)."""
    tail: tuple[Any, ...]
    """Arguments after the token count (tables, sizes, strides)."""
    options: dict[str, Any]
    """constexprs and launch options."""
    block_t: int
    grid_yz: tuple[int, int]
    device: torch.device

    @classmethod
    def build(cls, cache: PagedKVPointers, slab_keys: torch.Tensor, slab_values: torch.Tensor,
              rope: RopeTables, to_cache: bool) -> StaticArgs:
        """Check the slab and tables against the cache (ValueError if they do not fit)."""
        _check_slab(cache, slab_keys, slab_values)
        cos, sin, style = rope.cos, rope.sin, rope.style
        layer_tables = _check_tables(cache, cos, sin, style, rope.layer_tables)
        if cache.device.type == "cuda" and cache.device.index != torch.cuda.current_device():
            # Triton launches on the current device, not on the tensors' device.
            raise ValueError(f"the cache is on {cache.device} but the current CUDA device is "
                             f"{torch.cuda.current_device()}; call torch.cuda.set_device first")
        half = cos.shape[-1]
        num_tables, num_positions = (1, cos.shape[0]) if cos.dim() == 2 else cos.shape[:2]
        head_pad = triton.next_power_of_2(cache.head_dim)
        block_h = min(triton.next_power_of_2(cache.num_kv_heads),
                      max(1, _TILE_ELEMENTS // head_pad))
        options = dict(
            HEAD_DIM=cache.head_dim, HEAD_PAD=head_pad, ROTARY_DIM=2 * half,
            HALF_PAD=triton.next_power_of_2(half),
            PASS_PAD=triton.next_power_of_2(max(1, cache.head_dim - 2 * half)),
            INTERLEAVED_PAIRS=style == INTERLEAVED, OFFSET_ALIGN=cache.offset_alignment,
            BLOCK_T=max(1, _TILE_ELEMENTS // (block_h * head_pad)), BLOCK_H=block_h,
            TO_CACHE=to_cache,
            # No fmul+fadd -> fma contraction: every fp32 op rounds like torch's, so fp32
            # results match reference.py bit for bit (the interpreter ignores the option).
            num_warps=4, enable_fp_fusion=False)
        tail = (cos, sin, slab_keys.shape[1], cache.num_slots, num_positions, num_tables,
                cache.num_kv_heads, cache.block_size, *cache.strides, *slab_keys.stride()[:3],
                cos.stride(-2), 0 if cos.dim() == 2 else cos.stride(0))
        return cls((cache.base, cache.layer_offsets, layer_tables, slab_keys, slab_values),
                   tail, options, int(options["BLOCK_T"]),
                   (cache.num_layers, triton.cdiv(cache.num_kv_heads, block_h)), cache.device)

    def grid(self, num_tokens: int) -> tuple[int, int, int]:
        return (triton.cdiv(num_tokens, self.block_t), *self.grid_yz)


def launch(static: StaticArgs, index: torch.Tensor) -> Any:
    """One launch for a [4, T] index (rows, slots, from, to; int64, each row contiguous).

    Returns Triton's compiled kernel (None in the interpreter).
    """
    num_tokens = index.shape[1]
    return _move_kernel[static.grid(num_tokens)](*static.head, index, index.stride(0),
                                                 num_tokens, *static.tail, **static.options)


@triton.jit(do_not_specialize=["index_ptr", "index_stride", "num_tokens"])
def _move_kernel(
    cache_ptr, layer_offsets_ptr, layer_tables_ptr, slab_keys_ptr, slab_values_ptr,
    index_ptr, index_stride, num_tokens, cos_ptr, sin_ptr,
    num_rows, num_slots, num_positions, num_tables, num_heads, block_size,
    cache_stride_block, cache_stride_slot, cache_stride_head,
    slab_stride_layer, slab_stride_row, slab_stride_head, table_stride, table_stride_group,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, ROTARY_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr, PASS_PAD: tl.constexpr, INTERLEAVED_PAIRS: tl.constexpr,
    OFFSET_ALIGN: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
    TO_CACHE: tl.constexpr,
):
    """Slab rows <-> paged slots of layer program_id(1), BLOCK_T tokens x BLOCK_H heads.

    index_ptr: [4, num_tokens] int64 with row stride index_stride (rows, slots, from, to).
    """
    layer = tl.program_id(1).to(tl.int64)
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    # This layer's table, loaded per token (every lane reads the same entry).
    tables = tl.load(layer_tables_ptr + layer + tokens * 0).to(tl.int64)
    table_ok = (tables >= 0) & (tables < num_tables)
    table_base = tl.where(table_ok, tables, 0) * table_stride_group
    heads = (tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
    in_range = tokens < num_tokens
    # index rows: slab rows, paged slots, from positions, to positions.
    rows = tl.load(index_ptr + tokens, mask=in_range, other=0)
    slots = tl.load(index_ptr + index_stride + tokens, mask=in_range, other=0)
    from_pos = tl.load(index_ptr + 2 * index_stride + tokens, mask=in_range, other=0)
    to_pos = tl.load(index_ptr + 3 * index_stride + tokens, mask=in_range, other=0)
    valid = (in_range & (rows >= 0) & (rows < num_rows) & (slots >= 0) & (slots < num_slots)
             & (from_pos >= 0) & (from_pos < num_positions)
             & (to_pos >= 0) & (to_pos < num_positions) & table_ok)
    # A skipped token reads its angles inside the tables (clamped), never outside them.
    from_pos = tl.minimum(tl.maximum(from_pos, 0), num_positions - 1)
    to_pos = tl.minimum(tl.maximum(to_pos, 0), num_positions - 1)
    mask = valid[:, None] & (heads < num_heads)[None, :]  # [BLOCK_T, BLOCK_H]
    # Element offsets of (token, head, dim 0): [BLOCK_T, BLOCK_H].
    slab_rows = (layer * slab_stride_layer + rows * slab_stride_row)[:, None] \
        + heads[None, :] * slab_stride_head
    cache_rows = ((slots // block_size) * cache_stride_block
                  + (slots % block_size) * cache_stride_slot)[:, None] \
        + heads[None, :] * cache_stride_head
    key_offset = tl.multiple_of(tl.load(layer_offsets_ptr + 2 * layer), OFFSET_ALIGN)
    value_offset = tl.multiple_of(tl.load(layer_offsets_ptr + 2 * layer + 1), OFFSET_ALIGN)
    cache_keys = cache_ptr + key_offset + cache_rows
    cache_values = cache_ptr + value_offset + cache_rows
    cos_d, sin_d = _angle_difference(cos_ptr, sin_ptr, table_base, table_stride, from_pos,
                                     to_pos, ROTARY_DIM // 2, HALF_PAD)
    same = (from_pos == to_pos)[:, None, None]
    if TO_CACHE:
        _move(slab_keys_ptr + slab_rows, slab_values_ptr + slab_rows, cache_keys, cache_values,
              mask, cos_d, sin_d, same, HEAD_DIM, HEAD_PAD, ROTARY_DIM, HALF_PAD, PASS_PAD,
              INTERLEAVED_PAIRS)
    else:
        _move(cache_keys, cache_values, slab_keys_ptr + slab_rows, slab_values_ptr + slab_rows,
              mask, cos_d, sin_d, same, HEAD_DIM, HEAD_PAD, ROTARY_DIM, HALF_PAD, PASS_PAD,
              INTERLEAVED_PAIRS)


_INTERPRETED = isinstance(_move_kernel, InterpretedFunction)
"""Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 when this module was imported)."""


@triton.jit
def _angle_difference(cos_ptr, sin_ptr, table_base, table_stride, from_pos, to_pos,
                      HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    """cos, sin of (to - from) per token and pair: [BLOCK_T, 1, HALF_PAD] fp32.

    table_base: [BLOCK_T] element offset of each token's table (this layer's).

    cos(a - b) = cos a cos b + sin a sin b, sin(a - b) = sin a cos b - cos a sin b: the same
    products and sums, in the same order, as reference.rerotate_keys.
    """
    pairs = tl.arange(0, HALF_PAD)[None, :]
    ok = pairs < HALF
    to_row = (table_base + to_pos * table_stride)[:, None] + pairs
    from_row = (table_base + from_pos * table_stride)[:, None] + pairs
    cos_a = tl.load(cos_ptr + to_row, mask=ok, other=0.0)
    sin_a = tl.load(sin_ptr + to_row, mask=ok, other=0.0)
    cos_b = tl.load(cos_ptr + from_row, mask=ok, other=0.0)
    sin_b = tl.load(sin_ptr + from_row, mask=ok, other=0.0)
    cos_d = cos_a * cos_b + sin_a * sin_b
    sin_d = sin_a * cos_b - cos_a * sin_b
    return cos_d[:, None, :], sin_d[:, None, :]


@triton.jit
def _move(src_keys, src_values, dst_keys, dst_values, mask, cos_d, sin_d, same,
          HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, ROTARY_DIM: tl.constexpr,
          HALF_PAD: tl.constexpr, PASS_PAD: tl.constexpr, INTERLEAVED_PAIRS: tl.constexpr):
    """K rotated and V copied for [BLOCK_T, BLOCK_H] pointers to (token, head, dim 0)."""
    if INTERLEAVED_PAIRS:
        _rotate_interleaved(src_keys, dst_keys, mask, cos_d, sin_d, same, ROTARY_DIM, HALF_PAD)
    else:
        _rotate_half(src_keys, dst_keys, mask, cos_d, sin_d, same, ROTARY_DIM // 2, HALF_PAD)
    if ROTARY_DIM < HEAD_DIM:
        _copy_dims(src_keys + ROTARY_DIM, dst_keys + ROTARY_DIM, mask, HEAD_DIM - ROTARY_DIM,
                   PASS_PAD)
    _copy_dims(src_values, dst_values, mask, HEAD_DIM, HEAD_PAD)


@triton.jit
def _rotate_half(src, dst, mask, cos_d, sin_d, same, HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    """Pairs (i, i + HALF): two contiguous [BLOCK_T, BLOCK_H, HALF_PAD] halves."""
    pairs = tl.arange(0, HALF_PAD)[None, None, :]
    ok = mask[:, :, None] & (pairs < HALF)
    x1 = tl.load(src[:, :, None] + pairs, mask=ok, other=0.0)
    x2 = tl.load(src[:, :, None] + HALF + pairs, mask=ok, other=0.0)
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    out1 = (a * cos_d - b * sin_d).to(x1.dtype)
    out2 = (b * cos_d + a * sin_d).to(x2.dtype)
    tl.store(dst[:, :, None] + pairs, tl.where(same, x1, out1), mask=ok)
    tl.store(dst[:, :, None] + HALF + pairs, tl.where(same, x2, out2), mask=ok)


@triton.jit
def _rotate_interleaved(src, dst, mask, cos_d, sin_d, same, ROTARY_DIM: tl.constexpr,
                        HALF_PAD: tl.constexpr):
    """Pairs (2i, 2i + 1): one contiguous load, split into pairs in registers."""
    dims = tl.arange(0, 2 * HALF_PAD)[None, None, :]
    ok = mask[:, :, None] & (dims < ROTARY_DIM)
    x = tl.load(src[:, :, None] + dims, mask=ok, other=0.0)  # [BLOCK_T, BLOCK_H, 2 * HALF_PAD]
    pairs = tl.reshape(x.to(tl.float32), (x.shape[0], x.shape[1], HALF_PAD, 2))
    a, b = tl.split(pairs)
    rotated = tl.join(a * cos_d - b * sin_d, b * cos_d + a * sin_d)
    out = tl.reshape(rotated, (x.shape[0], x.shape[1], 2 * HALF_PAD)).to(x.dtype)
    tl.store(dst[:, :, None] + dims, tl.where(same, x, out), mask=ok)


@triton.jit
def _copy_dims(src, dst, mask, NUM_DIMS: tl.constexpr, DIMS_PAD: tl.constexpr):
    """Dims [0, NUM_DIMS) from each [BLOCK_T, BLOCK_H] pointer, unchanged."""
    dims = tl.arange(0, DIMS_PAD)[None, None, :]
    ok = mask[:, :, None] & (dims < NUM_DIMS)
    tl.store(dst[:, :, None] + dims, tl.load(src[:, :, None] + dims, mask=ok), mask=ok)


def _check_views(key_caches: Sequence[torch.Tensor],
                 value_caches: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """All K then all V views, after checking they can share one set of kernel arguments."""
    if not key_caches or len(key_caches) != len(value_caches):
        raise ValueError(f"need one key view and one value view per layer; got "
                         f"{len(key_caches)} key and {len(value_caches)} value views")
    views = [*key_caches, *value_caches]
    first = views[0]
    _check_dtype("paged KV cache", first.dtype)
    if first.dim() != 4 or first.stride(-1) != 1:
        raise ValueError(f"paged KV views must be [num_blocks, block_size, H, D] with head_dim "
                         f"contiguous; got shape {tuple(first.shape)}, strides {first.stride()}")
    for i, view in enumerate(views):
        if _describe(view) != _describe(first):
            kind, layer = ("key", "value")[i // len(key_caches)], i % len(key_caches)
            raise ValueError(f"{kind} view of layer {layer} is {_describe(view)} but layer 0's "
                             f"key view is {_describe(first)}; every layer's K and V views must "
                             "share shape, strides, dtype and device")
    if first.device.type == "cpu" and not _INTERPRETED:
        raise ValueError("CPU caches run only in Triton's interpreter (set TRITON_INTERPRET=1 "
                         "before importing triton); on CPU use reference.inject_ / capture_")
    if first.device.type != "cpu" and _INTERPRETED:
        raise ValueError(f"under TRITON_INTERPRET=1 the caches must be CPU tensors (the "
                         f"interpreter copies only the base tensor); got {first.device}")
    return views


def _describe(t: torch.Tensor) -> tuple[object, ...]:
    return tuple(t.shape), t.stride(), t.dtype, t.device


def _element_offset(base: torch.Tensor, view: torch.Tensor) -> int:
    distance = view.data_ptr() - base.data_ptr()
    if distance % base.element_size():
        raise ValueError(f"a KV view starts {distance} bytes from the lowest one, not a "
                         f"multiple of the element size {base.element_size()}")
    return distance // base.element_size()


def _check_dtype(what: str, dtype: torch.dtype) -> None:
    if dtype in _DTYPES:
        return
    if "float8" in str(dtype):
        raise ValueError(f"{what} dtype {dtype} is fp8: its values are scaled and keys cannot be "
                         "re-rotated without the scales; serve with kv_cache_dtype='auto' "
                         "(bfloat16 / float16)")
    raise ValueError(f"{what} dtype {dtype} is not supported; use bfloat16, float16 or float32")


def _check_slab(cache: PagedKVPointers, slab_keys: torch.Tensor,
                slab_values: torch.Tensor) -> None:
    want = (cache.num_layers, "num_rows", cache.num_kv_heads, cache.head_dim)
    for name, slab in (("slab_keys", slab_keys), ("slab_values", slab_values)):
        shape = tuple(slab.shape)
        if slab.dim() != 4 or (shape[0], shape[2], shape[3]) != (want[0], want[2], want[3]):
            raise ValueError(f"{name} must be [L, num_rows, H, D] = {list(want)} to match the "
                             f"cache; got {list(shape)}")
        if slab.dtype != cache.dtype:
            _check_dtype(name, slab.dtype)
            raise ValueError(f"{name} dtype {slab.dtype} differs from the cache's {cache.dtype}; "
                             "allocate the slab in the cache dtype")
        if slab.device != cache.device:
            raise ValueError(f"{name} is on {slab.device}, the cache on {cache.device}")
        if slab.stride(-1) != 1:
            raise ValueError(f"{name} must have head_dim contiguous; strides {slab.stride()}")
    if slab_values.shape != slab_keys.shape or slab_values.stride() != slab_keys.stride():
        raise ValueError(f"slab_values {list(slab_values.shape)} (strides {slab_values.stride()}) "
                         f"must match slab_keys {list(slab_keys.shape)} "
                         f"(strides {slab_keys.stride()})")


def _check_indices(cache: PagedKVPointers, indices: dict[str, torch.Tensor]) -> int:
    """Number of tokens T, after checking every index tensor is a contiguous [T] int tensor."""
    num_tokens = next(iter(indices.values())).numel()
    for name, index in indices.items():
        if index.dim() != 1 or index.dtype not in _INDEX_DTYPES or index.stride(0) != 1:
            raise ValueError(f"{name} must be a contiguous 1-D int64 or int32 tensor; got "
                             f"{index.dtype} of shape {list(index.shape)}")
        if index.numel() != num_tokens:
            lengths = {n: i.numel() for n, i in indices.items()}
            raise ValueError(f"index tensors must all have one entry per token; got {lengths}")
        if index.device != cache.device:
            raise ValueError(f"{name} is on {index.device}, the cache on {cache.device}")
    return num_tokens


def _check_tables(cache: PagedKVPointers, cos: torch.Tensor, sin: torch.Tensor,
                  style: str, layer_tables: torch.Tensor | None) -> torch.Tensor:
    """The [L] layer_tables to launch with, after checking the tables and their layer map."""
    if style not in (ROTATE_HALF, INTERLEAVED):
        raise ValueError(f"unknown rope style {style!r}; use {ROTATE_HALF!r} or {INTERLEAVED!r}")
    for name, table in (("cos", cos), ("sin", sin)):
        if table.dim() not in (2, 3) or table.dtype != torch.float32 or table.stride(-1) != 1:
            raise ValueError(f"{name} must be a [P, rotary_dim // 2] (or [G, P, rotary_dim // 2]) "
                             f"fp32 table with a contiguous last dim (RopeSpec.cos_sin); got "
                             f"{table.dtype} {list(table.shape)}, strides {table.stride()}")
        if table.device != cache.device:
            raise ValueError(f"{name} is on {table.device}, the cache on {cache.device}")
    if cos.shape != sin.shape or cos.stride() != sin.stride():
        raise ValueError(f"cos {list(cos.shape)} and sin {list(sin.shape)} must have one shape "
                         "and strides")
    if not 0 < 2 * cos.shape[-1] <= cache.head_dim:
        raise ValueError(f"rotary_dim = 2 * cos.shape[-1] = {2 * cos.shape[-1]} must be in "
                         f"(0, head_dim={cache.head_dim}]")
    if cos.dim() == 2:
        if layer_tables is not None:
            raise ValueError("layer_tables goes with [G, P, rotary_dim // 2] tables only")
        return cache.one_table
    if (layer_tables is None or layer_tables.shape != (cache.num_layers,)
            or layer_tables.dtype != torch.int64 or layer_tables.device != cache.device):
        got = None if layer_tables is None else (
            layer_tables.dtype, list(layer_tables.shape), layer_tables.device)
        raise ValueError(f"[G, P, rotary_dim // 2] tables need layer_tables: a [L = "
                         f"{cache.num_layers}] int64 tensor on {cache.device}; got {got}")
    return layer_tables.contiguous()
