"""Can the injection copy hide behind a prefill's compute? A GPU probe with no vLLM.

A throughput batch's prefill step (Llama-3.1-8B geometry, N=64 x ~1,260 injected tokens and
~57 computed tokens per request) first injects ~80K tokens into the paged cache of 32 layers,
then runs the forward. This times, with CUDA events, a stand-in forward (per layer the four
GEMMs of a Llama-3.1-8B layer over --tokens tokens, then a read of that layer's injected K/V,
as attention would) after the injection on the same stream (serial), against the injection
split into G layer groups on a side stream, the forward waiting per layer for its group's
event (overlapped, as `wait_for_layer_load` would). Writes one JSON record.

  python benchmarks/gpu/overlap_probe.py --groups 1,2,4,8,32
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import environment, write_record  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inject-tokens", type=int, default=80_640, help="64 x 1,260")
    p.add_argument("--tokens", type=int, default=3_648, help="tokens the forward computes")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--groups", default="1,2,4,8,16,32")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--tag", default="")
    return p.parse_args()


def main() -> dict:
    args = parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("overlap_probe.py needs a CUDA GPU (streams and compiled Triton "
                         "kernels); none found")
    from inferscale_engine.kernels import chunked_rope
    from inferscale_engine.kernels.mover import BoundMover
    from inferscale_engine.kernels.rope_tables import RopeTables

    dev, dtype, layers = torch.device("cuda"), torch.bfloat16, args.layers
    bs, heads, dim = 16, 8, 128  # vLLM's block size, Llama-3.1-8B's KV heads and head size
    n = args.inject_tokens
    num_blocks = -(-n // bs) + 1024
    caches = [torch.zeros(2, num_blocks, bs, heads, dim, dtype=dtype, device=dev)
              for _ in range(layers)]
    keys, values = [c[0] for c in caches], [c[1] for c in caches]
    slab_k = torch.randn(layers, n + 1024, heads, dim, device=dev, dtype=dtype)
    slab_v = torch.randn_like(slab_k)
    gen = torch.Generator().manual_seed(0)
    slots = torch.randperm(num_blocks * bs, generator=gen)[:n]
    rows = torch.randperm(n + 1024, generator=gen)[:n]
    serving = torch.arange(n) % 1300
    index = torch.stack((rows, slots, serving % 30, serving)).long().to(dev)
    inv = 1.0 / 500000.0 ** (torch.arange(0, dim, 2).float() / dim)
    angles = torch.arange(4096).float()[:, None] * inv[None, :]
    cos, sin = angles.cos().to(dev), angles.sin().to(dev)

    def movers(groups: int) -> list[tuple[range, BoundMover]]:
        size = -(-layers // groups)
        out = []
        for g0 in range(0, layers, size):
            part = range(g0, min(layers, g0 + size))
            cache = chunked_rope.PagedKVPointers(keys[g0:part.stop], values[g0:part.stop])
            out.append((part, BoundMover(cache, slab_k[g0:part.stop], slab_v[g0:part.stop],
                                         RopeTables(cos, sin, "rotate_half"))))
        return out

    hidden, inter, t = 4096, 14336, args.tokens
    x = torch.randn(t, hidden, device=dev, dtype=dtype)
    weights = [torch.randn(hidden, 6144, device=dev, dtype=dtype) * 0.01,
               torch.randn(4096, hidden, device=dev, dtype=dtype) * 0.01,
               torch.randn(hidden, 2 * inter, device=dev, dtype=dtype) * 0.01,
               torch.randn(inter, hidden, device=dev, dtype=dtype) * 0.01]
    touch = slots[: 64 * 1260: 97].to(dev)

    def layer(i: int) -> None:
        qkv = x @ weights[0]
        o = qkv[:, :4096] @ weights[1]
        up = o @ weights[2]
        _ = up[:, :inter] @ weights[3]
        _ = keys[i].view(-1, heads, dim)[touch].float().sum()  # attention reads the cache

    side = torch.cuda.Stream()

    def run(groups: int | None, bound: list[tuple[range, BoundMover]]) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if groups is None:  # serial: one launch, then the forward
            bound[0][1].inject(index)
            for i in range(layers):
                layer(i)
        else:
            ready = torch.cuda.Event()
            ready.record()
            events = []
            with torch.cuda.stream(side):
                side.wait_event(ready)
                for part, mover in bound:
                    mover.inject(index)
                    done = torch.cuda.Event()
                    done.record(side)
                    events.append((part, done))
            current = torch.cuda.current_stream()
            waited = -1
            for i in range(layers):
                g = next(j for j, (part, _) in enumerate(events) if i in part)
                if g > waited:
                    current.wait_event(events[g][1])
                    waited = g
                layer(i)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    results: dict[str, dict] = {}
    one = movers(1)
    forward_only = []
    for _ in range(args.reps + 3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for i in range(layers):
            layer(i)
        e.record()
        e.synchronize()
        forward_only.append(s.elapsed_time(e))
    inject_only = []
    for _ in range(args.reps + 3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        one[0][1].inject(index)
        e.record()
        e.synchronize()
        inject_only.append(s.elapsed_time(e))
    results["forward_only_ms"] = statistics.median(forward_only[3:])
    results["inject_only_ms"] = statistics.median(inject_only[3:])
    configs = [("serial", None, one)] + [(f"overlap{g}", g, movers(g))
                                         for g in map(int, args.groups.split(","))]
    samples: dict[str, list[float]] = {name: [] for name, _, _ in configs}
    for rep in range(args.reps + 3):  # interleaved; 3 warm-ups
        for name, groups, bound in configs:
            ms = run(groups, bound)
            if rep >= 3:
                samples[name].append(ms)
    for name, values_ in samples.items():
        results[name] = {"median_ms": statistics.median(values_), "raw_ms": values_}
        print(f"{name:10s} {results[name]['median_ms']:8.3f} ms", flush=True)
    print(f"forward only {results['forward_only_ms']:.3f} ms, inject only "
          f"{results['inject_only_ms']:.3f} ms")
    record = {"benchmark": "overlap_probe", "config": vars(args), "environment": environment(),
              "results": results}
    print(f"wrote {write_record('overlap_probe' + (f'-{args.tag}' if args.tag else ''), record)}")
    return record


if __name__ == "__main__":
    main()
