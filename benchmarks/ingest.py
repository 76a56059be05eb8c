"""Ingest: facts per second encoded into the KV slab, per Context-Window Encoding setting.

Each fact is encoded once by a vLLM "save" request [preamble][<= W context tokens][fact]
(max_tokens=1), batched; only the fact's KV is kept. W=0 encodes facts alone; W=64 puts up to 64
tokens of the preceding conversation (here: the previous facts) before each fact. 'WrR' encodes
the facts of each add_facts call in runs of up to R fact tokens (RunContext): one save request
per run, each fact after the W tokens before its run and the run's facts before it.

  python benchmarks/ingest.py --model tiny --facts 2000 --windows 0,64,64r512,256r512
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import environment, resolve_model, synthetic_texts, write_record  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--facts", type=int, default=2000)
    parser.add_argument("--windows", default="0,64,64r512",
                        help="settings W or WrR, comma separated")
    parser.add_argument("--fact-tokens", type=int, default=30)
    parser.add_argument("--batch", type=int, default=256, help="facts per add_facts call")
    parser.add_argument("--slab-mib", type=int, default=1024)
    parser.add_argument("--kv-cache-gib", type=float, default=None)
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)

    from inferscale_engine import Engine, EngineConfig
    from inferscale_engine.prompting.contexts import run_contexts
    from inferscale_engine.prompting.prompt import FACT_FORMAT

    model, dtype, load_format = resolve_model(args.model)
    settings = [setting.partition("r") for setting in args.windows.split(",")]
    windows = [int(w) for w, _, _ in settings]
    config = EngineConfig(
        model=model, dtype=dtype, load_format=load_format, max_model_len=2048,
        slab_capacity_bytes=args.slab_mib * 2**20, context_window_tokens=max(windows),
        context_run_tokens=max(int(r or 0) for _, _, r in settings),
        kv_cache_memory_bytes=int(args.kv_cache_gib * 2**30) if args.kv_cache_gib else None,
        save_batch_size=args.batch)
    results = {}
    with Engine(config) as engine:
        facts = synthetic_texts(engine.tokenizer, args.facts, args.fact_tokens, seed=3)
        contexts = [None] + ["".join(FACT_FORMAT.format(text=f) for f in facts[max(0, i - 4):i])
                             for i in range(1, len(facts))]
        engine.add_facts("warmup", facts[:32], contexts[:32], window=max(windows))
        lengths = [len(engine.tokenize_fact(f)) for f in facts]
        for (_, _, r), window in zip(settings, windows, strict=True):
            name, run = f"w{window}" + (f"r{r}" if r else ""), int(r or 0)
            requests = engine.stats().counters.get("save_requests", 0)
            start = time.perf_counter()
            for lo in range(0, len(facts), args.batch):
                batch = slice(lo, lo + args.batch)
                ctx = run_contexts(facts[max(0, lo - 8):lo], facts[batch], lengths[batch],
                                   run_tokens=run, lead_facts=8) if run else contexts[batch]
                engine.add_facts(name, facts[batch], ctx, window=window)
            seconds = time.perf_counter() - start
            requests = engine.stats().counters.get("save_requests", 0) - requests
            results[name] = {"window": window, "run_tokens": run, "facts": len(facts),
                             "seconds": seconds, "facts_per_s": len(facts) / seconds,
                             "save_requests": requests}
            print(f"{name:>9}: {len(facts)} facts in {seconds:.2f} s = "
                  f"{len(facts) / seconds:.1f} facts/s ({requests} save requests)", flush=True)
            user_facts = engine.get_facts(name)
            engine.delete(name, [f.fact_id for f in user_facts])
        stats = engine.stats()
    record = {"benchmark": "ingest", "config": vars(args), "environment": environment(),
              "results": results, "engine_counters": stats.counters}
    path = write_record(f"ingest-{args.model}{('-' + args.tag) if args.tag else ''}", record)
    print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
