"""The floor of KV injection through vLLM's connector API: TTFT with our work removed in parts.

Issue 13 asks kv's TTFT to come within 5% of the resident ceiling. This probe measures how close
the connector API lets any injection come: on one engine (MP=0, so vLLM's scheduler, the worker
and both halves of our connector run in this process; ttft.py's engine settings), one
max_tokens=1 request at a time, each round runs these variants:

  resident     the same kind of prompt with its preamble + facts already in vLLM's prefix cache
               (warmed with another question; timed with a fresh one), as in ttft.py
  kv           the product path
  kv-trusted   the scheduler takes the plan without checking it against the prompt (a plan
               handed over by reference, the MP=0 default: no InjectionPlan.matches; a signed
               one: no InjectionPlan.bound, so no packing of the prompt's ids and no MAC)
  kv-nocopy    the worker builds and uploads the load indices but launches no injection copy
  kv-noload    the worker's start_load returns at once (no index math, upload or copy)
  kv-copyindex the worker copies the load indices to the device before the launch (the path
               where the kernel cannot read pinned host memory; the default reads them there)
  kv-floor     trusted + noload: what is left is vLLM's own handling of external tokens (block
               allocation, prefix-cache insertion), the plan's parse and connector metadata, and
               the client's prompt + signed plan
  kv-aftertext kv right after an untimed text request on the same facts (as ttft.py's round
               order runs it: text, then kv), where the other kv variants mostly follow kv
  resident-afterkv  resident with an untimed kv request (another fact set) between the
               prefix-cache fill and the timed request: resident then follows a small request,
               as the kv variants do, where plain resident follows its fill's full prefill
               (kv-aftertext : resident and kv : resident-afterkv are the like-for-like pairs)

The ablated variants are benchmark-only switches set on this process's connector objects (never
in the package); they compute with whatever the claimed blocks held, which only timing may use.
Every variant draws its own fact set each round (injected prompts are salted per fact set, so a
second kv request on the same set would find the first one's blocks in the prefix cache);
every kv variant must claim its memory (checked, printed). Per variant: the wall of
Engine.generate, of the vLLM run alone (prompt and plan built before it) and their paired
ratios to resident (the median over rounds of each round's ratio); on a GPU also the SM clock
and power draw (NVML) sampled right before each timed request.

  python benchmarks/gpu/floor_probe.py --model llama-3.1-8b --k 0,50,100 --requests 25
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import environment, summarize, synthetic_texts, write_record  # noqa: E402
from benchmarks.gpu.ceiling_probe import add_engine_args, roots  # noqa: E402
from benchmarks.ttft import build_engine, paired_ratio  # noqa: E402

VARIANTS = ("kv", "kv-trusted", "kv-nocopy", "kv-noload", "kv-floor", "kv-copyindex",
            "kv-aftertext", "resident", "resident-afterkv")
RESIDENTS = ("resident", "resident-afterkv")
SWITCHES = {"kv": set(), "kv-trusted": {"trusted"}, "kv-nocopy": {"nocopy"},
            "kv-noload": {"noload"}, "kv-floor": {"trusted", "noload"},
            "kv-copyindex": {"copyindex"}, "kv-aftertext": set(),
            "resident": set(), "resident-afterkv": set()}


class Ablation:
    """Switches on this process's connector halves (MP=0), and what they did."""

    def __init__(self, engine: Any) -> None:
        from inferscale_engine.connector.scheduler import _Checked
        from inferscale_engine.protocol.handoff import LOCAL_KIND, take
        from inferscale_engine.protocol.plan import PARAMS_KEY, InjectionPlan, from_params

        objects = roots(engine)
        self.on: set[str] = set()
        self.counts: Counter[str] = Counter()
        scheduler = objects["core"].scheduler.connector.scheduler
        worker = objects["worker_connector"].worker
        verify, start_load, inject = scheduler._verify, worker.start_load, worker.paged.inject_

        def trusting_verify(request: Any) -> Any:
            entry = (request.kv_transfer_params or {}).get(PARAMS_KEY)
            if "trusted" in self.on and isinstance(entry, dict) and entry.get("kind") == LOCAL_KIND:
                local = take(scheduler._tag, entry)
                if local is not None:
                    self.counts["trusted"] += 1
                    return _Checked(local[0], "inject")
            elif "trusted" in self.on:
                plan = from_params(request.kv_transfer_params)
                if isinstance(plan, InjectionPlan):  # parsed without the prompt's ids: only
                    self.counts["trusted"] += 1  # their count is used from here on
                    return _Checked(InjectionPlan(
                        plan.user_id, plan.slab_keys, plan.lengths, bytes(4 * sum(plan.lengths)),
                        plan.cache_salt, plan.mac, plan.wire), "inject")
            return verify(request)

        def maybe_load(meta: Any) -> None:
            if "noload" in self.on and meta.loads:
                self.counts["noload"] += len(meta.loads)
                return
            staging = worker._staging
            zero_copy = staging.zero_copy
            if "copyindex" in self.on and meta.loads:
                self.counts["copyindex"] += len(meta.loads)
                staging.zero_copy = False
            try:
                start_load(meta)
            finally:
                staging.zero_copy = zero_copy

        def maybe_inject(*args: Any) -> None:
            if "nocopy" in self.on:
                self.counts["nocopy"] += 1
                return
            inject(*args)

        scheduler._verify = trusting_verify
        worker.start_load = maybe_load
        worker.paged.inject_ = maybe_inject
        self.worker = worker


class GpuState:
    """The GPU's SM clock (MHz) and power draw (W) through NVML (vLLM's vendored pynvml), sampled
    right before each timed request: does a long prefill leave the next request a slower GPU?
    Samples nothing where there is no NVIDIA GPU or NVML."""

    def __init__(self) -> None:
        self._nvml: Any = None
        try:
            import torch
            import vllm.third_party.pynvml as nvml

            if torch.cuda.is_available():
                nvml.nvmlInit()
                self._handle = nvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
                self._nvml = nvml
        except Exception:  # noqa: BLE001 - optional: no GPU, no driver, no NVML
            self._nvml = None

    def sample(self) -> tuple[float, float] | None:
        if self._nvml is None:
            return None
        nvml = self._nvml
        try:
            return (float(nvml.nvmlDeviceGetClockInfo(self._handle, nvml.NVML_CLOCK_SM)),
                    nvml.nvmlDeviceGetPowerUsage(self._handle) / 1e3)
        except Exception:  # noqa: BLE001 - a query this GPU does not support: stop sampling
            self._nvml = None
            return None


def run_rounds(engine: Any, ablation: Ablation, facts: list[int], k: int, variants: list[str],
               rounds: int, rng: random.Random, question: Any, gpu: GpuState
               ) -> dict[str, dict[str, list]]:
    """`rounds` rounds of every variant (kv variants in a rotating order, resident last)."""
    from vllm import SamplingParams

    from inferscale_engine import MemoryHandle
    from inferscale_engine.prompting.layout import Layout

    one = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    runner, run_ms = engine._runner, []
    run = runner.run

    def timed_run(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return run(*args, **kwargs)
        finally:
            run_ms.append((time.perf_counter() - start) * 1e3)

    runner.run = timed_run
    out: dict[str, dict[str, list]] = {v: {"wall_ms": [], "engine_ms": [], "injected": [],
                                           "cached": [], "gpu": []} for v in variants}
    kv_variants = [v for v in variants if v not in RESIDENTS]
    residents = [v for v in RESIDENTS if v in variants]
    try:
        for i in range(rounds):
            order = kv_variants[i % len(kv_variants):] + kv_variants[:i % len(kv_variants)]
            # residents last (their fills put unsalted text in the prefix cache), alternating
            for variant in order + (residents if i % 2 else residents[::-1]):
                handle = MemoryHandle("bench", tuple(rng.sample(facts, k)))
                if variant in (*RESIDENTS, "kv-aftertext"):
                    engine.generate(handle, question(), one, mode="text", layout=Layout())
                if variant == "resident-afterkv":
                    engine.generate(MemoryHandle("bench", tuple(rng.sample(facts, k))),
                                    question(), one, mode="kv", layout=Layout())
                ablation.on = SWITCHES[variant]
                state = gpu.sample()
                start = time.perf_counter()
                result = engine.generate(handle, question(), one,
                                         mode="text" if variant in RESIDENTS else "kv",
                                         layout=Layout())
                wall = (time.perf_counter() - start) * 1e3
                ablation.on = set()
                got = out[variant]
                got["wall_ms"].append(wall)
                got["engine_ms"].append(run_ms[-1])
                got["injected"].append(result.num_injected_tokens)
                got["cached"].append(result.num_cached_tokens)
                if state is not None:
                    got["gpu"].append(state)
    finally:
        runner.run = run
    return out


def summary_of(raw: dict[str, dict[str, list]]) -> dict[str, Any]:
    res, res_kv = raw.get("resident"), raw.get("resident-afterkv")
    entry: dict[str, Any] = {}
    for variant, got in raw.items():
        entry[variant] = {
            "wall": summarize(got["wall_ms"]), "engine": summarize(got["engine_ms"]),
            "prepare_ms_median": statistics.median(
                w - e for w, e in zip(got["wall_ms"], got["engine_ms"], strict=True)),
            "injected_median": statistics.median(got["injected"]),
            "cached_median": statistics.median(got["cached"]),
        }
        if got.get("gpu"):  # (SM clock MHz, power W) right before each timed request
            entry[variant]["sm_clock_mhz_median"] = statistics.median(c for c, _ in got["gpu"])
            entry[variant]["power_w_median"] = statistics.median(w for _, w in got["gpu"])
        if res is not None and variant != "resident":
            entry[variant]["paired_wall"] = paired_ratio(got["wall_ms"], res["wall_ms"])
            entry[variant]["paired_engine"] = paired_ratio(got["engine_ms"], res["engine_ms"])
        if res_kv is not None and variant != "resident-afterkv":
            entry[variant]["paired_wall_afterkv"] = paired_ratio(got["wall_ms"],
                                                                 res_kv["wall_ms"])
    return entry


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--k", default="0,50,100")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--requests", type=int, default=25, help="timed rounds per k")
    parser.add_argument("--warmup", type=int, default=4, help="untimed rounds per k")
    add_engine_args(parser, pool=400)
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    if unknown := set(variants) - set(VARIANTS):
        raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    args.enforce_eager, args.multiprocessing = False, False
    engine, _ = build_engine(args)
    facts = engine.add_facts("bench", synthetic_texts(engine.tokenizer, args.pool,
                                                      args.fact_tokens, seed=1))
    questions = iter(synthetic_texts(engine.tokenizer, 8192, args.question_tokens, seed=2,
                                     fmt="{text}"))
    ablation, gpu = Ablation(engine), GpuState()
    rng = random.Random(0)
    record: dict[str, Any] = {"benchmark": "floor_probe", "config": vars(args),
                              "environment": environment(), "k": {}}
    for k in (int(x) for x in args.k.split(",")):
        run_rounds(engine, ablation, facts, k, variants, args.warmup, rng,
                   lambda: next(questions), gpu)
        before = Counter(ablation.counts)
        raw = run_rounds(engine, ablation, facts, k, variants, args.requests, rng,
                         lambda: next(questions), gpu)
        entry = summary_of(raw)
        entry["switch_counts"] = dict(ablation.counts - before)
        record["k"][k] = {"summary": entry, "raw": raw}
        print_k(k, entry, variants)
    record["worker_counters"] = dict(ablation.worker.counters)
    engine.close()
    written = write_record(f"floor_probe-{args.model}{('-' + args.tag) if args.tag else ''}",
                           record)
    print(f"wrote {written}")
    return record


def print_k(k: int, entry: dict[str, Any], variants: list[str]) -> None:
    print(f"\n== k={k} (switches fired: {entry['switch_counts']}); medians in ms, paired = median "
          "over rounds of the round's ratio to resident")
    print("| variant | wall | engine | prepare | injected | cached | wall/resident | "
          "engine/resident | wall/resident-afterkv | SM MHz | W |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for variant in variants:
        e = entry[variant]
        paired = [f"{e[p]['median']:.3f}" if p in e else "-"
                  for p in ("paired_wall", "paired_engine", "paired_wall_afterkv")]
        print(f"| {variant} | {e['wall']['median_ms']:.2f} | {e['engine']['median_ms']:.2f} | "
              f"{e['prepare_ms_median']:.2f} | {e['injected_median']:.0f} | "
              f"{e['cached_median']:.0f} | {' | '.join(paired)} | "
              f"{e.get('sm_clock_mhz_median', '-')} | {e.get('power_w_median', '-')} |",
              flush=True)
        if variant not in RESIDENTS and k and not e["injected_median"]:
            print(f"WARNING: {variant} injected nothing: its numbers are not an injection's")


if __name__ == "__main__":
    main()
