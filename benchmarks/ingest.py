"""Ingest: facts per second encoded into the KV slab, with Context-Window Encoding W in {0, 64}.

Each fact is encoded once by a vLLM "save" request [preamble][<= W context tokens][fact]
(max_tokens=1), batched; only the fact's KV is kept. W=0 encodes facts alone; W=64 puts up to 64
tokens of the preceding conversation (here: the previous facts) before each fact.

  python benchmarks/ingest.py --model tiny --facts 2000 --windows 0,64
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
    parser.add_argument("--windows", default="0,64")
    parser.add_argument("--fact-tokens", type=int, default=30)
    parser.add_argument("--batch", type=int, default=256, help="facts per add_facts call")
    parser.add_argument("--slab-mib", type=int, default=1024)
    parser.add_argument("--kv-cache-gib", type=float, default=None)
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)

    from inferscale_engine import Engine, EngineConfig
    from inferscale_engine.prompt import FACT_FORMAT

    model, dtype, load_format = resolve_model(args.model)
    windows = [int(w) for w in args.windows.split(",")]
    config = EngineConfig(
        model=model, dtype=dtype, load_format=load_format, max_model_len=2048,
        slab_capacity_bytes=args.slab_mib * 2**20, context_window_tokens=max(windows),
        kv_cache_memory_bytes=int(args.kv_cache_gib * 2**30) if args.kv_cache_gib else None,
        save_batch_size=args.batch)
    results = {}
    with Engine(config) as engine:
        facts = synthetic_texts(engine.tokenizer, args.facts, args.fact_tokens, seed=3)
        contexts = [None] + ["".join(FACT_FORMAT.format(text=f) for f in facts[max(0, i - 4):i])
                             for i in range(1, len(facts))]
        engine.add_facts("warmup", facts[:32], contexts[:32], window=max(windows))
        for window in windows:
            start = time.perf_counter()
            for lo in range(0, len(facts), args.batch):
                engine.add_facts(f"w{window}", facts[lo:lo + args.batch],
                                 contexts[lo:lo + args.batch], window=window)
            seconds = time.perf_counter() - start
            results[window] = {"facts": len(facts), "seconds": seconds,
                               "facts_per_s": len(facts) / seconds}
            print(f"W={window:3d}: {len(facts)} facts in {seconds:.2f} s = "
                  f"{len(facts) / seconds:.1f} facts/s", flush=True)
            user_facts = engine.get_facts(f"w{window}")
            engine.delete(f"w{window}", [f.fact_id for f in user_facts])
        stats = engine.stats()
    record = {"benchmark": "ingest", "config": vars(args), "environment": environment(),
              "results": results, "engine_counters": stats.counters}
    path = write_record(f"ingest-{args.model}{('-' + args.tag) if args.tag else ''}", record)
    print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
