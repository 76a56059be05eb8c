"""The Triton launchers of chunked_rope.py against reference.py, the oracle.

Under TRITON_INTERPRET=1 (CI, CPU) the interpreter casts fp32 -> bf16 by truncation, so 16-bit
results may differ from torch's round-to-nearest by 1 ulp; fp32 must match bit for bit. Compiled
on CUDA (TRITON_INTERPRET=0) the kernels round like torch and every dtype must match exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from inferscale_engine.kernels import chunked_rope, reference
from inferscale_engine.kernels.rope_tables import INTERLEAVED, ROTATE_HALF, RopeTables
from inferscale_engine.model.rope import RopeSpec, RopeStyle

INTERPRETED = chunked_rope._INTERPRETED
DEVICE = "cpu" if INTERPRETED else "cuda"
if not INTERPRETED and not torch.cuda.is_available():
    pytest.skip("compiled Triton kernels need CUDA; run with TRITON_INTERPRET=1",
                allow_module_level=True)

SENTINEL = -512.0  # exact in every dtype, far outside the random data
NUM_POSITIONS = 1024
ROPES: dict[str, dict[str, Any]] = {
    "default": dict(rope_type="default", theta=10000.0),
    "linear": dict(rope_type="linear", theta=10000.0, params=(("factor", 4.0),)),
    "llama3": dict(rope_type="llama3", theta=500000.0, params=(
        ("factor", 8.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
        ("original_max_position_embeddings", 8192))),
    "yarn": dict(rope_type="yarn", theta=1000000.0, params=(
        ("beta_fast", 32), ("beta_slow", 1), ("factor", 4.0),
        ("original_max_position_embeddings", 32768))),
}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Case:
    style: str = ROTATE_HALF
    rope_type: str = "default"
    dtype: torch.dtype = torch.float32
    layout: str = "NHD"
    head_dim: int = 64
    rotary_dim: int = 64
    num_heads: int = 2
    block_size: int = 16
    num_layers: int = 3
    num_blocks: int = 48
    num_rows: int = 96
    lengths: tuple[int, ...] = (7, 1, 19, 13, 21)
    """Tokens of each segment (fact); the first sits at its canonical positions (from == to)."""


def make_cache(case: Case, gen: torch.Generator, fill: float | None
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """K and V views per layer, each layer its own allocation, as vLLM's GPU backends lay them.

    NHD: [2, num_blocks, block_size, H, D] (FlashAttention), K = kv[0].
    HND: [num_blocks, H, block_size, 2 * D] (vLLM 0.32's per-layer view), K = kv[..., :D].
    """
    keys, values = [], []
    d = case.head_dim
    shape = ((2, case.num_blocks, case.block_size, case.num_heads, d) if case.layout == "NHD"
             else (case.num_blocks, case.num_heads, case.block_size, 2 * d))
    for _ in range(case.num_layers):
        kv = (torch.randn(shape, generator=gen) if fill is None
              else torch.full(shape, fill)).to(case.dtype).to(DEVICE)
        if case.layout == "NHD":
            keys.append(kv[0])
            values.append(kv[1])
        else:
            keys.append(kv[..., :d].transpose(1, 2))
            values.append(kv[..., d:].transpose(1, 2))
    return keys, values


def make_slab(case: Case, gen: torch.Generator, fill: float | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """slab_keys, slab_values: [L, num_rows, H, D]."""
    shape = (case.num_layers, case.num_rows, case.num_heads, case.head_dim)
    if fill is not None:
        return (torch.full(shape, fill, dtype=case.dtype, device=DEVICE),
                torch.full(shape, fill, dtype=case.dtype, device=DEVICE))
    return (torch.randn(shape, generator=gen).to(case.dtype).to(DEVICE),
            torch.randn(shape, generator=gen).to(case.dtype).to(DEVICE))


def make_plan(case: Case, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """rows, slots, canonical, serving: [T] int64 for segments placed one after another.

    Segment i has canonical positions 0..n-1 and serving positions after a random gap; slots
    follow a shuffled block table, so segments cross block boundaries at random offsets.
    """
    num_tokens = sum(case.lengths)
    block_table = torch.randperm(case.num_blocks, generator=gen)
    canonical, serving, start = [], [], 0
    for i, n in enumerate(case.lengths):
        start += 0 if i == 0 else int(torch.randint(1, 80, (1,), generator=gen))
        canonical.append(torch.arange(n))
        serving.append(torch.arange(start, start + n))
        start += n
    assert start <= min(case.num_blocks * case.block_size, NUM_POSITIONS)
    serving_positions = torch.cat(serving)
    slots = (block_table[serving_positions // case.block_size] * case.block_size
             + serving_positions % case.block_size)
    rows = torch.randperm(case.num_rows, generator=gen)[:num_tokens]
    return tuple(t.to(DEVICE) for t in (rows, slots, torch.cat(canonical), serving_positions))


def tables(case: Case) -> RopeTables:
    spec = RopeSpec(RopeStyle(case.style), case.head_dim, case.rotary_dim, **ROPES[case.rope_type])
    return spec.tables(NUM_POSITIONS, device=DEVICE)


def assert_matches(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit-equal, except 1 ulp (of the reference value) for 16-bit dtypes in the interpreter."""
    if got.dtype == torch.float32 or not INTERPRETED:
        assert torch.equal(got, want), (got.float() - want.float()).abs().max()
        return
    magnitude = want.abs()
    ulp = (torch.nextafter(magnitude, torch.full_like(magnitude, float("inf"))).float()
           - magnitude.float())
    excess = (got.float() - want.float()).abs() - ulp
    assert excess.max() <= 0, f"{int((excess > 0).sum())} elements off by more than 1 ulp"


def check_inject(case: Case, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    keys, values = make_cache(case, gen, fill=SENTINEL)
    ref_keys, ref_values = [k.clone() for k in keys], [v.clone() for v in values]
    slab_keys, slab_values = make_slab(case, gen, fill=None)
    rows, slots, canonical, serving = make_plan(case, gen)
    rope = tables(case)
    cache = chunked_rope.PagedKVPointers(keys, values)
    chunked_rope.inject_(cache, slab_keys, slab_values, rows, slots, canonical, serving, rope)
    reference.inject_(ref_keys, ref_values, slab_keys, slab_values, rows, slots, canonical,
                      serving, rope)
    written = torch.zeros(case.num_blocks * case.block_size, dtype=torch.bool, device=DEVICE)
    written[slots] = True
    written = written.view(case.num_blocks, case.block_size)
    for got, want in zip(keys + values, ref_keys + ref_values, strict=True):
        assert_matches(got, want)
        assert bool((got[~written] == SENTINEL).all()), "a slot outside dst_slots was written"
    same = canonical == serving
    assert same.any() and not same.all()
    blocks, offsets = slots[same] // case.block_size, slots[same] % case.block_size
    for layer, k_cache in enumerate(keys):  # from == to: the stored bits, unrotated
        assert torch.equal(k_cache[blocks, offsets], slab_keys[layer, rows[same]])


def check_capture(case: Case, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    keys, values = make_cache(case, gen, fill=None)
    slab_keys, slab_values = make_slab(case, gen, fill=SENTINEL)
    ref_slab_keys, ref_slab_values = slab_keys.clone(), slab_values.clone()
    rows, slots, canonical, serving = make_plan(case, gen)
    rope = tables(case)
    cache = chunked_rope.PagedKVPointers(keys, values)
    chunked_rope.capture_(cache, slab_keys, slab_values, slots, rows, serving, canonical, rope)
    reference.capture_(keys, values, ref_slab_keys, ref_slab_values, slots, rows, serving,
                       canonical, rope)
    assert_matches(slab_keys, ref_slab_keys)
    assert_matches(slab_values, ref_slab_values)
    untouched = torch.ones(case.num_rows, dtype=torch.bool, device=DEVICE)
    untouched[rows] = False
    for slab in (slab_keys, slab_values):
        assert bool((slab[:, untouched] == SENTINEL).all()), "a row outside dst_rows was written"


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("style", [ROTATE_HALF, INTERLEAVED])
def test_inject_matches_reference(style: str, dtype: torch.dtype, layout: str) -> None:
    check_inject(Case(style=style, rope_type="llama3", dtype=dtype, layout=layout))


@pytest.mark.parametrize("rope_type", list(ROPES))
@pytest.mark.parametrize("style", [ROTATE_HALF, INTERLEAVED])
def test_inject_matches_reference_for_every_rope_type(style: str, rope_type: str) -> None:
    check_inject(Case(style=style, rope_type=rope_type, dtype=torch.bfloat16), seed=2)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("style", [ROTATE_HALF, INTERLEAVED])
def test_capture_matches_reference(style: str, dtype: torch.dtype, layout: str) -> None:
    check_capture(Case(style=style, rope_type="yarn", dtype=dtype, layout=layout))


GEOMETRIES: dict[str, dict[str, Any]] = {
    "partial_64_of_128": dict(head_dim=128, rotary_dim=64, num_heads=4),
    "partial_32_of_64": dict(head_dim=64, rotary_dim=32, num_heads=2, block_size=32),
    "d80_3_heads": dict(head_dim=80, rotary_dim=80, num_heads=3),
    "d96_partial_48_bs64": dict(head_dim=96, rotary_dim=48, num_heads=2, block_size=64,
                                num_blocks=12),
    "d32_one_head_bs128": dict(head_dim=32, rotary_dim=32, num_heads=1, block_size=128,
                               num_blocks=6),
}


@pytest.mark.parametrize("direction", ["inject", "capture"])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize("style", [ROTATE_HALF, INTERLEAVED])
def test_geometries(style: str, geometry: str, direction: str) -> None:
    case = Case(style=style, rope_type="yarn", dtype=torch.bfloat16, layout="HND",
                lengths=(5, 1, 12, 9), **GEOMETRIES[geometry])
    (check_inject if direction == "inject" else check_capture)(case, seed=1)


def test_one_launch_covers_all_tokens_layers_and_heads(monkeypatch: pytest.MonkeyPatch) -> None:
    grids = []
    kernel = chunked_rope._move_kernel

    class Counting:
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]

    monkeypatch.setattr(chunked_rope, "_move_kernel", Counting())
    check_inject(Case(num_heads=3))
    assert len(grids) == 1
    num_token_blocks, num_layers, num_head_blocks = grids[0]
    assert num_layers == 3 and num_head_blocks == 1 and num_token_blocks >= 1


def test_empty_call_writes_nothing() -> None:
    case = Case()
    gen = torch.Generator().manual_seed(0)
    keys, values = make_cache(case, gen, fill=SENTINEL)
    slab_keys, slab_values = make_slab(case, gen, fill=None)
    empty = torch.empty(0, dtype=torch.int64, device=DEVICE)
    chunked_rope.inject_(chunked_rope.PagedKVPointers(keys, values), slab_keys, slab_values,
                         empty, empty, empty, empty, tables(case))
    assert all(bool((t == SENTINEL).all()) for t in keys + values)


def test_out_of_range_tokens_are_skipped_not_written_out_of_bounds() -> None:
    case = Case(lengths=(6,))
    gen = torch.Generator().manual_seed(0)
    keys, values = make_cache(case, gen, fill=SENTINEL)
    slab_keys, slab_values = make_slab(case, gen, fill=None)
    rows, slots, canonical, serving = make_plan(case, gen)
    serving = serving + 3  # rotate every token, so each written value differs from the slab
    slots[1] = case.num_blocks * case.block_size  # one past the last slot
    rows[2] = -1
    serving[3] = NUM_POSITIONS
    chunked_rope.inject_(chunked_rope.PagedKVPointers(keys, values), slab_keys, slab_values,
                         rows, slots, canonical, serving, tables(case))
    written = [bool((keys[0][s // case.block_size, s % case.block_size] != SENTINEL).all())
               for s in slots.clamp(max=case.num_blocks * case.block_size - 1).tolist()]
    assert written == [True, False, False, False, True, True]


def _bad_call(**overrides):
    """Arguments of a valid inject_ call on bf16 caches, with some replaced."""
    case = Case(dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    keys, values = make_cache(case, gen, fill=0.0)
    slab_keys, slab_values = make_slab(case, gen, fill=0.0)
    rows, slots, canonical, serving = make_plan(case, gen)
    rope = tables(case)
    args = dict(slab_keys=slab_keys, slab_values=slab_values, src_rows=rows, dst_slots=slots,
                from_positions=canonical, to_positions=serving, cos=rope.cos, sin=rope.sin,
                style=ROTATE_HALF)
    args.update({k: v(args) if callable(v) else v for k, v in overrides.items()})
    rope = RopeTables(args.pop("cos"), args.pop("sin"), args.pop("style"))
    return chunked_rope.PagedKVPointers(keys, values), {**args, "rope": rope}


@pytest.mark.parametrize("overrides, message", [
    (dict(slab_keys=lambda a: a["slab_keys"].half(), slab_values=lambda a: a["slab_values"].half()),
     "differs from the cache"),
    (dict(slab_keys=lambda a: a["slab_keys"].to(torch.float8_e4m3fn)), "fp8"),
    (dict(slab_keys=lambda a: a["slab_keys"][:, :, :1]), r"\[L, num_rows, H, D\]"),
    (dict(slab_values=lambda a: a["slab_values"][:2]), r"\[L, num_rows, H, D\]"),
    (dict(slab_values=lambda a: a["slab_values"][:, :10]), "must match slab_keys"),
    (dict(dst_slots=lambda a: a["dst_slots"][:-1]), "one entry per token"),
    (dict(src_rows=lambda a: a["src_rows"].float()), "int64 or int32"),
    (dict(to_positions=lambda a: a["to_positions"][::2]), "int64 or int32"),
    (dict(cos=lambda a: a["cos"].double()), "fp32 table"),
    (dict(sin=lambda a: a["sin"][:, :4]), "one shape"),
    (dict(cos=lambda a: torch.cat([a["cos"]] * 3, 1), sin=lambda a: torch.cat([a["sin"]] * 3, 1)),
     "rotary_dim"),
    (dict(style="neox"), "unknown rope style"),
])
def test_bad_arguments_are_refused(overrides: dict, message: str) -> None:
    cache, args = _bad_call(**overrides)
    with pytest.raises(ValueError, match=message):
        chunked_rope.inject_(cache, **args)


def _views(dtype: torch.dtype = torch.bfloat16, layers: int = 2) -> list[torch.Tensor]:
    return [torch.zeros(4, 16, 2, 64, dtype=dtype, device=DEVICE) for _ in range(layers)]


@pytest.mark.parametrize("keys, values, message", [
    (lambda: _views(torch.float8_e4m3fn), lambda: _views(torch.float8_e4m3fn), "fp8"),
    (lambda: _views(torch.float64), lambda: _views(torch.float64), "not supported"),
    (lambda: _views(), lambda: _views(layers=1), "one key view and one value view"),
    (lambda: [], lambda: [], "one key view and one value view"),
    (lambda: _views(), lambda: [v[:, :8] for v in _views()], "must share shape"),
    (lambda: _views(), lambda: [_views()[0], _views(torch.float16)[0]], "must share shape"),
    (lambda: [v.transpose(2, 3) for v in _views()], lambda: [v.transpose(2, 3) for v in _views()],
     "head_dim contiguous"),
])
def test_bad_cache_views_are_refused(keys, values, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        chunked_rope.PagedKVPointers(keys(), values())


def test_layer_offsets_address_every_view() -> None:
    keys, values = make_cache(Case(layout="HND"), torch.Generator().manual_seed(0), fill=0.0)
    cache = chunked_rope.PagedKVPointers(keys, values)
    base = cache.base.data_ptr()
    size = cache.base.element_size()
    for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
        k_offset, v_offset = cache.layer_offsets[layer].tolist()
        assert (base + k_offset * size, base + v_offset * size) == (k.data_ptr(), v.data_ptr())
    assert min(cache.layer_offsets.flatten().tolist()) == 0



@pytest.mark.skipif(INTERPRETED, reason="compilation only happens on a GPU")
def test_steps_of_any_size_and_offset_reuse_one_compiled_kernel() -> None:
    """Token counts and index buffers change every step: none of them may trigger a recompile
    (a Triton compile on the serving path costs ~0.3 s of TTFT)."""
    import time

    case = Case(dtype=torch.bfloat16, lengths=(40, 41, 7))
    gen = torch.Generator().manual_seed(0)
    keys, values = make_cache(case, gen, fill=None)
    slab_keys, slab_values = make_slab(case, gen, fill=None)
    rows, slots, canonical, serving = make_plan(case, gen)
    rope = tables(case)
    cache = chunked_rope.PagedKVPointers(keys, values)

    def step(start: int, count: int) -> float:
        # slices at odd element offsets: the index pointers are not 16-byte aligned
        args = [t[start:start + count] for t in (rows, slots, canonical, serving)]
        torch.cuda.synchronize()
        begin = time.perf_counter()
        chunked_rope.inject_(cache, slab_keys, slab_values, *args, rope)
        torch.cuda.synchronize()
        return time.perf_counter() - begin

    first = step(0, 16)  # the one compilation
    later = [step(start, count) for start, count in
             ((0, 1), (1, 16), (3, 17), (2, 32), (5, 64), (0, 88), (7, 33))]
    print(f"[gpu] first launch {first * 1e3:.2f} ms, later ones: max {max(later) * 1e3:.2f} ms")
    # Relative to the first launch on the same GPU, not a time limit: a later launch that
    # compiled again (a new specialization for an unaligned slice) would take about as long.
    assert max(later) < first / 10, (first, later)


@pytest.mark.parametrize("direction", ["inject", "capture"])
def test_per_layer_tables_rotate_each_layer_with_its_own(direction: str) -> None:
    """[G, P, R/2] tables + layer_tables (Gemma 3: local and global bases): each layer moves
    exactly as a single-table call with its own table would move it."""
    case = Case(num_layers=3, lengths=(5, 9, 12))
    gen = torch.Generator().manual_seed(3)
    local = RopeSpec(RopeStyle.ROTATE_HALF, 64, 64, "default", 10000.0)
    global_ = RopeSpec(RopeStyle.ROTATE_HALF, 64, 64, "linear", 1e6, (("factor", 8.0),))
    (cos0, sin0), (cos1, sin1) = (s.cos_sin(NUM_POSITIONS, DEVICE) for s in (local, global_))
    cos, sin = torch.stack([cos0, cos1]), torch.stack([sin0, sin1])
    layer_tables = torch.tensor([1, 0, 1], dtype=torch.int64, device=DEVICE)
    rope = RopeTables(cos, sin, case.style, layer_tables)
    rows, slots, canonical, serving = make_plan(case, gen)
    keys, values = make_cache(case, gen, fill=None if direction == "capture" else SENTINEL)
    slab_keys, slab_values = make_slab(case, gen, fill=SENTINEL if direction == "capture"
                                       else None)
    want_keys = [k.clone() for k in keys]
    want_slab = slab_keys.clone()
    cache = chunked_rope.PagedKVPointers(keys, values)
    if direction == "inject":
        chunked_rope.inject_(cache, slab_keys, slab_values, rows, slots, canonical, serving,
                             rope)
    else:
        chunked_rope.capture_(cache, slab_keys, slab_values, slots, rows, serving, canonical,
                              rope)
    for layer, table in enumerate(layer_tables.tolist()):
        one = RopeTables([cos0, cos1][table], [sin0, sin1][table], case.style)
        if direction == "inject":
            reference.inject_(want_keys[layer:layer + 1], [values[layer].clone()],
                              slab_keys[layer:layer + 1], slab_values[layer:layer + 1], rows,
                              slots, canonical, serving, one)
            assert_matches(keys[layer], want_keys[layer])
        else:
            reference.capture_(keys[layer:layer + 1], values[layer:layer + 1],
                               want_slab[layer:layer + 1], slab_values[layer:layer + 1].clone(),
                               slots, rows, serving, canonical, one)
            assert_matches(slab_keys[layer], want_slab[layer])
    moved = canonical != serving
    assert moved.any()
    assert not torch.equal(cos0, cos1)
    with pytest.raises(ValueError, match="layer_tables"):
        chunked_rope.inject_(cache, slab_keys, slab_values, rows, slots, canonical, serving,
                             RopeTables(cos, sin, case.style))
