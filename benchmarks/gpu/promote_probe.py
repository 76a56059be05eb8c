"""Host-tier promotion on the GPU: time per call and rate against the host link's own rate.

A KVSlab and a pinned HostTier of Llama-3.1-8B's shape (32 layers, 8 KV heads of 128, bf16,
16-token pages); host entries of 30 tokens (2 consecutive pages each) scattered over the tier;
each call promotes `--entries` random entries (k=50: ~100 MiB) into fresh slab pages, as the
tier benchmark's requests do. Checks that the promoted rows equal the host copy bit for bit,
and that a demotion and a promotion give the slab back the same bytes. With --reference FILE
(another version's connector/worker_tiers.py, formerly tiers.py), the same calls alternate
between both implementations and the slab contents they write are compared.

  python benchmarks/gpu/promote_probe.py --calls 40 [--reference .device/old/old_tiers.py]

Writes one JSON record (benchmarks/out by default). Asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import environment, write_tagged  # noqa: E402
from benchmarks.tiers import link_rates  # noqa: E402

LAYERS, HEADS, DIM, PAGE = 32, 8, 128, 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--entries", type=int, default=50, help="entries per promotion")
    parser.add_argument("--slab-pages", type=int, default=640)
    parser.add_argument("--host-pages", type=int, default=4096)
    parser.add_argument("--reference", default="", help="another tiers.py to time beside")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of the checks")
    parser.add_argument("--tag", default="")
    return parser.parse_args(argv)


def load_module(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("reference_tiers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    from inferscale_engine.connector import worker_tiers as tiers
    from inferscale_engine.connector.slab import KVSlab
    from inferscale_engine.protocol.tier_control import Move

    args = parse_args(argv)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    slab = KVSlab(LAYERS, args.slab_pages, PAGE, HEADS, DIM, torch.bfloat16, device)
    slab.keys.normal_()
    slab.values.normal_()
    impls = {"current": tiers}
    if args.reference:
        impls["reference"] = load_module(args.reference)
    host = tiers.HostTier(slab, args.host_pages)
    for lo in range(0, args.host_pages, 256):  # random host pages, made on the GPU
        chunk = host.pages[lo:lo + 256]
        chunk.copy_(torch.randn(chunk.shape, dtype=torch.float32, device=device)
                    .to(chunk.dtype))
    num_entries = args.host_pages // 2 - args.entries  # the rest: room for the demotion
    rng = random.Random(0)
    next_key = iter(range(1, 10**9))

    def register(tier: Any) -> None:
        tier.entries.clear()
        for e in range(num_entries):
            tier.entries[10**6 + e] = tiers.HostEntry("u", [2 * e, 2 * e + 1], 30, 0)

    def moves_for(picks: list[int]) -> list[Any]:
        pages = rng.sample(range(args.slab_pages), 2 * len(picks))
        return [Move(10**6 + e, next(next_key), (pages[2 * i], pages[2 * i + 1]))
                for i, e in enumerate(picks)]

    times: dict[str, list[float]] = {name: [] for name in impls}
    mismatches = 0
    for call in range(args.calls + 3):
        picks = rng.sample(range(num_entries), args.entries)
        written = {}
        for name, module in (list(impls.items()) if call % 2 else list(impls.items())[::-1]):
            tier = _share(module, host)
            register(tier)
            moves = moves_for(picks)
            sync()
            start = time.perf_counter()
            done = tier.promote(slab, moves)
            sync()
            if call >= 3:
                times[name].append(time.perf_counter() - start)
            assert all(done), f"{name}: a promotion was refused"
            written[name] = torch.cat([slab.keys[:, slab.rows_for(list(m.pages), 30)]
                                       for m in moves], dim=1)
            expect = torch.cat([host.pages[2 * e:2 * e + 2, 0].transpose(0, 1).flatten(1, 2)
                                [:, :30] for e in picks], dim=1).to(device)
            mismatches += int(not torch.equal(written[name], expect))
        if len(written) == 2:
            mismatches += int(not torch.equal(*written.values()))
    # demote then promote with the current implementation: the slab gets the same bytes back
    tier = _share(tiers, host)
    register(tier)
    moves = moves_for(rng.sample(range(num_entries), args.entries))
    tier.promote(slab, moves)
    before = torch.cat([slab.keys[:, slab.entries[m.dest_key].rows] for m in moves], dim=1)
    free = sorted(set(range(args.host_pages)) - {p for e in tier.entries.values()
                                                 for p in e.pages})
    back = [Move(m.dest_key, next(next_key), tuple(free[2 * i:2 * i + 2]))
            for i, m in enumerate(moves)]
    assert all(tier.demote(slab, back)), "a demotion was refused"
    again = moves_for(list(range(len(moves))))
    again = [Move(b.dest_key, a.dest_key, a.pages) for a, b in zip(again, back, strict=True)]
    assert all(tier.promote(slab, again)), "a promotion after demotion was refused"
    after = torch.cat([slab.keys[:, slab.entries[m.dest_key].rows] for m in again], dim=1)
    round_trip_equal = bool(torch.equal(before, after))

    moved = args.entries * 2 * host.page_bytes
    summary = {name: {"median_ms": statistics.median(t) * 1e3, "min_ms": min(t) * 1e3,
                      "gb_per_s": moved / statistics.median(t) / 1e9}
               for name, t in times.items()}
    record = {"benchmark": "promote_probe", "config": vars(args), "environment": environment(),
              "bytes_per_call": moved,
              "link": link_rates() if device.type == "cuda" else {}, "results": summary,
              "mismatches": mismatches, "round_trip_equal": round_trip_equal}
    path = write_tagged("promote-probe", args.tag, record)
    for name, row in summary.items():
        print(f"[{name}] {moved / 2**20:.0f} MiB per call: median {row['median_ms']:.2f} ms "
              f"(min {row['min_ms']:.2f}), {row['gb_per_s']:.1f} GB/s")
    print(f"link {record['link']}; mismatches {mismatches}; round trip equal "
          f"{round_trip_equal}; wrote {path}")
    return record


def _share(module: Any, host: Any) -> Any:
    """A HostTier of `module` over `host`'s pinned pages (no second 8 GiB allocation)."""
    tier = module.HostTier.__new__(module.HostTier)
    tier.page_tokens, tier.num_pages, tier.pages = host.page_tokens, host.num_pages, host.pages
    tier.entries = {}
    tier.page_keys = host.page_keys
    tier.page_keys[:] = 0
    tier._stream = host._stream
    return tier


if __name__ == "__main__":
    main()
