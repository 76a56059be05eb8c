"""Throughput under load: N concurrent requests, each with its own k-fact set, text vs kv.

For N in --concurrency, one batch of N requests (distinct fact sets and questions, short
answers) is submitted at once to the same engine; repeated --repeats times with fresh fact
sets after one warm-up batch per N, the modes interleaved in a shuffled order within each
repeat (on the same fact sets) so that drift lands on every mode alike. `resident` is the
ceiling: the same preamble + facts already in vLLM's prefix cache (warmed, untimed), asked
other questions of the same length (text's batch left its questions' blocks cached too); it
runs last in each repeat, because text requests after its warm-up would hit that cache too.
Reports requests/s (N / median batch wall time, with min/max), TTFT p50/p99 from vLLM's
per-request first-token latency, and paired ratios: kv over text and over resident within each
repeat (median, min-max), steadier than ratios of medians when a machine's speed drifts.

  python benchmarks/throughput.py --model tiny --concurrency 1,8,32,64 --k 50
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (  # noqa: E402
    block_size_of,
    environment,
    fact_set,
    open_async_engine,
    resolve_model,
    synthetic_texts,
    vllm_args,
    write_record,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--k", type=int, default=50)
    parser.add_argument("--async-engine", action="store_true",
                        help="serve through vLLM's AsyncLLM (EngineCore in its own process, "
                             "requests submitted concurrently, as `inferscale serve` does) "
                             "instead of the offline vllm.LLM")
    parser.add_argument("--modes", default="text,kv,resident",
                        help="text, kv, resident (the same facts already in the prefix cache)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--fact-tokens", type=int, default=30)
    parser.add_argument("--question-tokens", type=int, default=48)
    parser.add_argument("--pool", type=int, default=1000)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--slab-mib", type=int, default=8192)
    parser.add_argument("--kv-cache-gib", type=float, default=None)
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="vLLM tensor parallelism (results are tagged by --tag)")
    parser.add_argument("--multiprocessing", action="store_true")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--vllm-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="a vLLM engine argument for every mode alike, e.g. "
                             "async_scheduling=true (repeatable)")
    parser.add_argument("--profile-client", action="store_true",
                        help="cProfile this (the client's) process during the timed batches of "
                             "the largest N, per mode; the top entries go to the record")
    parser.add_argument("--align-blocks", action="store_true",
                        help="draw each request's facts so that preamble + facts end on a vLLM "
                             "block boundary: resident's prefix cache then holds exactly the "
                             "tokens kv injects (otherwise it also holds the chat template's "
                             "tokens after the facts up to the next boundary, so resident "
                             "computes up to block_size - 1 fewer tokens per request than kv)")
    parser.add_argument("--tag", default="")
    return parser.parse_args(argv)


def paired_ratios(results: dict[str, dict[int, dict]], levels: list[int]
                  ) -> dict[int, dict[str, list[float]]]:
    """Per N, kv's throughput over text's and over resident's in each repeat.

    The modes of one repeat run back to back on the same fact sets, so a repeat's ratio is
    free of the drift between repeats (and machine starts) that moves every mode's req/s
    alike; its median is the steadier comparison.
    """
    out: dict[int, dict[str, list[float]]] = {}
    for n in levels:
        out[n] = {}
        for other in ("text", "resident"):
            if "kv" in results and other in results:
                kv, them = results["kv"][n]["raw_walls_s"], results[other][n]["raw_walls_s"]
                out[n][f"kv_over_{other}"] = [t / k for k, t in zip(kv, them, strict=True)]
    return out


def asked_from(batch: list[tuple[Any, str]], questions: list[str], first: int
               ) -> list[tuple[Any, str]]:
    """The batch's fact sets asked questions[first], questions[first + 1], ... (cycling)."""
    return [(h, questions[(first + i) % len(questions)]) for i, (h, _) in enumerate(batch)]


def batch_shape(batches: list[list[list[float]]]) -> dict[str, float | None]:
    """How timed batches entered vLLM's engine core (medians over batches, ms from submit).

    last_queued: when the batch's last request reached the engine core's queue; first_steps:
    how many engine steps first scheduled the batch's requests (one timestamp per schedule
    call); last_scheduled: when the last request was first scheduled; last_first_token and
    last_token: when the engine core produced the batch's last first token and its very last
    token (the batch's wall minus that is the client's lag: output processing, collection).
    """
    full = [b for b in batches if b]
    names = ("last_queued", "last_scheduled", "last_first_token", "last_token")
    shape: dict[str, float | None] = {
        "first_steps_median": statistics.median(len({r[1] for r in b}) for b in full)
        if full else None}
    for i, name in enumerate(names):
        shape[f"{name}_ms_median"] = (statistics.median(max(r[i] for r in b) for b in full)
                                      if full else None)
    return shape


def profile_top(profiler: cProfile.Profile, limit: int = 25) -> dict[str, list[str]]:
    """The profile's top entries by own time and by cumulative time (pstats lines)."""
    out = {}
    for key in ("tottime", "cumulative"):
        buffer = io.StringIO()
        pstats.Stats(profiler, stream=buffer).sort_stats(key).print_stats(limit)
        out[key] = [line for line in buffer.getvalue().splitlines() if line.strip()]
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main(argv: list[str] | None = None) -> dict:
    from vllm import SamplingParams

    from inferscale_engine import Engine, EngineConfig
    from inferscale_engine.prompting.layout import Layout

    args = parse_args(argv)
    model, dtype, load_format = resolve_model(args.model)
    config = EngineConfig(
        model=model, dtype=dtype, load_format=load_format, max_model_len=args.max_model_len,
        slab_capacity_bytes=args.slab_mib * 2**20, context_window_tokens=0, max_fact_tokens=128,
        kv_cache_memory_bytes=int(args.kv_cache_gib * 2**30) if args.kv_cache_gib else None,
        multiprocessing=args.multiprocessing, enforce_eager=True if args.enforce_eager else None,
        tensor_parallel_size=args.tensor_parallel_size,
        vllm_overrides={"disable_log_stats": False, **vllm_args(args.vllm_arg)})
    close = None
    if args.async_engine:  # every mode through vLLM's AsyncLLM, as `inferscale serve` runs
        engine, close = open_async_engine(config)
    else:
        engine = Engine(config)
    facts = synthetic_texts(engine.tokenizer, args.pool, args.fact_tokens, seed=1)
    start = time.perf_counter()
    fact_ids = engine.add_facts("bench", facts)
    ingest_s = time.perf_counter() - start
    levels = [int(n) for n in args.concurrency.split(",")]
    questions = synthetic_texts(engine.tokenizer, max(levels) * 2, args.question_tokens, seed=2,
                                fmt="{text}")
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    warm = SamplingParams(max_tokens=1, temperature=0.0)
    rng = random.Random(0)
    align = block_size_of(engine) if args.align_blocks else None
    modes = args.modes.split(",")
    results: dict[str, dict[int, dict]] = {m: {} for m in modes}
    for n in levels:
        walls: dict[str, list[float]] = {m: [] for m in modes}
        ttfts: dict[str, list[float]] = {m: [] for m in modes}
        cached: dict[str, list[int]] = {m: [] for m in modes}
        """Prompt tokens vLLM did not compute (prefix cache or injected), per request."""
        client_cpu: dict[str, list[float]] = {m: [] for m in modes}
        """CPU seconds this process (prompts, plans, vLLM's client, output processing) spent
        per timed batch; with MP=1 the engine core's own work is not in it."""
        profilers = ({m: cProfile.Profile() for m in modes}
                     if args.profile_client and n == max(levels) else {})
        engine_ms: dict[str, list[list[list[float]]]] = {m: [] for m in modes}
        """Per timed batch, per request: queued, first scheduled, first and last token (ms
        from submission, engine core's clock)."""
        # Modes interleaved within each repeat, on the same fact sets, so that clock and
        # cache drift between repeats lands on every mode alike; repeat 0 is a warm-up.
        for rep in range(args.repeats + 1):
            asks = [questions[(rep * n + i) % len(questions)] for i in range(n)]
            batch = [(fact_set(engine, rng, fact_ids, args.k, q, align), q) for q in asks]
            # resident last: its warm-up fills vLLM's prefix cache with these fact sets as
            # unsalted text, and a text batch after it would be served from there (what made
            # text's req/s swing 5x between repeats, 2026-12-02).
            order = rng.sample([m for m in modes if m != "resident"], len(modes) - (
                "resident" in modes)) + (["resident"] if "resident" in modes else [])
            for mode in order:
                asked = batch
                if mode == "resident":  # the same preamble + facts already in the prefix cache
                    engine.generate_many(asked_from(batch, questions, rep * n + 1), warm,
                                         mode="text", layout=Layout())
                    # timed with questions no request asked after these facts: text's batch
                    # (same facts, same questions) left whole prompts in the prefix cache, and
                    # a ceiling finding its questions' blocks there computes fewer tokens than kv
                    asked = asked_from(batch, questions, rep * n + 2)
                profiler = profilers.get(mode) if rep else None
                if profiler is not None:
                    profiler.enable()
                t0, mono0, cpu0 = time.perf_counter(), time.monotonic(), time.process_time()
                outs = engine.generate_many(asked, sampling, layout=Layout(),
                                            mode="text" if mode == "resident" else mode)
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                if profiler is not None:
                    profiler.disable()
                if rep == 0:
                    continue
                walls[mode].append(wall)
                client_cpu[mode].append(cpu)
                ttfts[mode] += [o.ttft_ms for o in outs if o.ttft_ms is not None]
                cached[mode] += [o.num_cached_tokens or 0 for o in outs]
                engine_ms[mode].append([[round((t - mono0) * 1e3, 3) for t in o.engine_times]
                                        for o in outs if o.engine_times])
        for mode in modes:
            results[mode][n] = {
                "requests_per_s": n / statistics.median(walls[mode]),
                "requests_per_s_min_max": [n / max(walls[mode]), n / min(walls[mode])],
                "batch_wall_s": statistics.median(walls[mode]),
                "ttft_p50_ms": percentile(ttfts[mode], 0.5) if ttfts[mode] else None,
                "ttft_p99_ms": percentile(ttfts[mode], 0.99) if ttfts[mode] else None,
                "raw_walls_s": walls[mode], "raw_ttft_ms": ttfts[mode],
                "cached_tokens_median": statistics.median(cached[mode]) if cached[mode] else None,
                "raw_engine_ms": engine_ms[mode], **batch_shape(engine_ms[mode]),
                "raw_client_cpu_s": client_cpu[mode],
                "client_cpu_ms_median": statistics.median(client_cpu[mode]) * 1e3,
            }
            if mode in profilers:
                results[mode][n]["client_profile"] = profile_top(profilers[mode])
            r = results[mode][n]
            low, high = r["requests_per_s_min_max"]
            print(f"{mode:8s} N={n:3d}: {r['requests_per_s']:8.2f} req/s (min {low:.2f}, max "
                  f"{high:.2f})  TTFT p50 "
                  f"{r['ttft_p50_ms'] or float('nan'):8.2f} ms  p99 "
                  f"{r['ttft_p99_ms'] or float('nan'):8.2f} ms  cached "
                  f"{r['cached_tokens_median'] or 0:.0f} tok  client CPU "
                  f"{r['client_cpu_ms_median']:.0f} ms/batch", flush=True)
            if r["first_steps_median"] is not None:
                print(f"{'':8s}        engine: all queued by {r['last_queued_ms_median']:.1f} ms, "
                      f"first scheduled over {r['first_steps_median']:.0f} steps, the last "
                      f"at {r['last_scheduled_ms_median']:.1f} ms; last first token at "
                      f"{r['last_first_token_ms_median']:.1f}, last token at "
                      f"{r['last_token_ms_median']:.1f}, batch returned at "
                      f"{r['batch_wall_s'] * 1e3:.1f} ms (medians over batches)", flush=True)
    stats = engine.stats()
    if close is not None:
        close()
    else:
        engine.close()
    paired = paired_ratios(results, levels)
    print("\n| N | " + " | ".join(f"{m} req/s" for m in modes)
          + " | kv/text | kv/resident | paired kv/text | paired kv/resident |")
    print("|---" * (len(modes) + 5) + "|")
    for n in levels:
        rate = {m: results[m][n]["requests_per_s"] for m in modes}
        ratio = (f"{rate['kv'] / rate['text']:.2f}" if {"kv", "text"} <= set(rate) else "-")
        ceil = (f"{rate['kv'] / rate['resident']:.2f}" if {"kv", "resident"} <= set(rate) else "-")
        pairs = " | ".join(
            "-" if (got := paired[n].get(f"kv_over_{m}")) is None
            else f"{statistics.median(got):.2f} ({min(got):.2f}-{max(got):.2f})"
            for m in ("text", "resident"))
        print(f"| {n} | " + " | ".join(f"{rate[m]:.2f}" for m in modes)
              + f" | {ratio} | {ceil} | {pairs} |")
    record = {"benchmark": "throughput", "config": {**vars(args), "aligned_to": align},
              "environment": environment(),
              "ingest_seconds": ingest_s, "results": results, "paired_ratios": paired,
              "engine_stats": stats.workers,
              "engine_counters": stats.counters}
    path = write_record(f"throughput-{args.model}{('-' + args.tag) if args.tag else ''}", record)
    print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
