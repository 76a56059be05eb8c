"""Tiered fact KV at scale: TTFT when the facts of all users are many times the GPU slab.

U users x F facts (each encoded after the user's recent facts), users drawn by Zipf(s)
popularity, k facts per request in a random order. The same request sequence runs against one
engine per arm, one arm after the other, each in a process of its own:

  resident  a slab that holds every fact: kv never misses (the all-resident reference); the
            same engine also times text mode (facts pasted as text, vLLM prefix caching on)
  reencode  a slab of --slab-mib, no lower tier: a fact evicted from the slab is encoded again
            with its context (on_evicted="reencode", the policy before tiers)
  host      the same slab over a pinned host-RAM tier of --host-tier-mib: an evicted fact is
            demoted and promoted back by a copy (the tier is inclusive: a promoted fact keeps
            its host copy, so its next eviction copies nothing); what falls out of host RAM is
            encoded again
  disk      the same slab and host tier over a disk tier (every fact written through at
            encode time): what falls out of host RAM is loaded from its disk entry
  offload   the peer a user would pick instead: no InferScale connector, each user's facts
            pasted as text in one stable order (a prefix that repeats per user) into plain
            vLLM with its own CPU offloading (kv_offloading_size = --host-tier-mib, the
            'native' OffloadingConnector) and a GPU KV cache of the slab's size plus room for
            the running request: a prefix hit on blocks offloaded to host RAM loads them back

The first --warmup requests of each arm fill the tiers (untimed); the rest are timed (TTFT =
wall time of one max_tokens=1 request; with it, the prompt tokens vLLM computed for the
request, which decide whether its step runs in a captured CUDA graph). Per arm: TTFT
p50/p90/p99 and where each requested fact came from (slab, host, disk, encoded again); for
the tiers, the bytes each promotion call moved and the host-to-device rate it achieved (the
workers' own timers); for the offload arm, the share of prompt tokens vLLM found cached (on
the GPU or loaded back from host RAM); and the host link's own pinned copy rate, the bound
for a promotion's.

  python benchmarks/tiers.py --model tiny --users 40 --facts-per-user 20 --k 10 --slab-mib 8
  python benchmarks/tiers.py --model llama-3.1-8b --users 80 --facts-per-user 50 --k 50 \\
      --slab-mib 1280 --host-tier-mib 4096 --requests 1500 --cudagraph-sizes 1,2,4,8,16,32,64

Writes one JSON record (benchmarks/out by default) and, with --plot, a PNG of the TTFT
distributions. Asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (  # noqa: E402
    compilation_overrides,
    environment,
    fit_max_model_len,
    resolve_model,
    summarize,
    synthetic_texts,
    write_tagged,
)

ARMS = ("resident", "reencode", "host", "disk", "offload")
TIER_COUNTERS = ("host_hits", "disk_hits", "encoded_facts")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--users", type=int, default=40)
    parser.add_argument("--facts-per-user", type=int, default=20)
    parser.add_argument("--fact-tokens", type=int, default=30)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--zipf", type=float, default=1.0, help="popularity exponent s")
    parser.add_argument("--requests", type=int, default=400, help="timed requests per arm")
    parser.add_argument("--warmup", type=int, default=100, help="untimed requests per arm")
    parser.add_argument("--slab-mib", type=int, default=8)
    parser.add_argument("--host-tier-mib", type=int, default=16)
    parser.add_argument("--context-window", type=int, default=256)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--kv-cache-gib", type=float, default=None)
    parser.add_argument("--cudagraph-sizes", default=None)
    parser.add_argument("--disk-folder", default=None, help="where the disk arm writes (a "
                        "temporary folder, removed afterwards, by default)")
    parser.add_argument("--plot", action="store_true")
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    if args.k > args.facts_per_user:
        parser.error("--k must not exceed --facts-per-user")
    unknown = set(args.arms.split(",")) - set(ARMS)
    if unknown:
        parser.error(f"unknown arms {sorted(unknown)}; choose from {', '.join(ARMS)}")
    return args


def fact_bytes(model: str, args: argparse.Namespace, config: Any) -> int:
    """Slab bytes of one fact (whole slab pages of the fact's tokens)."""
    from transformers import AutoConfig

    from inferscale_engine.model.check import kv_bytes_per_token

    pages = -(-args.fact_tokens // config.slab_page_tokens)
    per_token = kv_bytes_per_token(AutoConfig.from_pretrained(model), config)
    return pages * config.slab_page_tokens * per_token


def engine_config(args: argparse.Namespace, arm: str, disk: Path) -> Any:
    from inferscale_engine import EngineConfig

    model, dtype, load_format = resolve_model(args.model)
    base = EngineConfig(
        model=model, dtype=dtype, load_format=load_format,
        max_model_len=fit_max_model_len(model, args.max_model_len),
        context_source="recent", context_window_tokens=args.context_window,
        kv_cache_memory_bytes=int(args.kv_cache_gib * 2**30) if args.kv_cache_gib else None,
        max_fact_tokens=max(64, 2 * args.fact_tokens), host_tier_bytes=0,
        vllm_overrides=compilation_overrides(args.cudagraph_sizes))
    total = fact_bytes(model, args, base) * args.users * args.facts_per_user
    if arm == "resident":  # every fact, the preamble, and room to spare
        return dataclasses.replace(base, slab_capacity_bytes=int(total * 1.1) + 64 * 2**20)
    small = dataclasses.replace(base, slab_capacity_bytes=args.slab_mib * 2**20)
    if arm == "reencode":
        return small
    tiered = dataclasses.replace(small, host_tier_bytes=args.host_tier_mib * 2**20)
    return dataclasses.replace(tiered, disk_tier_path=str(disk)) if arm == "disk" else tiered


def request_sequence(args: argparse.Namespace, questions: list[str]
                     ) -> list[tuple[int, list[int], str]]:
    """(user, positions of its k facts in a random order, question) per request; users by
    Zipf(s) popularity over a random ranking. One sequence for every arm."""
    rng = random.Random(11)
    ranking = rng.sample(range(args.users), args.users)
    weights = [1.0 / (rank + 1) ** args.zipf for rank in range(args.users)]
    total = args.warmup + args.requests
    users = [ranking[r] for r in rng.choices(range(args.users), weights, k=total)]
    return [(u, rng.sample(range(args.facts_per_user), args.k), questions[i % len(questions)])
            for i, u in enumerate(users)]


def run_arm(args: argparse.Namespace, arm: str, texts: list[list[str]],
            sequence: list[tuple[int, list[int], str]], disk: Path) -> dict[str, Any]:
    from vllm import SamplingParams

    from inferscale_engine import Engine, MemoryHandle

    config = engine_config(args, arm, disk)
    start = time.perf_counter()
    engine = Engine(config)
    opened = time.perf_counter() - start
    try:
        start = time.perf_counter()
        ids = [engine.add_facts(f"user{u}", texts[u]) for u in range(args.users)]
        if config.disk_tier_path:
            engine.workers.flush_disk()
        ingest = time.perf_counter() - start
        print(f"[{arm}] engine {opened:.1f} s, {args.users * args.facts_per_user} facts "
              f"encoded in {ingest:.1f} s", flush=True)
        one_token = SamplingParams(max_tokens=1, temperature=0.0)
        modes = ("kv", "text") if arm == "resident" else ("kv",)
        ttft: dict[str, list[float]] = {mode: [] for mode in modes}
        computed: dict[str, list[int]] = {mode: [] for mode in modes}
        sources = {"slab": 0, "host": 0, "disk": 0, "encoded": 0}
        for i, (user, picks, question) in enumerate(sequence):
            handle = MemoryHandle(f"user{user}", tuple(ids[user][p] for p in picks))
            for mode in modes:
                before = [engine.counters.get(name, 0) for name in TIER_COUNTERS]
                t0 = time.perf_counter()
                out = engine.generate(handle, question, one_token, mode=mode)
                elapsed = (time.perf_counter() - t0) * 1e3
                if mode == "kv" and out.plan_status != "inject":
                    raise SystemExit(f"[{arm}] request {i}: plan {out.plan_status}")
                if i < args.warmup:
                    continue
                ttft[mode].append(elapsed)
                computed[mode].append(out.num_prompt_tokens - out.num_cached_tokens)
                if mode == "kv":
                    host, disk_hits, encoded = (engine.counters.get(name, 0) - b for name, b
                                                in zip(TIER_COUNTERS, before, strict=True))
                    sources["host"] += host
                    sources["disk"] += disk_hits
                    sources["encoded"] += encoded
                    sources["slab"] += args.k - host - disk_hits - encoded
            if (i + 1) % 250 == 0:
                print(f"[{arm}] {i + 1}/{len(sequence)} requests, kv median so far "
                      f"{summarize(ttft['kv'])['median_ms'] if ttft['kv'] else 0:.1f} ms",
                      flush=True)
        served = sum(sources.values())
        stats = engine.stats()
        totals = stats.worker_totals
        return {"engine_config": {"slab_capacity_bytes": config.slab_capacity_bytes,
                                  "host_tier_bytes": config.host_tier_bytes,
                                  "disk_tier": bool(config.disk_tier_path)},
                "open_seconds": opened, "ingest_seconds": ingest,
                "ttft": {mode: summarize(samples) for mode, samples in ttft.items()},
                "raw_ms": ttft, "computed_tokens": computed, "sources": sources,
                "hit_rate": {tier: n / served for tier, n in sources.items()} if served else {},
                "counters": dict(stats.counters), "workers": totals,
                "moves": move_rates(totals)}
    finally:
        engine.close()
        del engine
        gc.collect()


def move_rates(totals: dict[str, int]) -> dict[str, float]:
    """Bytes per promotion call and the rate each tier's copies achieved, whole run."""
    rates: dict[str, float] = {}
    calls, moved, ns = (totals.get(k, 0) for k in ("host_promote_calls", "host_bytes_out",
                                                   "host_promote_ns"))
    if calls and ns:
        rates.update(promote_calls=calls, promote_mib_per_call=moved / calls / 2**20,
                     promote_ms_per_call=ns / calls / 1e6, promote_gb_per_s=moved / ns)
    moved, ns = totals.get("disk_bytes_read", 0), totals.get("disk_load_ns", 0)
    if ns:  # read, MAC check and copy of every loaded entry
        rates.update(disk_gb_per_s=moved / ns)
    return rates


def link_rates(mib: int = 256, repeats: int = 5) -> dict[str, float]:
    """The host link's own rate: one copy of `mib` MiB between pinned host memory and the GPU.

    The bound a promotion's rate is held against (its copies, a gather or scatter and a
    synchronization ride on this link). Empty without CUDA.
    """
    import torch

    if not torch.cuda.is_available():
        return {}
    host = torch.empty(mib * 2**20, dtype=torch.uint8, pin_memory=True)
    device = torch.empty_like(host, device="cuda")
    rates: dict[str, float] = {}
    for name, dst, src in (("h2d_gb_per_s", device, host), ("d2h_gb_per_s", host, device)):
        times = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        rates[name] = host.numel() / sorted(times)[len(times) // 2] / 1e9
    del host, device
    torch.cuda.empty_cache()
    return rates


def offload_prompts(args: argparse.Namespace, texts: list[list[str]],
                    sequence: list[tuple[int, list[int], str]]) -> list[list[int]]:
    """Each request as text mode renders it, the user's facts in one stable order."""
    from inferscale_engine import EngineConfig
    from inferscale_engine.model.check import load_tokenizer
    from inferscale_engine.prompting.prompt import PromptBuilder

    model, dtype, _ = resolve_model(args.model)
    config = EngineConfig(model=model, dtype=dtype)
    builder = PromptBuilder(load_tokenizer(config), config.system_prompt,
                            config.user_block_header)
    facts = [[builder.fact_ids(text) for text in user] for user in texts]
    return [builder.build([{"role": "user", "content": question}],
                          [facts[user][p] for p in sorted(picks)]).token_ids()
            for user, picks, question in sequence]


def run_offload_arm(args: argparse.Namespace, texts: list[list[str]],
                    sequence: list[tuple[int, list[int], str]]) -> dict[str, Any]:
    """Plain vLLM (no InferScale connector) with its native CPU offloading, text prompts."""
    import torch
    from transformers import AutoConfig
    from vllm import LLM, SamplingParams, TokensPrompt

    from inferscale_engine.config import ConnectorConfig
    from inferscale_engine.model.check import kv_bytes_per_token
    from inferscale_engine.runtime.runner import _release_vllm_process_state, engine_kwargs

    if not torch.cuda.is_available():
        raise SystemExit("the offload arm needs a GPU: vLLM's CPU offloading runs on CUDA "
                         "(and XPU) only")
    config = engine_config(args, "reencode", Path("."))
    prompts = offload_prompts(args, texts, sequence)
    longest = max(map(len, prompts))
    kwargs = engine_kwargs(config, ConnectorConfig(1, 16, config.max_model_len))
    del kwargs["kv_transfer_config"], kwargs["worker_extension_cls"]
    per_token = kv_bytes_per_token(AutoConfig.from_pretrained(config.model), config)
    room = -(-(longest + 32) // 16) * 16  # the running request (one at a time)
    gpu_bytes = args.slab_mib * 2**20 + room * per_token
    kwargs.update(kv_cache_memory_bytes=gpu_bytes, kv_offloading_size=args.host_tier_mib / 1024,
                  kv_offloading_backend="native", max_model_len=room)
    kwargs.pop("gpu_memory_utilization", None)
    start = time.perf_counter()
    llm = LLM(**kwargs)
    opened = time.perf_counter() - start
    print(f"[offload] engine {opened:.1f} s, GPU KV cache {gpu_bytes / 2**20:.0f} MiB, host "
          f"{args.host_tier_mib} MiB", flush=True)
    try:
        one_token = SamplingParams(max_tokens=1, temperature=0.0)
        ttft: list[float] = []
        cached: list[float] = []
        computed: list[int] = []
        for i, ids in enumerate(prompts):
            t0 = time.perf_counter()
            out = llm.generate(TokensPrompt(prompt_token_ids=ids), one_token, use_tqdm=False)[0]
            elapsed = (time.perf_counter() - t0) * 1e3
            if i < args.warmup:
                continue
            ttft.append(elapsed)
            cached.append((out.num_cached_tokens or 0) / len(ids))
            computed.append(len(ids) - (out.num_cached_tokens or 0))
            if (i + 1) % 250 == 0:
                print(f"[offload] {i + 1}/{len(prompts)} requests, median so far "
                      f"{summarize(ttft)['median_ms']:.1f} ms", flush=True)
        return {"engine_config": {"kv_cache_memory_bytes": gpu_bytes,
                                  "kv_offloading_size_gib": args.host_tier_mib / 1024,
                                  "kv_offloading_backend": "native"},
                "open_seconds": opened, "ttft": {"text": summarize(ttft)},
                "raw_ms": {"text": ttft}, "computed_tokens": {"text": computed},
                "cached_prompt_share": {"mean": sum(cached) / len(cached),
                                        "requests_over_half": sum(c > 0.5 for c in cached)
                                        / len(cached)},
                "hit_rate": {}}
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        _release_vllm_process_state()


def in_own_process(args: argparse.Namespace, arm: str, texts: list[list[str]],
                   sequence: list[tuple[int, list[int], str]], disk: Path) -> dict[str, Any]:
    """One arm in a fresh process: each engine starts on a clean device (vLLM's in-process
    state and CUDA graph pools of an earlier engine in the same process can break the next
    engine's graph capture)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_arm_child, args=(send, args, arm, texts, sequence, disk))
    process.start()
    send.close()
    try:
        result = receive.recv()
    except EOFError:
        result = None
    process.join()
    if not isinstance(result, dict):
        raise SystemExit(f"[{arm}] failed (exit code {process.exitcode}): {result}")
    return result


def _arm_child(send: Any, args: argparse.Namespace, arm: str, texts: list[list[str]],
               sequence: list[tuple[int, list[int], str]], disk: Path) -> None:
    try:
        send.send(run_offload_arm(args, texts, sequence) if arm == "offload" else
                  run_arm(args, arm, texts, sequence, disk))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        send.send(f"{type(exc).__name__}: {exc}")
        raise


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from transformers import AutoTokenizer

    args = parse_args(argv)
    model, _, _ = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    flat = synthetic_texts(tokenizer, args.users * args.facts_per_user, args.fact_tokens, seed=1)
    texts = [flat[u * args.facts_per_user:(u + 1) * args.facts_per_user]
             for u in range(args.users)]
    questions = synthetic_texts(tokenizer, 64, 24, seed=2, fmt="{text}")
    sequence = request_sequence(args, questions)
    folder = Path(args.disk_folder or tempfile.mkdtemp(prefix="inferscale-tiers-"))
    from inferscale_engine import EngineConfig

    per_fact = fact_bytes(model, args, EngineConfig(model=model, dtype=resolve_model(
        args.model)[1]))
    results: dict[str, Any] = {}
    record = {"benchmark": "tiers", "config": vars(args), "environment": environment(),
              "fact_bytes": per_fact,
              "facts_over_slab": per_fact * args.users * args.facts_per_user
              / (args.slab_mib * 2**20),
              "link": link_rates(), "results": results}
    path = write_tagged(f"tiers-{args.model}", args.tag, record)
    try:
        for arm in args.arms.split(","):
            shutil.rmtree(folder / "disk", ignore_errors=True)
            results[arm] = in_own_process(args, arm, texts, sequence, folder / "disk")
            path.write_text(json.dumps(record, indent=1, default=str))  # each arm as it ends
            row = results[arm]["ttft"]
            print(f"[{arm}] " + "; ".join(
                f"{mode} p50 {s['median_ms']:.1f} p99 {s['p99_ms']:.1f} ms"
                for mode, s in row.items()) + f"; sources {results[arm]['hit_rate']}"
                + f"; moves {results[arm].get('moves', {})}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    _print_table(results)
    if record["link"]:
        print("host link (pinned, 256 MiB): " + ", ".join(
            f"{k} {v:.1f}" for k, v in record["link"].items()), flush=True)
    if args.plot:
        print(f"wrote {plot(record, path.with_suffix('.png'))}")
    return record


def _print_table(results: dict[str, Any]) -> None:
    print("\n| arm | mode | p50 ms | p90 ms | p99 ms | slab | host | disk | encoded |")
    print("|---|---|---|---|---|---|---|---|---|")
    for arm, entry in results.items():
        rate = entry["hit_rate"]
        for mode, s in entry["ttft"].items():
            tiers = (" | ".join(f"{rate.get(t, 0):.1%}" for t in ("slab", "host", "disk",
                                                                  "encoded"))
                     if mode == "kv" else "- | - | - | -")
            print(f"| {arm} | {mode} | {s['median_ms']:.1f} | {s['p90_ms']:.1f} | "
                  f"{s['p99_ms']:.1f} | {tiers} |")


def plot(record: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for arm, entry in record["results"].items():
        for mode, samples in entry["raw_ms"].items():
            ordered = sorted(samples)
            label = ("text + vLLM offloading" if arm == "offload" else "text" if mode == "text"
                     else f"kv, {arm}")
            ax.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=label)
    env = record["environment"]
    config = record["config"]
    ax.set_xscale("log")
    ax.set_xlabel("TTFT, ms (log)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{config['model']}: {config['users']} users x {config['facts_per_user']} facts "
                 f"({record['facts_over_slab']:.0f}x the slab), k={config['k']}, "
                 f"Zipf({config['zipf']}); {env.get('gpu') or env.get('cpu')}", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


if __name__ == "__main__":
    main()
