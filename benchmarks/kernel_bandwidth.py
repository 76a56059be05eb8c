"""Effective bandwidth of the Chunked-RoPE kernels next to a plain device copy and the torch path.

Times (triton.testing.do_bench, median) chunked_rope.inject_ / capture_ for N tokens x L layers,
a torch copy_ of the same K+V bytes, and reference.inject_ / capture_. GB/s counts bytes read
plus bytes written. Writes one JSON record to benchmarks/out/. Asserts nothing about speed.

    python benchmarks/kernel_bandwidth.py                      # Llama-3.1-8B geometry, bf16
    python benchmarks/kernel_bandwidth.py --layout HND --style interleaved
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from inferscale_engine.kernels.rope_tables import RopeTables

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--num-tokens", type=int, default=1500)
    p.add_argument("--num-layers", type=int, default=32)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--rotary-dim", type=int, default=None, help="default: head_dim")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--layout", choices=["NHD", "HND"], default="NHD")
    p.add_argument("--style", choices=["rotate_half", "interleaved"], default="rotate_half")
    p.add_argument("--fact-tokens", type=int, default=50, help="tokens per segment (fact)")
    p.add_argument("--num-positions", type=int, default=131072, help="rows of the cos/sin tables")
    p.add_argument("--spare-blocks", type=int, default=2048, help="extra cache blocks")
    p.add_argument("--warmup-ms", type=int, default=25)
    p.add_argument("--rep-ms", type=int, default=200)
    p.add_argument("--output-dir", type=Path, default=Path(
        os.environ.get("INFERSCALE_RESULTS", Path(__file__).parent / "out")))
    return p.parse_args()


def make_cache(args: argparse.Namespace, num_blocks: int, dtype: torch.dtype
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-layer allocations as vLLM 0.26/0.32 lay them: logical [nb, H, bs, 2D] (K and V packed
    in the last dim), physically NHD [nb, bs, H, 2D] or HND [nb, H, bs, 2D]."""
    keys, values = [], []
    h, d, bs = args.num_kv_heads, args.head_dim, args.block_size
    for _ in range(args.num_layers):
        if args.layout == "NHD":
            kv = torch.zeros(num_blocks, bs, h, 2 * d, dtype=dtype, device="cuda").transpose(1, 2)
        else:
            kv = torch.zeros(num_blocks, h, bs, 2 * d, dtype=dtype, device="cuda")
        keys.append(kv[..., :d].transpose(1, 2))
        values.append(kv[..., d:].transpose(1, 2))
    return keys, values


def make_plan(args: argparse.Namespace, num_blocks: int) -> tuple[torch.Tensor, ...]:
    """rows, slots, canonical, serving: [T] int64 on the GPU.

    Facts of `fact_tokens` tokens from scattered slab rows, placed one after another at serving
    positions 0..T-1 of a request whose block table is a random set of blocks.
    """
    n = args.num_tokens
    gen = torch.Generator().manual_seed(0)
    serving = torch.arange(n)
    canonical = serving % args.fact_tokens
    block_table = torch.randperm(num_blocks, generator=gen)
    slots = block_table[serving // args.block_size] * args.block_size + serving % args.block_size
    rows = torch.randperm(2 * n, generator=gen)[:n]
    return tuple(t.cuda() for t in (rows, slots, canonical, serving))


def time_ms(fn: Callable[[], object], args: argparse.Namespace) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=args.warmup_ms, rep=args.rep_ms,
                                         return_mode="median"))


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available():
        print("kernel_bandwidth.py needs a CUDA GPU (the kernels are timed compiled, not in "
              "Triton's interpreter); none found.", file=sys.stderr)
        return 1
    import triton

    from inferscale_engine.kernels import chunked_rope, reference
    from inferscale_engine.kernels.mover import BoundMover
    from inferscale_engine.kernels.rope_tables import RopeTables

    dtype = DTYPES[args.dtype]
    rotary_dim = args.rotary_dim or args.head_dim
    num_blocks = -(-args.num_tokens // args.block_size) + args.spare_blocks
    keys, values = make_cache(args, num_blocks, dtype)
    cache = chunked_rope.PagedKVPointers(keys, values)
    slab_shape = (args.num_layers, 2 * args.num_tokens, args.num_kv_heads, args.head_dim)
    slab_keys = torch.randn(slab_shape, device="cuda").to(dtype)
    slab_values = torch.randn(slab_shape, device="cuda").to(dtype)
    rows, slots, canonical, serving = make_plan(args, num_blocks)
    inv_freq = 1.0 / 500000.0 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    angles = torch.arange(args.num_positions).float()[:, None] * inv_freq[None, :]
    cos, sin = angles.cos().cuda(), angles.sin().cuda()

    kv_bytes = 2 * args.num_layers * args.num_tokens * args.num_kv_heads * args.head_dim \
        * slab_keys.element_size()
    copy_src = torch.randn(kv_bytes // 4, device="cuda")
    copy_dst = torch.empty_like(copy_src)
    tables = RopeTables(cos, sin, args.style)
    # The engine's path: kernels bound once, each step one [4, T] index (rows, slots, from, to).
    mover = BoundMover(cache, slab_keys, slab_values, tables)
    to_cache = torch.stack((rows, slots, canonical, serving)).long()
    to_slab = torch.stack((rows, slots, serving, canonical)).long()
    host_index = to_cache.cpu().pin_memory()  # the worker's zero-copy staging: read in place
    fns: dict[str, Callable[[], object]] = {
        "device_copy": lambda: copy_dst.copy_(copy_src),
        "triton_inject": lambda: mover.inject(to_cache),
        "triton_inject_host_index": lambda: mover.inject(host_index),
        "triton_capture": lambda: mover.capture(to_slab),
        "torch_inject": lambda: reference.inject_(
            keys, values, slab_keys, slab_values, rows, slots, canonical, serving, tables),
        "torch_capture": lambda: reference.capture_(
            keys, values, slab_keys, slab_values, slots, rows, serving, canonical, tables),
    }
    results: dict[str, object] = {}
    for name, fn in fns.items():
        ms = time_ms(fn, args)
        gb_per_s = 2 * kv_bytes / ms / 1e6
        results[name] = {"median_ms": ms, "gb_per_s": gb_per_s}
        print(f"{name:15s} {ms:8.3f} ms  {gb_per_s:8.1f} GB/s")
    results["matches_reference"] = check_matches(keys, values, fns)
    results["launch_host_us"] = launch_host_us(cache, slab_keys, slab_values, tables,
                                               to_cache[:, :64].contiguous())
    results["step_host_us"] = step_host_us(mover, to_cache, host_index)

    record = {
        "benchmark": "kernel_bandwidth",
        "config": {**{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                   "rotary_dim": rotary_dim, "num_blocks": num_blocks,
                   "kv_bytes": kv_bytes, "bytes_counted": 2 * kv_bytes},
        "versions": {"torch": torch.__version__, "triton": triton.__version__,
                     "cuda": torch.version.cuda, "python": platform.python_version()},
        "hardware": {"gpu": torch.cuda.get_device_name(), "host": platform.node()},
        "results": results,
    }
    args.output_dir.mkdir(parents=True, exist_ok=True)
    path = args.output_dir / f"kernel_bandwidth-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


def launch_host_us(cache: object, slab_keys: torch.Tensor, slab_values: torch.Tensor,
                   tables: RopeTables, index: torch.Tensor, calls: int = 500) -> dict[str, float]:
    """Host microseconds one inject launch costs (a 64-token step, no synchronization inside
    the loop): the serving path's share of the kernel. `checked`: chunked_rope.inject_ (every
    argument checked, Triton's regular launch); `bound`: BoundMover through Triton's regular
    launch; `prebound`: BoundMover calling Triton's compiled launcher directly."""
    from inferscale_engine.kernels import chunked_rope
    from inferscale_engine.kernels.mover import BoundMover

    rows, slots, from_positions, to_positions = index
    regular = BoundMover(cache, slab_keys, slab_values, tables, prebind=False)
    prebound = BoundMover(cache, slab_keys, slab_values, tables)
    fns = {"checked": lambda: chunked_rope.inject_(cache, slab_keys, slab_values, rows, slots,
                                                   from_positions, to_positions, tables),
           "bound": lambda: regular.inject(index), "prebound": lambda: prebound.inject(index)}
    out = {}
    for name, fn in fns.items():
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        out[name] = (time.perf_counter() - start) / calls * 1e6
        torch.cuda.synchronize()
        print(f"launch host time {name:9s} {out[name]:7.1f} us")
    out["prebound_launches"] = prebound.fast_launches
    return out


def step_host_us(mover: object, index: torch.Tensor, host_index: torch.Tensor,
                 calls: int = 500) -> dict[str, float]:
    """Host microseconds of one step's index transfer + launch, as the worker's staging does
    it: `copy` (an asynchronous copy of the pinned index into a device buffer, then the launch)
    against `zero_copy` (the launch reads the pinned index in place). Synchronized every call
    (so the kernel never queues up), the synchronize not counted."""
    device_index = torch.empty_like(index)
    fns = {"copy": lambda: mover.inject(device_index.copy_(host_index, non_blocking=True)),
           "zero_copy": lambda: mover.inject(host_index)}
    out = {}
    for name, fn in fns.items():
        samples = []
        for i in range(calls + 5):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if i >= 5:
                samples.append((time.perf_counter() - start) * 1e6)
        torch.cuda.synchronize()
        out[name] = sorted(samples)[len(samples) // 2]
        print(f"step host time {name:9s} {out[name]:7.1f} us (median)")
    return out


def check_matches(keys: list[torch.Tensor], values: list[torch.Tensor],
                  fns: dict[str, Callable[[], object]]) -> bool:
    """Triton's inject_ and reference.inject_ write the same bits (recorded, not asserted)."""
    for t in keys + values:
        t.zero_()
    fns["triton_inject"]()
    got = [t.clone() for t in keys + values]
    for t in keys + values:
        t.zero_()
    fns["torch_inject"]()
    return all(torch.equal(a, b) for a, b in zip(got, keys + values, strict=True))


if __name__ == "__main__":
    sys.exit(main())
