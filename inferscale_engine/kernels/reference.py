"""Chunked RoPE in plain torch: the test oracle for the Triton kernels and the CPU path.

Keys are moved between positions by a pure rotation. The angle difference is composed from
the same fp32 tables vLLM uses for absolute positions (cos(a-b) = cos a cos b + sin a sin b),
so a key captured at position p and injected back at p reproduces vLLM's own rotation to fp32
rounding, whatever the absolute position. Math in fp32, one cast to the output dtype.

Shapes: T tokens, H kv heads, D head_dim, R rotary_dim (<= D), P table positions, L layers.
The tables travel as one RopeTables (rope_tables.py): [P, R // 2] (one RoPE for every layer) or
[G, P, R // 2] with `layer_tables` [L] naming each layer's table (Gemma 3: local and global
layers rotate with different bases).
"""

from __future__ import annotations

import torch

from inferscale_engine.kernels.rope_tables import INTERLEAVED, ROTATE_HALF, RopeTables

__all__ = ["INTERLEAVED", "ROTATE_HALF", "RopeTables", "apply_rotation", "capture_", "inject_",
           "layer_rotations", "rerotate_keys", "rotate_layers", "rotation"]


def rerotate_keys(
    keys: torch.Tensor,
    from_positions: torch.Tensor,
    to_positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    style: str,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Rotate keys that sit at `from_positions` so they sit at `to_positions`.

    Args:
        keys: [..., T, H, D], any float dtype (leading dims, e.g. layers, share the rotation).
        from_positions: [T] int64 positions the keys are rotated for now.
        to_positions: [T] int64 target positions.
        cos, sin: [P, R // 2] fp32 tables of the model's RoPE (RopeSpec.cos_sin).
        style: "rotate_half" (pairs i, i + R/2) or "interleaved" (pairs 2i, 2i + 1).
        out_dtype: dtype of the result (default: keys.dtype). One rounding, at the end.

    Returns:
        [..., T, H, D] rotated keys; dims >= R pass through unchanged; tokens with from == to
        are copied bit-exactly.
    """
    return apply_rotation(keys, *rotation(from_positions, to_positions, cos, sin), style,
                          out_dtype)


def rotation(from_positions: torch.Tensor, to_positions: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token rotation from `from_positions` to `to_positions`.

    Returns:
        cos_d, sin_d: [T, 1, R / 2] fp32 cos and sin of the angle difference, composed from the
        absolute-position tables; same: [T] bool, tokens that do not move.
    """
    cos_a, sin_a = cos[to_positions], sin[to_positions]  # [T, R/2]
    cos_b, sin_b = cos[from_positions], sin[from_positions]
    cos_d = (cos_a * cos_b + sin_a * sin_b).unsqueeze(1)
    sin_d = (sin_a * cos_b - cos_a * sin_b).unsqueeze(1)
    return cos_d, sin_d, from_positions == to_positions


def apply_rotation(keys: torch.Tensor, cos_d: torch.Tensor, sin_d: torch.Tensor,
                   same: torch.Tensor, style: str, out_dtype: torch.dtype | None = None
                   ) -> torch.Tensor:
    """Apply a `rotation()` to keys [..., T, H, D]; fp32 math, one cast to `out_dtype`.

    Written into one output buffer (no concatenation or temporaries of the keys' size): this
    is the CPU serving path too, where a request's injection rotates every layer's keys.
    """
    out_dtype = out_dtype or keys.dtype
    half = cos_d.shape[-1]
    rotary_dim = 2 * half
    if style == ROTATE_HALF:
        pick = (slice(0, half), slice(half, rotary_dim))
    elif style == INTERLEAVED:
        pick = (slice(0, rotary_dim, 2), slice(1, rotary_dim, 2))
    else:
        raise ValueError(f"unknown rope style {style!r}; use 'rotate_half' or 'interleaved'")
    x = keys.float()
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    x1, x2 = x[..., pick[0]], x[..., pick[1]]
    o1, o2 = out[..., pick[0]], out[..., pick[1]]
    torch.mul(x1, cos_d, out=o1)
    o1.sub_(x2 * sin_d)
    torch.mul(x2, cos_d, out=o2)
    o2.add_(x1 * sin_d)
    if rotary_dim < x.shape[-1]:
        out[..., rotary_dim:] = x[..., rotary_dim:]
    out = out.to(out_dtype)
    if bool(same.any()):  # tokens that do not move: copied bit-exactly
        stay = same.nonzero().squeeze(1)
        dim = out.dim() - 3
        out.index_copy_(dim, stay, keys.index_select(dim, stay).to(out_dtype))
    return out


def layer_rotations(from_positions: torch.Tensor, to_positions: torch.Tensor,
                    rope: RopeTables, num_layers: int
                    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """`rotation()` of each of `num_layers` layers; layers that share a table share one.

    With [G, P, R // 2] tables, rope.layer_tables ([L], one entry per layer) is required.
    """
    cos, sin, layer_tables = rope.cos, rope.sin, rope.layer_tables
    if cos.dim() == 2:
        return [rotation(from_positions, to_positions, cos, sin)] * num_layers
    if layer_tables is None or len(layer_tables) != num_layers:
        raise ValueError(f"[G, P, R // 2] tables need layer_tables with one entry per layer "
                         f"({num_layers}); got {layer_tables!r}")
    tables = [int(t) for t in layer_tables]
    moves = {t: rotation(from_positions, to_positions, cos[t], sin[t]) for t in set(tables)}
    return [moves[t] for t in tables]


def rotate_layers(keys: torch.Tensor, from_positions: torch.Tensor, to_positions: torch.Tensor,
                  rope: RopeTables, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """`rerotate_keys` of keys [L, T, H, D], each layer with its own table (see layer_rotations)."""
    if rope.cos.dim() == 2:
        return rerotate_keys(keys, from_positions, to_positions, rope.cos, rope.sin, rope.style,
                             out_dtype)
    moves = layer_rotations(from_positions, to_positions, rope, keys.shape[0])
    return torch.stack([apply_rotation(layer_keys, *move, rope.style, out_dtype)
                        for layer_keys, move in zip(keys, moves, strict=True)])


def inject_(
    key_caches: list[torch.Tensor],
    value_caches: list[torch.Tensor],
    slab_keys: torch.Tensor,
    slab_values: torch.Tensor,
    src_rows: torch.Tensor,
    dst_slots: torch.Tensor,
    from_positions: torch.Tensor,
    to_positions: torch.Tensor,
    rope: RopeTables,
) -> None:
    """Write slab rows into paged KV slots of every layer, keys rotated to serving positions.

    Args:
        key_caches, value_caches: per layer [num_blocks, block_size, H, D] views (any strides).
        slab_keys, slab_values: [L, num_rows, H, D] stored KV (keys at canonical positions).
        src_rows: [T] int64 slab rows.  dst_slots: [T] int64 paged slots (block * bs + offset).
        from_positions: [T] canonical positions.  to_positions: [T] serving positions.
        rope: the RoPE tables of every layer (see layer_rotations).
    """
    block_size = key_caches[0].shape[1]
    blocks, offsets = dst_slots // block_size, dst_slots % block_size
    moves = layer_rotations(from_positions, to_positions, rope, len(key_caches))
    for layer, (k_cache, v_cache, move) in enumerate(zip(key_caches, value_caches, moves)):
        k_cache[blocks, offsets] = apply_rotation(slab_keys[layer, src_rows], *move, rope.style,
                                                  k_cache.dtype)
        v_cache[blocks, offsets] = slab_values[layer, src_rows].to(v_cache.dtype)


def capture_(
    key_caches: list[torch.Tensor],
    value_caches: list[torch.Tensor],
    slab_keys: torch.Tensor,
    slab_values: torch.Tensor,
    src_slots: torch.Tensor,
    dst_rows: torch.Tensor,
    from_positions: torch.Tensor,
    to_positions: torch.Tensor,
    rope: RopeTables,
) -> None:
    """Copy paged KV slots of every layer into slab rows, keys rotated to canonical positions.

    Same shapes as `inject_`, with src_slots/dst_rows in place of src_rows/dst_slots and
    from_positions = serving positions, to_positions = canonical positions.
    """
    block_size = key_caches[0].shape[1]
    blocks, offsets = src_slots // block_size, src_slots % block_size
    moves = layer_rotations(from_positions, to_positions, rope, len(key_caches))
    for layer, (k_cache, v_cache, move) in enumerate(zip(key_caches, value_caches, moves)):
        slab_keys[layer, dst_rows] = apply_rotation(k_cache[blocks, offsets], *move, rope.style,
                                                    slab_keys.dtype)
        slab_values[layer, dst_rows] = v_cache[blocks, offsets].to(slab_values.dtype)
