"""Where a token's K and V live inside vLLM's paged KV cache, per attention backend.

Slots are linear: slot = block_id * block_size + offset, so the scheduler's block ids work for
any kernel block size. Two layouts:

* `CpuPackedPagedKV` (vLLM CPU_ATTN): each [block, head] holds K packed in an ISA-specific
  order, then V. Writes go through vLLM's own `cpu_attn_reshape_and_cache`; reads use a gather
  index learned once by writing probe values with that same op (so no packing is hard-coded).
* `StridedPagedKV` (GPU backends): per layer K and V are strided [num_blocks, block_size, H, D]
  views; the Chunked-RoPE kernels read and write them directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from inferscale_engine.connector.slab import KVSlab
from inferscale_engine.kernels import reference
from inferscale_engine.kernels.rope_tables import RopeTables

if TYPE_CHECKING:
    from inferscale_engine.kernels.mover import BoundMover


class PagedKV(Protocol):
    """Moves KV between the slab and the paged cache for all layers at once.

    An index is [4, T] int64 (each row contiguous): slab rows, paged slots, the positions the
    keys are rotated from, and the positions they are rotated to.
    """

    num_layers: int

    def inject_(self, slab: KVSlab, index: torch.Tensor, rope: RopeTables) -> None:
        """Slab rows -> paged slots, keys rotated from canonical to serving positions."""
        ...

    def capture_(self, slab: KVSlab, index: torch.Tensor, rope: RopeTables) -> None:
        """Paged slots -> slab rows, keys rotated from serving to canonical positions."""
        ...

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of `slots` in one layer: [T, H, D] each (tests and diagnostics)."""
        ...


@dataclass(frozen=True, slots=True)
class Fp8Cache:
    """An fp8 KV cache: vLLM's name for it, the float8 type its bytes hold, per-layer scales."""

    name: str
    """kv_cache_dtype as vLLM spells it: fp8 (e4m3), fp8_e4m3 or fp8_e5m2."""
    dtype: torch.dtype
    k_scales: tuple[float, ...]
    v_scales: tuple[float, ...]

    def decode(self, raw: torch.Tensor, scale: float) -> torch.Tensor:
        """The float32 values of cache bytes (as vLLM's attention reads them)."""
        return raw.view(self.dtype).to(torch.float32) * scale

    def decode_layer(self, keys: torch.Tensor, values: torch.Tensor, layer: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's K and V cache bytes decoded with that layer's scales."""
        return (self.decode(keys, self.k_scales[layer]),
                self.decode(values, self.v_scales[layer]))

    @classmethod
    def of(cls, cache_dtype: str | None, vllm_config: Any, layer_names: list[str]
           ) -> Fp8Cache | None:
        """The fp8 cache vLLM runs (None: the model dtype), with each layer's k/v scales.

        Raises:
            NotImplementedError: another quantized cache dtype.
        """
        if cache_dtype in ("auto", None):
            return None
        if cache_dtype not in _FP8_TYPES:
            raise NotImplementedError(f"kv_cache_dtype {cache_dtype!r} is not supported; use "
                                      f"'auto' or one of {sorted(_FP8_TYPES)}")
        layers = vllm_config.compilation_config.static_forward_context
        k_scales = tuple(float(getattr(layers.get(n), "_k_scale_float", 1.0))
                         for n in layer_names)
        v_scales = tuple(float(getattr(layers.get(n), "_v_scale_float", 1.0))
                         for n in layer_names)
        return cls(cache_dtype, _FP8_TYPES[cache_dtype], k_scales, v_scales)


_FP8_TYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
              "fp8_e5m2": torch.float8_e5m2}
"""vLLM's fp8 cache dtypes and the float8 type their bytes hold ('fp8' is e4m3)."""


class CpuPackedPagedKV:
    """vLLM CPU_ATTN layout: per layer [num_blocks, H, block_size, 2 * D], K/V packed per ISA.

    With an fp8 cache (`fp8`) the cache holds fp8 bytes: what is read is decoded with the
    layer's scales, and what is injected is quantized by vLLM's own write op, exactly as the
    model's own keys and values are.
    """

    def __init__(self, kv_caches: list[torch.Tensor], isa: str, fp8: Fp8Cache | None = None
                 ) -> None:
        num_blocks, num_heads, block_size, two_d = kv_caches[0].shape
        self.num_layers = len(kv_caches)
        self._kv_caches = kv_caches
        self._isa = isa
        self._fp8 = fp8
        self._block_size = block_size
        self._num_heads = num_heads
        self._head_dim = two_d // 2
        self._key_index, self._value_index = self._probe(kv_caches[0].dtype)

    def _split(self, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # The same views CPUAttentionBackendImpl.do_kv_cache_update builds (vLLM 0.32).
        num_blocks, num_heads, block_size, _ = kv.shape
        key_cache, value_cache = kv.view(num_blocks, num_heads, block_size * 2, -1).chunk(2, dim=2)
        return key_cache, value_cache

    def _write(self, kv: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor,
               values: torch.Tensor, layer: int | None = None) -> None:
        """VLLM's cache write (quantizing with `layer`'s scales; None: scale 1, the probe)."""
        from vllm import _custom_ops as ops

        key_cache, value_cache = self._split(kv)
        fp8 = self._fp8
        scales = (1.0, 1.0) if fp8 is None or layer is None else (fp8.k_scales[layer],
                                                                 fp8.v_scales[layer])
        ops.cpu_attn_reshape_and_cache(keys.contiguous(), values.contiguous(), key_cache,
                                       value_cache, slots, self._isa, k_scale=scales[0],
                                       v_scale=scales[1],
                                       kv_cache_dtype=fp8.name if fp8 else "auto")

    def _decode(self, raw: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return raw if self._fp8 is None else self._fp8.decode(raw, scale)

    def _probe(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Learn where (offset, dim) of K and V land inside one [block, head] slab.

        Writes the (offset, dim) index of every element through vLLM's write op, one digit per
        pass (base 16, or base 4 in an fp8 cache: exact in every float dtype), into block 1 of
        a 2-block scratch cache, and reads the digits back; a last pass marks which elements
        hold V.

        Returns:
            key_index, value_index: [block_size, D] int64 offsets into the block-head slab of
            2 * block_size * D elements.
        """
        bs, heads, dim = self._block_size, self._num_heads, self._head_dim
        bits = 2 if self._fp8 else 4
        scratch = torch.empty(2, heads, bs, 2 * dim, dtype=dtype)
        unset = (torch.tensor([-1.0]).to(self._fp8.dtype).view(dtype)
                 if self._fp8 else torch.tensor([-1], dtype=dtype))  # reads back as -1
        index = torch.arange(bs * dim, dtype=torch.int64).view(bs, 1, dim).expand(bs, heads, dim)
        slots = torch.arange(bs, 2 * bs, dtype=torch.int64)
        recovered = torch.zeros(heads, 2 * bs * dim, dtype=torch.int64)
        num_digits = -(-(bs * dim - 1).bit_length() // bits)
        written = torch.float32 if self._fp8 else dtype
        for digit in range(num_digits + 1):
            scratch.copy_(unset.expand_as(scratch))
            if digit < num_digits:
                keys = values = ((index >> (bits * digit)) & (2**bits - 1)).to(written)
            else:  # marker pass: K = 0, V = 1
                keys, values = torch.zeros(bs, heads, dim, dtype=written), torch.ones(
                    bs, heads, dim, dtype=written)
            self._write(scratch, slots, keys, values)
            got = self._decode(scratch[1].reshape(heads, -1)).to(torch.int64)
            if (got < 0).any() or not (self._decode(scratch[0]) == -1).all():
                raise RuntimeError("CPU KV layout probe: the write op did not fill exactly one "
                                   "block; this vLLM version's CPU layout is not supported")
            if digit < num_digits:
                recovered |= got << (bits * digit)
            else:
                holds_value = got[0] == 1
        if not all(torch.equal(recovered[h], recovered[0]) for h in range(heads)):
            raise RuntimeError("CPU KV layout probe: heads are packed differently; unsupported")
        positions = torch.arange(2 * bs * dim, dtype=torch.int64)
        key_index = torch.full((bs * dim,), -1, dtype=torch.int64)
        value_index = torch.full((bs * dim,), -1, dtype=torch.int64)
        key_index[recovered[0][~holds_value]] = positions[~holds_value]
        value_index[recovered[0][holds_value]] = positions[holds_value]
        if (key_index < 0).any() or (value_index < 0).any():
            raise RuntimeError("CPU KV layout probe: the layout is not a permutation; unsupported")
        return key_index.view(bs, dim), value_index.view(bs, dim)

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of `slots` in one layer: [T, H, D] each (decoded from an fp8 cache)."""
        kv = self._kv_caches[layer]
        flat = kv.view(kv.shape[0], self._num_heads, -1)
        blocks = (slots // self._block_size)[:, None, None]
        offsets = slots % self._block_size
        heads = torch.arange(self._num_heads)[None, :, None]
        keys = flat[blocks, heads, self._key_index[offsets][:, None, :]]
        values = flat[blocks, heads, self._value_index[offsets][:, None, :]]
        return (keys, values) if self._fp8 is None else self._fp8.decode_layer(keys, values,
                                                                                layer)

    def inject_(self, slab: KVSlab, index: torch.Tensor, rope: RopeTables) -> None:
        """Slab rows -> paged slots through vLLM's own cache-write op, one call per layer."""
        src_rows, dst_slots, from_positions, to_positions = index.unbind(0)
        out_dtype = slab.keys.dtype if self._fp8 else self._kv_caches[0].dtype
        keys = reference.rotate_layers(slab.keys[:, src_rows], from_positions, to_positions,
                                       rope, out_dtype)  # [L, T, H, D], all layers
        values = slab.values[:, src_rows]
        for layer, kv in enumerate(self._kv_caches):
            self._write(kv, dst_slots, keys[layer], values[layer], layer)

    def capture_(self, slab: KVSlab, index: torch.Tensor, rope: RopeTables) -> None:
        """Paged slots -> slab rows, gathered with the probed index."""
        _capture_read(self, slab, index, rope)


class StridedPagedKV:
    """GPU layouts: per layer K and V are strided [num_blocks, block_size, H, D] views.

    On CUDA the Triton kernels move all layers in one launch; elsewhere (or with
    use_triton=False) the plain-torch reference does, one layer at a time.

    With an fp8 cache (`fp8`) the views hold fp8 bytes: keys are rotated in the slab's dtype
    and written through vLLM's own CUDA cache write (`reshape_and_cache_flash`, quantizing
    with each layer's scales, as a prefill writes them), one call per layer; what is read is
    decoded with the same scales.
    """

    def __init__(self, key_caches: list[torch.Tensor], value_caches: list[torch.Tensor],
                 use_triton: bool | None = None, fp8: Fp8Cache | None = None) -> None:
        self.num_layers = len(key_caches)
        self.key_caches = key_caches
        self.value_caches = value_caches
        self._block_size = key_caches[0].shape[1]
        self._fp8 = fp8
        self._scales: list[tuple[torch.Tensor, torch.Tensor]] = []
        if fp8 is not None:
            use_triton = False
            device = key_caches[0].device
            self._scales = [(torch.tensor(k, dtype=torch.float32, device=device),
                             torch.tensor(v, dtype=torch.float32, device=device))
                            for k, v in zip(fp8.k_scales, fp8.v_scales, strict=True)]
        if use_triton is None:
            use_triton = key_caches[0].device.type == "cuda"
        self._pointers = None
        self._bound: tuple[torch.Tensor, torch.Tensor] | None = None
        self._bound_mover: BoundMover
        if use_triton:
            from inferscale_engine.kernels import chunked_rope

            self._pointers = chunked_rope.PagedKVPointers(key_caches, value_caches)

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of `slots` in one layer: [T, H, D] each."""
        slots = slots.to(self.key_caches[layer].device)
        blocks, offsets = slots // self._block_size, slots % self._block_size
        keys = self.key_caches[layer][blocks, offsets]
        values = self.value_caches[layer][blocks, offsets]
        return (keys, values) if self._fp8 is None else self._fp8.decode_layer(keys, values,
                                                                                layer)

    def inject_(self, slab: KVSlab, index: torch.Tensor, rope: RopeTables) -> None:
        """Slab rows -> paged slots of every layer."""
        if self._pointers is not None:
            self._mover(slab, rope).inject(index)
            return
        if self._fp8 is not None:
            self._inject_fp8(slab, index.to(slab.keys.device), rope)
            return
        rows, slots, from_positions, to_positions = index.unbind(0)
        reference.inject_(self.key_caches, self.value_caches, slab.keys, slab.values, rows,
                          slots, from_positions, to_positions, rope)

    def capture_(self, slab: KVSlab, index: torch.Tensor, rope: RopeTables) -> None:
        """Paged slots -> slab rows of every layer."""
        if self._pointers is not None:
            self._mover(slab, rope).capture(index)
            return
        if self._fp8 is not None:
            _capture_read(self, slab, index.to(slab.keys.device), rope)
            return
        rows, slots, from_positions, to_positions = index.unbind(0)
        reference.capture_(self.key_caches, self.value_caches, slab.keys, slab.values, slots,
                           rows, from_positions, to_positions, rope)

    def _inject_fp8(self, slab: KVSlab, index: torch.Tensor, rope: RopeTables) -> None:
        from vllm import _custom_ops as ops

        assert self._fp8 is not None
        src_rows, dst_slots, from_positions, to_positions = index.unbind(0)
        keys = reference.rotate_layers(slab.keys[:, src_rows], from_positions, to_positions,
                                       rope, slab.keys.dtype)  # [L, T, H, D], all layers
        values = slab.values[:, src_rows]
        for layer, (k_scale, v_scale) in enumerate(self._scales):
            ops.reshape_and_cache_flash(keys[layer], values[layer], self.key_caches[layer],
                                        self.value_caches[layer], dst_slots, self._fp8.name,
                                        k_scale, v_scale)

    def _mover(self, slab: KVSlab, rope: RopeTables) -> BoundMover:
        """The kernels bound to this slab and these tables (built at the first move)."""
        bound = (slab.keys, rope.cos)
        if self._bound is None or self._bound[0] is not bound[0] or self._bound[1] is not bound[1]:
            from inferscale_engine.kernels.mover import BoundMover

            assert self._pointers is not None
            self._bound = bound
            self._bound_mover = BoundMover(self._pointers, slab.keys, slab.values, rope)
        return self._bound_mover


def _capture_read(paged: PagedKV, slab: KVSlab, index: torch.Tensor, rope: RopeTables
                  ) -> None:
    """Paged slots -> slab rows through `paged.read` (decoded), keys rotated per layer."""
    dst_rows, src_slots, from_positions, to_positions = index.unbind(0)
    moves = reference.layer_rotations(from_positions, to_positions, rope, paged.num_layers)
    for layer, move in enumerate(moves):
        keys, values = paged.read(layer, src_slots)
        slab.keys[layer, dst_rows] = reference.apply_rotation(keys, *move, rope.style,
                                                              slab.keys.dtype)
        slab.values[layer, dst_rows] = values.to(slab.values.dtype)


def strided_views(kv: torch.Tensor, num_kv_heads: int, head_dim: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of one layer's GPU cache as [num_blocks, block_size, H, D] views (no copy).

    Recognized by shape (checked against H and D):
      * [2, num_blocks, block_size, H, D]: FlashAttention / Triton in vLLM 0.26 (K = kv[0]);
      * [num_blocks, 2, block_size, H, D]: FlashInfer (K = kv[:, 0]);
      * [num_blocks, H, block_size, 2 * D]: the per-layer logical view of vLLM 0.32.
    Strides are kept as they are, so NHD and HND physical orders both work.
    """
    shape = tuple(kv.shape)
    if kv.dim() == 5 and shape[3:] == (num_kv_heads, head_dim):
        if shape[0] == 2:
            return kv[0], kv[1]
        if shape[1] == 2:
            return kv[:, 0], kv[:, 1]
    if kv.dim() == 4 and shape[1] == num_kv_heads and shape[3] == 2 * head_dim:
        return kv[..., :head_dim].transpose(1, 2), kv[..., head_dim:].transpose(1, 2)
    raise NotImplementedError(
        f"unrecognized paged KV cache shape {shape} (H={num_kv_heads}, D={head_dim}); "
        "supported attention backends: FlashAttention, FlashInfer, Triton, CPU_ATTN")
