"""Where kv mode's time above the resident ceiling goes: per-phase host time and a profile.

One engine (MP=0, so vLLM's scheduler, executor and our connector halves run in this process),
modes interleaved per fact set exactly as ttft.py runs them (or, with --batch N, per batch of N
fact sets in one vLLM batch: the prefill of a throughput.py batch). Pass 1 wraps vLLM's engine-core
phases and our connector hooks with wall-clock timers and reports, per mode, the mean host time
of each phase per request; pass 2 runs torch.profiler (CPU + CUDA activity) over a few requests
of each mode and prints the tops by self CPU and by self device time, and writes a trace of one
kv and one resident request (chrome://tracing) next to the JSON.

  python benchmarks/gpu/ceiling_probe.py --model llama-3.1-8b --k 50,100
  python benchmarks/gpu/ceiling_probe.py --model llama-3.1-8b --k 50 --batch 64 --profiled 0
"""

from __future__ import annotations

import argparse
import functools
import itertools
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import environment, synthetic_texts, write_record  # noqa: E402
from benchmarks.ttft import build_engine  # noqa: E402

PHASES = (
    "core.step", "core.step_with_batch_queue",
    "core.scheduler.schedule", "core.scheduler.update_from_output",
    "core.scheduler.kv_cache_manager.get_computed_blocks",
    "core.scheduler.kv_cache_manager.allocate_slots",
    "core.scheduler.kv_cache_manager.block_pool.cache_full_blocks",
    "core.scheduler.connector.get_num_new_matched_tokens",
    "core.scheduler.connector.update_state_after_alloc",
    "core.scheduler.connector.build_connector_meta",
    "core.scheduler.connector.request_finished", "core.scheduler.connector.update_connector_output",
    "core.scheduler._free_request", "core.scheduler._update_from_kv_xfer_finished",
    "core.scheduler.kv_cache_manager.free", "core.scheduler._make_cached_request_data",
    "core.scheduler._update_request_with_output",
    "core.model_executor.execute_model", "core.model_executor.sample_tokens",
    "worker_connector.start_load_kv", "worker_connector.wait_for_save",
    "worker_connector.get_finished", "engine._planner.prepare", "engine._runner.run",
    # inside the phases above (issue 13: where start_load_kv, the check and prepare spend it)
    "core.scheduler.connector.scheduler._verify",
    "core.scheduler.connector.scheduler.build_connector_meta",
    "worker_connector.worker._staging.host", "worker_connector.worker._write_index",
    "worker_connector.worker._load_indices",
    "worker_connector.worker._staging.index", "worker_connector.worker.paged.inject_",
    "engine._planner.resolve", "engine._planner.arrange", "engine._planner.build",
    "engine._planner.plan", "engine._planner.prepare_many",
    "engine._runner.llm.llm_engine.add_request", "core.preprocess_add_request",
)
"""Dotted paths of the methods timed (absent ones are skipped: vLLM versions differ)."""


TIMELINE = {"core.scheduler.schedule", "core.model_executor.execute_model",
            "core.model_executor.sample_tokens", "core.scheduler.update_from_output",
            "engine._planner.prepare_many", "engine._runner.llm.llm_engine.add_request",
            "core.preprocess_add_request", "worker_connector.start_load_kv"}
"""Phases (of PHASES: only those are wrapped) whose every call --timeline records (start,
duration) within its round."""


def _detail(result: Any) -> str:
    """Requests / tokens of a SchedulerOutput (else nothing)."""
    tokens = getattr(result, "total_num_scheduled_tokens", None)
    if tokens is None:
        return ""
    return f"{len(result.num_scheduled_tokens)} reqs {tokens} tok"


class PhaseTimer:
    """Wall time spent in wrapped methods, accumulated under the current label."""

    def __init__(self) -> None:
        self.label = "warmup"
        self.totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.counts: dict[str, int] = defaultdict(int)
        self.calls: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        """Calls of each phase per label (engine steps per batch: core.scheduler.schedule)."""
        self.wrapped: list[str] = []
        self.samples: dict[str, list[dict[str, float]]] = defaultdict(list)
        """Per request and label: seconds in each phase (medians resist the rare slow step)."""
        self._seen: dict[str, dict[str, float]] = defaultdict(dict)
        self.timeline: dict[str, list[list[tuple[str, float, float, str]]]] = defaultdict(list)
        """Per label and round: (phase, start s since the round began, seconds, detail) of the
        engine steps, schedules and our hooks (--timeline)."""
        self.round_start = 0.0
        self.ttft_p50: dict[str, list[float]] = defaultdict(list)
        """Per label: each round's median TTFT (ms, vLLM's first-token latency)."""
        self.record_timeline = False

    def end_request(self, label: str) -> None:
        """Close one request of `label`: its phase times are the totals' growth since the last."""
        totals, seen = self.totals[label], self._seen[label]
        self.samples[label].append({p: t - seen.get(p, 0.0) for p, t in totals.items()})
        self._seen[label] = dict(totals)

    def wrap(self, owner: Any, name: str, path: str) -> None:
        method = getattr(owner, name)

        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = None
            try:
                result = method(*args, **kwargs)
                return result
            finally:
                elapsed = time.perf_counter() - start
                self.totals[self.label][path] += elapsed
                self.calls[self.label][path] += 1
                if self.record_timeline and path in TIMELINE and self.label != "warmup":
                    self.timeline[self.label][-1].append(
                        (path.rsplit(".", 1)[-1], start - self.round_start, elapsed,
                         _detail(result)))

        setattr(owner, name, timed)
        self.wrapped.append(path)

    def install(self, roots: dict[str, Any]) -> None:
        for path in PHASES:
            head, *rest = path.split(".")
            owner = roots.get(head)
            for part in rest[:-1]:
                owner = getattr(owner, part, None)
            if owner is not None and callable(getattr(owner, rest[-1], None)):
                self.wrap(owner, rest[-1], path)

    def per_request_us(self) -> dict[str, dict[str, float]]:
        """Mean microseconds per request in each phase."""
        return {label: {p: 1e6 * t / max(self.counts[label], 1) for p, t in phases.items()}
                for label, phases in self.totals.items() if label != "warmup"}

    def median_us(self) -> dict[str, dict[str, float]]:
        """Median microseconds per request in each phase."""
        return {label: {p: 1e6 * statistics.median(r.get(p, 0.0) for r in requests)
                        for p in self.totals[label]}
                for label, requests in self.samples.items() if requests}

    def clear(self) -> None:
        for store in (self.totals, self.counts, self.samples, self._seen, self.calls,
                      self.timeline, self.ttft_p50):
            store.clear()


def add_engine_args(parser: argparse.ArgumentParser, pool: int) -> None:
    """The fact pool, prompt shape and engine settings the probes pass to build_engine."""
    parser.add_argument("--pool", type=int, default=pool)
    parser.add_argument("--fact-tokens", type=int, default=30)
    parser.add_argument("--question-tokens", type=int, default=48)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--slab-mib", type=int, default=4096)
    parser.add_argument("--kv-cache-gib", type=float, default=None)
    parser.add_argument("--cudagraph-sizes", default=None)
    parser.add_argument("--vllm-arg", action="append", default=[])


def roots(engine: Any) -> dict[str, Any]:
    """The objects PHASES start from (MP=0 only)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    client = engine._runner.llm.llm_engine.engine_core
    core = getattr(client, "engine_core", None)
    if core is None:
        raise SystemExit("the probes need the in-process engine core (MP=0)")
    return {"core": core, "engine": engine, "worker_connector": get_kv_transfer_group()}


def run_modes(engine: Any, facts: list[int], k: int, questions: Callable[[], str],
              count: int, rng: random.Random, timer: PhaseTimer | None, batch: int = 1,
              max_tokens: int = 1) -> dict[str, list[float]]:
    """`count` rounds of `batch` fact sets, each round asked in kv then resident mode.

    batch 1: one request at a time (TTFT); batch N: N requests in one vLLM batch
    (generate_many, one token each: the prefill step(s) of a throughput batch), their
    resident fact sets warmed first in one untimed batch. max_tokens > 1: whole throughput.py
    batches (prefill and decode).
    """
    from vllm import SamplingParams

    from inferscale_engine import MemoryHandle
    from inferscale_engine.prompting.layout import Layout

    one = SamplingParams(max_tokens=max_tokens, temperature=0.0, detokenize=False,
                         ignore_eos=True)
    out: dict[str, list[float]] = {"kv": [], "resident": []}

    def run(requests: list[tuple[Any, str]], mode: str) -> None:
        if len(requests) == 1:  # the single-request path, as ttft.py times it
            outs = [engine.generate(*requests[0], one, mode=mode, layout=Layout())]
        else:
            outs = engine.generate_many(requests, one, mode=mode, layout=Layout())
        if timer is not None and timer.label != "warmup":
            ttfts = sorted(o.ttft_ms for o in outs if o.ttft_ms is not None)
            if ttfts:
                timer.ttft_p50[timer.label].append(ttfts[len(ttfts) // 2])

    for _ in range(count):
        handles = [MemoryHandle("bench", tuple(rng.sample(facts, k))) for _ in range(batch)]
        asked = [(h, questions()) for h in handles]
        if timer is not None:
            timer.label = "warmup"  # the resident warm-up is no part of either mode
        run([(h, questions()) for h in handles], "text")
        for mode in ("kv", "resident"):
            if timer is not None:
                timer.label = mode
                timer.counts[mode] += 1
                timer.timeline[mode].append([])
                timer.round_start = time.perf_counter()
            start = time.perf_counter()
            run(asked, "kv" if mode == "kv" else "text")
            out[mode].append((time.perf_counter() - start) * 1e3)
            if timer is not None:
                timer.end_request(mode)
    if timer is not None:
        timer.label = "warmup"
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--k", default="50,100")
    parser.add_argument("--requests", type=int, default=20, help="timed fact sets per k")
    parser.add_argument("--profiled", type=int, default=4, help="fact sets under torch.profiler")
    parser.add_argument("--batch", type=int, default=1,
                        help="requests per vLLM batch (N of throughput.py; phase times are "
                             "then per batch, and the steps each batch took are counted)")
    parser.add_argument("--max-tokens", type=int, default=1,
                        help="tokens per answer (16: whole throughput.py batches)")
    parser.add_argument("--timeline", action="store_true",
                        help="print every round's engine steps (start, duration, requests and "
                             "tokens scheduled) and keep them in the JSON")
    add_engine_args(parser, pool=300)
    parser.add_argument("--variants", default="default",
                        help="process settings to probe in turn, each over every k: default, "
                             "gc-frozen (gc.freeze() now), gc-off (gc disabled), threads1 "
                             "(torch.set_num_threads(1))")
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    args.enforce_eager, args.multiprocessing = False, False
    engine, _ = build_engine(args)
    tokenizer = engine.tokenizer
    facts = engine.add_facts("bench", synthetic_texts(tokenizer, args.pool, args.fact_tokens,
                                                      seed=1))
    pool = iter(synthetic_texts(tokenizer, 4096, args.question_tokens, seed=2, fmt="{text}"))
    rng = random.Random(0)
    timer = PhaseTimer()
    timer.install(roots(engine))
    print("timed phases:", ", ".join(timer.wrapped), flush=True)
    record: dict[str, Any] = {"benchmark": "ceiling_probe", "config": vars(args),
                              "environment": environment(), "phases": timer.wrapped, "k": {}}
    threads = torch_threads()
    for variant, k in ((v, int(x)) for v in args.variants.split(",") for x in args.k.split(",")):
        apply_variant(variant, threads)
        run_modes(engine, facts, k, lambda: next(pool), 6, rng, None, args.batch,
                  args.max_tokens)  # warm-up
        timer.clear()
        timer.record_timeline = args.timeline
        walls = run_modes(engine, facts, k, lambda: next(pool), args.requests, rng, timer,
                          args.batch, args.max_tokens)
        phases = timer.median_us()
        medians = {m: sorted(v)[len(v) // 2] for m, v in walls.items()}
        key = k if variant == "default" else f"{variant}-{k}"
        steps = {m: timer.calls[m].get("core.scheduler.schedule", 0) / max(timer.counts[m], 1)
                 for m in walls}
        record["k"][key] = {"median_ms": medians, "phase_us_median": phases,
                            "phase_us_mean": timer.per_request_us(), "walls_ms": walls,
                            "steps_per_round": steps,
                            "calls": {m: dict(c) for m, c in timer.calls.items()},
                            "timeline": dict(timer.timeline),
                            "ttft_p50_ms": dict(timer.ttft_p50)}
        unit = "request" if args.batch == 1 else f"batch of {args.batch}"
        ttft = {m: statistics.median(timer.ttft_p50[m]) if timer.ttft_p50.get(m) else float("nan")
                for m in walls}
        print(f"\n== {variant} k={k}: median kv {medians['kv']:.2f} ms, resident "
              f"{medians['resident']:.2f} ms; TTFT p50 kv {ttft['kv']:.2f} ms, resident "
              f"{ttft['resident']:.2f} ms; engine steps per {unit} kv {steps['kv']:.1f}, "
              f"resident {steps['resident']:.1f}; host time per {unit} (us, median), kv / "
              f"resident / diff")
        for path in timer.wrapped:
            kv, res = phases.get("kv", {}).get(path, 0.0), phases.get("resident", {}).get(path,
                                                                                          0.0)
            if kv or res:
                print(f"  {path:60s} {kv:9.1f} {res:9.1f} {kv - res:+9.1f}")
        if args.timeline:
            print_timeline(timer.timeline)
    largest = max(int(x) for x in args.k.split(","))
    record["profile"] = {} if not args.profiled else profile(
        engine, facts, largest, lambda: next(pool), args.profiled, rng, args)
    engine.close()
    written = write_record(f"ceiling_probe-{args.model}{('-' + args.tag) if args.tag else ''}",
                           record)
    print(f"wrote {written}")
    return record


_GROUP = {"preprocess_add_request": "add_request"}
"""Phases nested in another that print as one run with it."""


def print_timeline(timeline: dict[str, list[list[tuple[str, float, float, str]]]]) -> None:
    """Each mode's median round in full (ms since the round began), then per-round sums."""
    for mode, rounds in timeline.items():
        ends = [max((t + d for _, t, d, _ in r), default=0.0) for r in rounds]
        median = sorted(range(len(rounds)), key=ends.__getitem__)[len(rounds) // 2]
        print(f"\n-- {mode}: round {median} (median of {len(rounds)} by last event), ms "
              "(runs of one phase merged: calls x, first start, summed duration)")
        events = sorted(rounds[median], key=lambda e: e[1])
        for _, group in itertools.groupby(events, key=lambda e: _GROUP.get(e[0], e[0])):
            run = list(group)
            sums: dict[str, float] = defaultdict(float)
            for phase, _, duration, _ in run:
                sums[phase] += duration
            calls = Counter(e[0] for e in run)
            print(f"  {1e3 * run[0][1]:9.2f} " + ", ".join(
                f"{p} +{1e3 * d:.2f}" + (f" x{calls[p]}" if len(run) > 1 else "")
                for p, d in sums.items()) + f"  {run[0][3]}")
        for i, r in enumerate(rounds):
            steps = [t for p, t, _, _ in r if p == "schedule"]
            busy = sum(d for p, _, d, _ in r if p in ("execute_model", "schedule",
                                                       "sample_tokens", "update_from_output"))
            print(f"  round {i}: {len(steps)} schedules, first at "
                  f"{1e3 * min(steps, default=0.0):.1f} ms, engine phases {1e3 * busy:.1f} ms, "
                  f"last event ends {1e3 * ends[i]:.1f} ms")


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def apply_variant(variant: str, threads: int) -> None:
    """Set the process up for one --variants entry (undoing the others)."""
    import gc

    import torch

    if variant not in ("default", "gc-frozen", "gc-off", "threads1"):
        raise SystemExit(f"unknown variant {variant!r}")
    gc.enable()
    torch.set_num_threads(1 if variant == "threads1" else threads)
    if variant in ("gc-frozen", "gc-off"):
        gc.collect()
        gc.freeze()
    if variant == "gc-off":
        gc.disable()


def profile(engine: Any, facts: list[int], k: int, questions: Callable[[], str], count: int,
            rng: random.Random, args: argparse.Namespace) -> dict[str, str]:
    """torch.profiler tops of `count` kv and resident requests at k (and a trace of each)."""
    import os

    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    from vllm import SamplingParams

    from inferscale_engine import MemoryHandle
    from inferscale_engine.prompting.layout import Layout

    one = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if torch.cuda.is_available() else [])
    handles = [MemoryHandle("bench", tuple(rng.sample(facts, k))) for _ in range(count)]
    if args.batch > 1:
        print("(torch.profiler pass: one request at a time)")
    for handle in handles:  # resident: each fact set in the prefix cache before profiling
        engine.generate(handle, questions(), one, mode="text", layout=Layout())
    tops: dict[str, str] = {}
    out_dir = Path(os.environ.get("INFERSCALE_RESULTS", "benchmarks/out"))
    device = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    for mode in ("kv", "resident"):
        with torch_profile(activities=activities) as prof:
            for handle in handles:
                engine.generate(handle, questions(), one, mode="kv" if mode == "kv" else "text",
                                layout=Layout())
        averages = prof.key_averages()
        by_cpu = averages.table(sort_by="self_cpu_time_total", row_limit=25)
        tops[mode] = (f"-- by {device}\n{averages.table(sort_by=device, row_limit=25)}\n"
                      f"-- by self CPU\n{by_cpu}")
        print(f"\n=== torch.profiler, {count} {mode} requests at k={k}\n{tops[mode][-7000:]}")
        tag = f"-{args.tag}" if args.tag else ""
        prof.export_chrome_trace(str(out_dir / f"trace-{args.model}-{mode}-k{k}{tag}.json"))
    return tops


if __name__ == "__main__":
    main()
