"""TTFT vs k: text injection vs KV injection (vs the prefix-cache-resident ceiling), one engine.

Modes, on the same engine and the same prompts:
  text      facts pasted as text, vLLM prefix caching on (as users run it)
  kv        facts' stored KV injected by InferScale (plan building included in the time;
            with the embedded default, MP=0, the plan goes to the scheduler by reference)
  kv-signed the same with the plan signed and sent in full, as it crosses processes (MP=1,
            the server): the in-process handoff's A/B (inferscale_engine.protocol.handoff)
  resident  the same preamble + facts already in vLLM's prefix cache (warmed by a request
            with another question; timed with a third question, so that nothing of its
            question is cached): the ceiling KV injection can approach
  kv-endR, kv-userR, kv-alsoR, text-userR, text-endR
            a suffix repair (inferscale_engine.prompting.layout): R of the k facts prefilled as text
            after the injected ones (end of the memory block / a block in the user turn /
            injected and repeated); the text-* modes prefill that same layout whole
Each timed request draws its own random fact set from a pool (a different retrieval result per
question), so text mode only shares the preamble through the prefix cache, as in production.
TTFT = wall time of one max_tokens=1 request. Retrieval (query embedding + cosine top-k over
the pool) is timed separately and added to kv in the `kv+retrieval` column.

  python benchmarks/ttft.py --model tiny --ks 0,10,25,50,100 --repeats 15
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
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
    compilation_overrides,
    environment,
    fact_set,
    fit_max_model_len,
    locomo_facts,
    median_interval,
    resolve_model,
    scheduler_counters,
    summarize,
    synthetic_texts,
    vllm_args,
    write_record,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--ks", default="0,10,25,50,100")
    parser.add_argument("--modes", default="text,kv,resident")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=8,
                        help="untimed requests per k (the H200 ramps its clocks for a while)")
    parser.add_argument("--fact-tokens", type=int, default=30)
    parser.add_argument("--question-tokens", type=int, default=48)
    parser.add_argument("--pool", type=int, default=300, help="facts to draw fact sets from")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--align-blocks", action="store_true",
                        help="draw each round's facts (k > 0) so that preamble + facts end on a "
                             "vLLM block boundary: resident's prefix cache then holds exactly "
                             "the tokens kv injects, and both compute the same tokens (unaligned, "
                             "resident prefills the facts' last partial block again, up to "
                             "block_size - 1 tokens, which kv injects)")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--cudagraph-sizes", default=None,
                        help="capture CUDA graphs for these batch sizes only, e.g. 1,2,4,8,"
                             "16,32,64,128 (a kv prefill at k=50 computes ~50 tokens)")
    parser.add_argument("--embedder", default="auto",
                        help="auto | none | a sentence-transformers model (retrieval timing)")
    parser.add_argument("--slab-mib", type=int, default=4096)
    parser.add_argument("--kv-cache-gib", type=float, default=None)
    parser.add_argument("--kv-cache-dtype", default="auto",
                        help="vLLM's paged KV cache dtype: auto or fp8 (e4m3)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="vLLM tensor parallelism (results are tagged by --tag)")
    parser.add_argument("--multiprocessing", action="store_true",
                        help="vLLM EngineCore in its own process (MP=1)")
    parser.add_argument("--plot", action="store_true", help="write a PNG next to the JSON")
    parser.add_argument("--detokenize", action="store_true",
                        help="detokenize the first token too (default: token ids only, as a "
                             "serving TTFT of token ids; detokenizing adds ~1 ms to every mode)")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile the timed kv and resident requests at the largest k; "
                             "print both tops (what kv pays above the ceiling)")
    parser.add_argument("--facts", default="auto", choices=("auto", "synthetic", "locomo"),
                        help="auto: LoCoMo observations (~30 tokens) for a real tokenizer when "
                             "the data is present, else synthetic texts of --fact-tokens")
    parser.add_argument("--vllm-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="a vLLM engine argument for every mode alike, e.g. "
                             "async_scheduling=true (repeatable)")
    parser.add_argument("--predecessor", default="uniform",
                        choices=("uniform", "same", "mixed", "neutral"),
                        help="what runs right before each timed request. uniform (default) = "
                             "the same two untimed requests before every mode's timed one: a "
                             "text request (a full prefill) and then a kv request, each on "
                             "another fact set (resident's warm-up runs before them), so kv and "
                             "its ceiling have one history; same = one untimed request of the "
                             "same mode on another fact set (resident: a short request on its "
                             "own cached facts; kv then still ran two requests after text's "
                             "full prefill, resident three); mixed = the round's previous mode "
                             "(before 2026-12-04: kv right after text's full prefill, resident "
                             "after a short request); neutral = one untimed k=0 text request")
    parser.add_argument("--tag", default="")
    return parser.parse_args(argv)


def build_engine(args: argparse.Namespace):
    from inferscale_engine import Engine, EngineConfig

    model, dtype, load_format = resolve_model(args.model)
    kv_bytes = int(args.kv_cache_gib * 2**30) if args.kv_cache_gib else None
    config = EngineConfig(
        model=model, dtype=dtype, load_format=load_format,
        max_model_len=fit_max_model_len(model, args.max_model_len),
        slab_capacity_bytes=args.slab_mib * 2**20, context_window_tokens=0,
        block_size=args.block_size, kv_cache_memory_bytes=kv_bytes,
        kv_cache_dtype=getattr(args, "kv_cache_dtype", "auto"),  # callers with own args
        enforce_eager=True if args.enforce_eager else None, max_fact_tokens=128,
        multiprocessing=args.multiprocessing,
        tensor_parallel_size=getattr(args, "tensor_parallel_size", 1),
        vllm_overrides={"disable_log_stats": False, **compilation_overrides(args.cudagraph_sizes),
                        **vllm_args(args.vllm_arg)},
    )
    return Engine(config), config


def make_retriever(args: argparse.Namespace, facts: list[str]):
    """A timed retrieval function (query -> top-k indices), or None."""
    if args.embedder == "none":
        return None
    try:
        import torch

        from inferscale_engine.memory import Embedder
        from inferscale_engine.memory.config import DEFAULT_EMBEDDING_MODEL
        from inferscale_engine.memory.search.index import UserIndex

        device = "cuda" if torch.cuda.is_available() else "cpu"
        name = DEFAULT_EMBEDDING_MODEL if args.embedder == "auto" else args.embedder
        embedder = Embedder(name, device=device)
        index = UserIndex(embedder.dim, device=device)
        index.add(list(range(1, len(facts) + 1)), embedder.encode(facts))
    except Exception as exc:  # noqa: BLE001 - retrieval timing is optional (no model offline)
        print(f"retrieval not timed: {exc}", flush=True)
        return None

    def retrieve(query: str, k: int) -> float:
        start = time.perf_counter()
        if k:
            index.search(embedder.encode([query])[0], k)
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3

    return retrieve


def mode_layout(mode: str, k: int) -> tuple[str, Any]:
    """The engine mode and Layout of a mode name (repairs capped at k facts)."""
    from benchmarks.locomo_arms import layout_of
    from inferscale_engine.prompting.layout import Layout

    if mode in ("text", "kv", "resident", "kv-signed"):  # every fact in the memory block,
        # whatever the engine's default layout is
        return ("text" if mode in ("text", "resident") else "kv"), Layout()
    base, _, suffix = mode.partition("-")
    where = suffix.rstrip("0123456789")
    if base not in ("text", "kv") or where not in ("end", "user", "also") or where == suffix:
        raise SystemExit(f"unknown mode {mode!r}; use text, kv, resident, kv-endR, kv-userR, "
                         "kv-alsoR, text-endR, text-userR")
    r = min(int(suffix[len(where):]), k)
    return base, layout_of(where, r) if r else Layout()


def main(argv: list[str] | None = None) -> dict:
    from vllm import SamplingParams

    from inferscale_engine import MemoryHandle

    args = parse_args(argv)
    ks = [int(k) for k in args.ks.split(",")]
    modes = args.modes.split(",")
    # resident last: its warm-up puts each fact set in vLLM's prefix cache as unsalted text,
    # so a text-mode request after it would be served from there.
    modes = [m for m in modes if m != "resident"] + ["resident"] * ("resident" in modes)
    engine, config = build_engine(args)
    tokenizer = engine.tokenizer
    pool = max(args.pool, max(ks) + 1)
    facts = None
    if args.facts == "locomo" or (args.facts == "auto" and not args.model.startswith("tiny")):
        facts = locomo_facts(pool, 20, tokenizer)
        if facts is None and args.facts == "locomo":
            raise SystemExit("LoCoMo data not found (benchmarks/locomo_data.DEFAULT_DATA)")
    args.facts = "locomo" if facts is not None else "synthetic"
    if facts is None:
        facts = synthetic_texts(tokenizer, pool, args.fact_tokens, seed=1)
    fact_lengths = sorted(len(tokenizer.encode("- " + f + "\n")) for f in facts)
    print(f"{len(facts)} {args.facts} facts, median {fact_lengths[len(facts) // 2]} tokens",
          flush=True)
    questions = synthetic_texts(tokenizer, 3 * (args.repeats + args.warmup) + 2,
                                args.question_tokens, seed=2, fmt="{text}")
    start = time.perf_counter()
    fact_ids = engine.add_facts("bench", facts)
    ingest_s = time.perf_counter() - start
    print(f"ingested {len(facts)} facts in {ingest_s:.2f} s", flush=True)
    retrieve = make_retriever(args, facts)
    one_token = SamplingParams(max_tokens=1, temperature=0.0, detokenize=args.detokenize)
    rng = random.Random(0)
    align = block_size_of(engine) if args.align_blocks else None
    raw: dict[str, dict[int, list[float]]] = {m: {} for m in modes + ["retrieval"]}
    engine_ttft: dict[str, dict[int, list[float]]] = {m: {} for m in modes}
    cached: dict[str, dict[int, list[int]]] = {m: {} for m in modes}
    """Prompt tokens vLLM found in its prefix cache, per request: resident must find its facts."""
    injected: dict[int, int] = {}
    prompt_tokens: dict[int, int] = {}
    question_iter = itertools.cycle(questions[:-1])
    neutral_question = questions[-1]  # --predecessor's: asked before timed requests
    profilers = {"kv": cProfile.Profile(), "resident": cProfile.Profile()}
    handoffs = [shard.planner.handoff for shard in engine._shards]
    for k in ks:
        for mode in modes:
            raw[mode][k] = []
            engine_ttft[mode][k] = []
            cached[mode][k] = []
        raw["retrieval"][k] = []
        for i in range(args.warmup + args.repeats):
            # resident's timed request asks a question no request of this round asked: text's
            # request (same facts, same question) leaves the whole prompt in the prefix cache,
            # and a ceiling that also finds its question's blocks there computes fewer tokens
            # than kv does (~45 fewer at k=50 before 2026-12-03).
            question, other, fresh = (next(question_iter) for _ in range(3))
            handle = fact_set(engine, rng, fact_ids, k, question, align if k else None)
            timed = i >= args.warmup
            profiling = args.profile and timed and k == max(ks)
            for mode in modes:
                base, layout = mode_layout(mode, k)
                for shard, courier in zip(engine._shards, handoffs, strict=True):
                    shard.planner.handoff = None if mode == "kv-signed" else courier
                if mode == "resident":  # fill the prefix cache with this very layout (the
                    # engine's default layout repairs facts elsewhere: a different prefix)
                    engine.generate(handle, other, one_token, mode="text", layout=layout)
                if args.predecessor == "neutral":
                    engine.generate(None, neutral_question, one_token, mode="text")
                elif args.predecessor == "same" and mode == "resident":  # after its fill (a
                    # full prefill when no text request of the round cached these facts), a
                    # short request on them: resident follows a short request, as kv does
                    engine.generate(handle, neutral_question, one_token, mode="text",
                                    layout=layout)
                elif args.predecessor in ("same", "uniform"):  # on other fact sets; uniform:
                    # every mode alike, a full prefill two requests back and a load one back
                    for before in (base,) if args.predecessor == "same" else ("text", "kv"):
                        other_set = MemoryHandle("bench", tuple(rng.sample(fact_ids, k)))
                        engine.generate(other_set, neutral_question, one_token, mode=before,
                                        layout=layout)
                profiler = profilers.get(mode) if profiling else None
                if profiler is not None:
                    profiler.enable()
                # kv-signed on a fact set of its own: kv's request left this round's in the
                # prefix cache under the same salt, where kv-signed would find it resident
                timed_handle = (MemoryHandle("bench", tuple(rng.sample(fact_ids, k)))
                                if mode == "kv-signed" else handle)
                t0 = time.perf_counter()
                out = engine.generate(timed_handle, fresh if mode == "resident" else question,
                                      one_token, mode=base, layout=layout)
                elapsed = (time.perf_counter() - t0) * 1e3
                if profiler is not None:
                    profiler.disable()
                if timed:
                    raw[mode][k].append(elapsed)
                    cached[mode][k].append(out.num_cached_tokens or 0)
                    if out.ttft_ms is not None:
                        engine_ttft[mode][k].append(out.ttft_ms)
                if mode.startswith("kv"):
                    injected[k] = out.num_injected_tokens
                    prompt_tokens[k] = out.num_prompt_tokens
            if retrieve is not None and timed:
                raw["retrieval"][k].append(retrieve(question, k))
        row = {m: summarize(raw[m][k])["median_ms"] for m in modes}
        print(f"k={k:4d} prompt={prompt_tokens.get(k, 0):5d} tok  " + "  ".join(
            f"{m}={v:8.2f} ms" for m, v in row.items()), flush=True)
    summary = {}
    for k in ks:
        entry: dict[str, Any] = {m: summarize(raw[m][k]) for m in modes}
        entry["engine_ttft"] = {m: summarize(engine_ttft[m][k]) for m in modes
                                if engine_ttft[m][k]}
        if raw["retrieval"][k]:
            entry["retrieval"] = summarize(raw["retrieval"][k])
        if "text" in entry and "kv" in entry:
            entry["speedup_text_over_kv"] = entry["text"]["median_ms"] / entry["kv"]["median_ms"]
        if "resident" in entry and "kv" in entry:
            entry["kv_over_resident"] = entry["kv"]["median_ms"] / entry["resident"]["median_ms"]
            entry["kv_over_resident_paired"] = paired_ratio(raw["kv"][k], raw["resident"][k])
        if "kv-signed" in entry and "kv" in entry:  # the in-process handoff's A/B
            entry["kv_over_kv_signed_paired"] = paired_ratio(raw["kv"][k], raw["kv-signed"][k])
        entry["cached_tokens_median"] = {m: statistics.median(cached[m][k]) for m in modes
                                         if cached[m][k]}
        entry["num_prompt_tokens"] = prompt_tokens.get(k)
        entry["num_injected_tokens"] = injected.get(k)
        summary[k] = entry
    block_size = block_size_of(engine)
    record = {
        "benchmark": "ttft", "config": vars(args), "engine_config": {
            f: getattr(config, f) for f in ("model", "dtype", "kv_cache_dtype", "load_format",
                                            "max_model_len", "block_size", "enforce_eager",
                                            "key_origin")},
        "environment": environment(), "ingest_seconds": ingest_s, "num_facts": len(facts),
        "fact_tokens_median": fact_lengths[len(facts) // 2],
        "aligned_to": align, "summary": summary, "raw_ms": raw, "raw_engine_ttft_ms": engine_ttft,
        "engine_stats": engine.stats().workers, "scheduler_counters": scheduler_counters(engine),
    }
    engine.close()
    if args.profile:
        for mode, profiler in profilers.items():
            if mode not in modes:
                continue
            stream = io.StringIO()
            pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(40)
            record[f"profile_{mode}_top"] = stream.getvalue()
            print(f"--- cProfile of the timed {mode} requests at k={max(ks)}")
            print(stream.getvalue()[-5000:])
    _print_table(summary, modes)
    for k, entry in summary.items():  # resident must find every full cache block of its memory
        found = entry["cached_tokens_median"].get("resident")
        # kv's median plan (preamble + facts, injected exactly) is the median request's memory;
        # the last request's num_injected_tokens is one draw of random fact lengths
        planned = entry["cached_tokens_median"].get("kv")
        memory = planned or entry["num_injected_tokens"]
        if found is not None and memory and found < memory // block_size * block_size:
            print(f"WARNING: at k={k} resident requests found only {found:.0f} prompt tokens in "
                  f"vLLM's prefix cache ({memory} memory tokens, blocks of {block_size}): its "
                  "numbers are no ceiling")
        if found is not None and planned is not None and found > planned:
            print(f"WARNING: at k={k} resident requests found {found:.0f} prompt tokens in "
                  f"vLLM's prefix cache, more than kv's {planned:.0f} (preamble + facts): they "
                  "compute fewer tokens than kv, so their numbers are above the ceiling")
    name = f"ttft-{args.model}{('-' + args.tag) if args.tag else ''}"
    path = write_record(name, record)
    print(f"wrote {path}")
    if args.plot:
        print(f"wrote {plot(record, path.with_suffix('.png'))}")
    return record


def paired_ratio(numerators: list[float], denominators: list[float]) -> dict[str, float]:
    """Median (and quartiles, and the median's bootstrap 95% interval) over rounds of each
    round's ratio: the modes of a round run back to back on the same fact set, so drift between
    rounds (clocks, a noisy host) cancels."""
    ratios = sorted(a / b for a, b in zip(numerators, denominators, strict=True))
    quartile = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    low, high = median_interval(ratios)
    return {"median": statistics.median(ratios), "p25": quartile[0], "p75": quartile[2],
            "ci95_low": low, "ci95_high": high, "n": len(ratios)}


def _print_table(summary: dict, modes: list[str]) -> None:
    print("\n| k | " + " | ".join(f"{m} ms" for m in modes)
          + " | text/kv | kv/resident | kv/resident paired (p25-p75) [median's 95% interval] |")
    print("|---" * (len(modes) + 4) + "|")
    for k, e in summary.items():
        cells = [f"{e[m]['median_ms']:.2f}" for m in modes]
        ratio = f"{e.get('speedup_text_over_kv', float('nan')):.2f}"
        res = f"{e.get('kv_over_resident', float('nan')):.2f}"
        paired = e.get("kv_over_resident_paired")
        pair = (f"{paired['median']:.2f} ({paired['p25']:.2f}-{paired['p75']:.2f}) "
                f"[{paired['ci95_low']:.3f}-{paired['ci95_high']:.3f}]" if paired else "-")
        print(f"| {k} | " + " | ".join(cells) + f" | {ratio} | {res} | {pair} |")


def plot(record: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = record["summary"]
    ks = sorted(int(k) for k in summary)
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in record["config"]["modes"].split(","):
        ax.plot(ks, [summary[k if k in summary else str(k)][mode]["median_ms"] for k in ks],
                marker="o", label=mode)
    env = record["environment"]
    ax.set_xlabel("k (facts per request)")
    ax.set_ylabel("TTFT, median ms")
    ax.set_title(f"{record['config']['model']} on {env.get('gpu') or env.get('cpu')}",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


if __name__ == "__main__":
    main()
