"""Throughput under load: N concurrent requests, each with its own k-fact set, text vs kv.

For N in --concurrency, one batch of N requests (distinct fact sets and questions, short
answers) is submitted at once to the same engine; repeated --repeats times with fresh fact
sets, after one warm-up batch per (mode, N). Reports requests/s (N / batch wall time) and
TTFT p50/p99 from vLLM's per-request first-token latency.

  python benchmarks/throughput.py --model tiny --concurrency 1,8,32,64 --k 50
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import environment, resolve_model, synthetic_texts, write_record  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--k", type=int, default=50)
    parser.add_argument("--modes", default="text,kv")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--fact-tokens", type=int, default=30)
    parser.add_argument("--question-tokens", type=int, default=48)
    parser.add_argument("--pool", type=int, default=1000)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--slab-mib", type=int, default=8192)
    parser.add_argument("--kv-cache-gib", type=float, default=None)
    parser.add_argument("--multiprocessing", action="store_true")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--tag", default="")
    return parser.parse_args(argv)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main(argv: list[str] | None = None) -> dict:
    from vllm import SamplingParams

    from inferscale_engine import Engine, EngineConfig, MemoryHandle

    args = parse_args(argv)
    model, dtype, load_format = resolve_model(args.model)
    config = EngineConfig(
        model=model, dtype=dtype, load_format=load_format, max_model_len=args.max_model_len,
        slab_capacity_bytes=args.slab_mib * 2**20, context_window_tokens=0, max_fact_tokens=128,
        kv_cache_memory_bytes=int(args.kv_cache_gib * 2**30) if args.kv_cache_gib else None,
        multiprocessing=args.multiprocessing, enforce_eager=True if args.enforce_eager else None,
        vllm_overrides={"disable_log_stats": False})
    engine = Engine(config)
    facts = synthetic_texts(engine.tokenizer, args.pool, args.fact_tokens, seed=1)
    start = time.perf_counter()
    fact_ids = engine.add_facts("bench", facts)
    ingest_s = time.perf_counter() - start
    levels = [int(n) for n in args.concurrency.split(",")]
    questions = synthetic_texts(engine.tokenizer, max(levels) * 2, args.question_tokens, seed=2,
                                fmt="{text}")
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    rng = random.Random(0)
    results: dict[str, dict[int, dict]] = {}
    for mode in args.modes.split(","):
        results[mode] = {}
        for n in levels:
            walls, ttfts = [], []
            for rep in range(args.repeats + 1):
                batch = [(MemoryHandle("bench", tuple(rng.sample(fact_ids, args.k))),
                          questions[(rep * n + i) % len(questions)]) for i in range(n)]
                t0 = time.perf_counter()
                outs = engine.generate_many(batch, sampling, mode=mode)
                wall = time.perf_counter() - t0
                if rep == 0:
                    continue  # warm-up
                walls.append(wall)
                ttfts += [o.ttft_ms for o in outs if o.ttft_ms is not None]
                assert all(o.mode == mode for o in outs)
            results[mode][n] = {
                "requests_per_s": n / statistics.median(walls),
                "batch_wall_s": statistics.median(walls),
                "ttft_p50_ms": percentile(ttfts, 0.5) if ttfts else None,
                "ttft_p99_ms": percentile(ttfts, 0.99) if ttfts else None,
                "raw_walls_s": walls, "raw_ttft_ms": ttfts,
            }
            r = results[mode][n]
            print(f"{mode:4s} N={n:3d}: {r['requests_per_s']:8.2f} req/s  TTFT p50 "
                  f"{r['ttft_p50_ms'] or float('nan'):8.2f} ms  p99 "
                  f"{r['ttft_p99_ms'] or float('nan'):8.2f} ms", flush=True)
    stats = engine.stats()
    engine.close()
    print("\n| N | text req/s | kv req/s | kv/text | text TTFT p50/p99 ms | kv TTFT p50/p99 ms |")
    print("|---|---|---|---|---|---|")
    for n in levels:
        t, k = results.get("text", {}).get(n), results.get("kv", {}).get(n)
        if t and k:
            print(f"| {n} | {t['requests_per_s']:.2f} | {k['requests_per_s']:.2f} | "
                  f"{k['requests_per_s'] / t['requests_per_s']:.2f} | "
                  f"{t['ttft_p50_ms']:.1f}/{t['ttft_p99_ms']:.1f} | "
                  f"{k['ttft_p50_ms']:.1f}/{k['ttft_p99_ms']:.1f} |")
    record = {"benchmark": "throughput", "config": vars(args), "environment": environment(),
              "ingest_seconds": ingest_s, "results": results, "engine_stats": stats.workers,
              "engine_counters": stats.counters}
    path = write_record(f"throughput-{args.model}{('-' + args.tag) if args.tag else ''}", record)
    print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
