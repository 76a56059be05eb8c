"""Memory operations: add throughput and search latency at 1k / 10k / 100k (/ 1M) facts.

For each size, a fresh Memory (new SQLite file, same engine) receives that many facts for one
user through Memory.add() in batches, timed end to end: validation, tokenization, embedding,
the SQLite transaction, engine registration and (if on) KV encoding by the model. Then
Memory.search() (query embedding + cosine top-k over the user's N facts) is timed per query.

On 2 shared CPU cores the real embedder (all-MiniLM-L6-v2) manages ~50-300 texts/s, so sizes
above --real-embed-up-to use seeded random unit vectors instead (same dimension: the index work
is identical) while every QUERY still goes through the real embedder, so search latency is end to
end (query embedding + top-k); the model's own rates are measured once on a sample and reported
beside the table: add with real embeddings ~= 1 / (1/add + 1/embed).
--device cuda puts the embedder and the per-user index on the GPU (the H200 run: 1M facts).
Sizes above --encode-up-to register facts without KV (built on first use); say which in the
record. Nothing here asserts anything about speed.

  python benchmarks/memory_ops.py --model tiny --sizes 1000,10000,100000
  python benchmarks/memory_ops.py --model tiny --device cuda --sizes 1000000 --k 50 \
      --embedder /tmp/minilm --batch 20000 --skip-encode      # H200
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import environment, resolve_model, summarize, write_record  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--batch", type=int, default=500, help="facts per add() call")
    parser.add_argument("--encode-up-to", type=int, default=10_000,
                        help="larger sizes skip KV encoding on add (registration only)")
    parser.add_argument("--skip-encode", action="store_true", help="no KV encoding at all")
    parser.add_argument("--real-embed-up-to", type=int, default=10_000,
                        help="larger sizes use random unit vectors instead of the embedder")
    parser.add_argument("--embedder", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--dedupe-threshold", default="none",
                        help="'none' (default: the synthetic facts differ by a number, which "
                             "MiniLM rates as near-duplicates) or a cosine in (0, 1]")
    parser.add_argument("--device", default="cpu",
                        help="where the embedder and the index live: cpu, cuda")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--slab-mib", type=int, default=1024)
    parser.add_argument("--tag", default="")
    return parser.parse_args(argv)


def fact_texts(count: int) -> list[str]:
    """Distinct short facts (about 12 tokens with the tiny tokenizer: one slab page)."""
    from tests.tiny_model import _NAMES, _THINGS, _VERBS

    return [f"{_NAMES[n % 10]} {_VERBS[n // 10 % 8]} {_THINGS[n // 80 % 15]} #{n}."
            for n in range(count)]


def query_texts(count: int) -> list[str]:
    from tests.tiny_model import _NAMES, _THINGS

    return [f"What does {_NAMES[i % 10]} think about {_THINGS[i % 15]}?" for i in range(count)]


def random_fact_embedder(model: str, device: str):
    """An Embedder whose fact vectors (calls with several texts) are seeded random unit vectors
    (no model cost; the index work is the same) and whose queries (one text) go through the
    real model, so search latency stays end to end."""
    import torch

    from inferscale_engine.memory.search.embedder import Embedder

    class RandomFactEmbedder(Embedder):
        def __init__(self) -> None:
            super().__init__(model, device=device)
            self._generator = torch.Generator().manual_seed(0)

        @property
        def name(self) -> str:
            return f"random-facts+{model}-queries"

        def encode(self, texts):
            if len(texts) == 1:
                return super().encode(texts)
            vectors = torch.randn(len(texts), self.dim, generator=self._generator)
            return torch.nn.functional.normalize(vectors, dim=-1).to(self.device)

    return RandomFactEmbedder()


def embedder_rates(embedder, texts: list[str], queries: list[str]) -> dict[str, float]:
    """The real embedder alone: facts/s on a batch, and single-query latency."""
    embedder.encode(texts[:64])  # load and warm up
    start = time.perf_counter()
    embedder.encode(texts)
    facts_per_s = len(texts) / (time.perf_counter() - start)
    latencies = []
    for query in queries:
        start = time.perf_counter()
        embedder.encode([query])
        latencies.append((time.perf_counter() - start) * 1e3)
    return {"embed_facts_per_s": facts_per_s, "num_texts": len(texts),
            "query_embed": summarize(latencies)}


def run_size(engine, embedder, size: int, encode: bool, args, db: str) -> dict:
    from inferscale_engine.memory import Memory

    threshold = None if args.dedupe_threshold == "none" else float(args.dedupe_threshold)
    texts, queries = fact_texts(size), query_texts(args.queries)
    with Memory(engine, db, embedder, dedupe_threshold=threshold, encode_on_add=encode,
                progress_bar=False, device=args.device) as memory:
        encoded_before = engine.counters["encoded_facts"]
        call_ms = []
        start = time.perf_counter()
        for lo in range(0, size, args.batch):
            t0 = time.perf_counter()
            memory.add(user_id="bench", texts=texts[lo:lo + args.batch])
            call_ms.append((time.perf_counter() - t0) * 1e3)
        add_s = time.perf_counter() - start
        stats = memory.stats()
        search_ms = []
        for query in queries:
            t0 = time.perf_counter()
            found = memory.search(user_id="bench", query=query, k=args.k)
            search_ms.append((time.perf_counter() - t0) * 1e3)
            assert len(found.hits) == min(args.k, size)
    return {
        "num_facts": size, "kv_encoded_on_add": encode, "embedder": embedder.name,
        "add_seconds": add_s, "add_facts_per_s": size / add_s, "add_call_ms": summarize(call_ms),
        "facts_stored": stats.num_facts, "facts_resident": stats.num_resident,
        "facts_kv_encoded": engine.counters["encoded_facts"] - encoded_before,
        "search": summarize(search_ms), "device": args.device,
    }


def main(argv: list[str] | None = None) -> dict:
    from inferscale_engine import Engine, EngineConfig
    from inferscale_engine.memory.search.embedder import Embedder

    args = parse_args(argv)
    load_before = os.getloadavg()  # other jobs on a shared machine slow every number down
    sizes = sorted(int(s) for s in args.sizes.split(","))
    model, dtype, load_format = resolve_model(args.model)
    config = EngineConfig(model=model, dtype=dtype, load_format=load_format, max_model_len=1024,
                          slab_capacity_bytes=args.slab_mib * 2**20, context_window_tokens=0,
                          max_fact_tokens=64, enforce_eager=True)
    env = environment()
    env["cpu_affinity"] = sorted(os.sched_getaffinity(0))
    env["threads"] = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS",
                                                     "VLLM_CPU_OMP_THREADS_BIND")}
    env["sentence_transformers"] = _version("sentence-transformers")
    engine_settings = {f: getattr(config, f) for f in (
        "model", "dtype", "max_model_len", "slab_capacity_bytes", "save_batch_size",
        "max_fact_tokens", "context_window_tokens")}
    print(f"machine/versions: {json.dumps(env)}\nsettings: {json.dumps(vars(args))}\n"
          f"engine: {json.dumps(engine_settings)}", flush=True)
    engine = Engine(config)
    embedder = Embedder(args.embedder, device=args.device)
    rates = embedder_rates(embedder, fact_texts(2000), query_texts(args.queries))
    print(f"embedder alone: {rates['embed_facts_per_s']:.0f} facts/s, query "
          f"{rates['query_embed']['median_ms']:.1f} ms (median)", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        run_size(engine, embedder, 256, True, args, f"{tmp}/warmup.db")  # vLLM and caches warm
        for size in sizes:
            encode = not args.skip_encode and size <= args.encode_up_to
            sized = embedder if size <= args.real_embed_up_to else random_fact_embedder(
                args.embedder, args.device)
            row = run_size(engine, sized, size, encode, args, f"{tmp}/bench-{size}.db")
            rows.append(row)
            print(f"{size:>7} facts: add {row['add_facts_per_s']:8.1f} facts/s "
                  f"(KV {'on' if encode else 'off'}, {sized.name}), search median "
                  f"{row['search']['median_ms']:.2f} ms p99 {row['search']['p99_ms']:.2f} ms",
                  flush=True)
    engine.close()
    record = {
        "benchmark": "memory_ops", "config": vars(args),
        "engine_config": engine_settings,
        "environment": env, "load_average_before_after": [load_before,
                                                                     os.getloadavg()],
        "embedder_alone": rates, "results": rows,
    }
    _print_table(rows, rates)
    path = write_record(f"memory_ops-{args.model}{('-' + args.tag) if args.tag else ''}", record)
    print(f"wrote {path}")
    return record


def _print_table(rows: list[dict], rates: dict) -> None:
    print("\n| facts | KV on add | embedder | add facts/s | search median ms | search p90 ms "
          "| search p99 ms |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['num_facts']:,} | {'yes' if row['kv_encoded_on_add'] else 'no'} | "
              f"{row['embedder']} | {row['add_facts_per_s']:.1f} | "
              f"{row['search']['median_ms']:.2f} | {row['search']['p90_ms']:.2f} | "
              f"{row['search']['p99_ms']:.2f} |")
    print(f"\nembedder alone: {rates['embed_facts_per_s']:.0f} facts/s; one query "
          f"{rates['query_embed']['median_ms']:.1f} ms median, "
          f"{rates['query_embed']['p90_ms']:.1f} ms p90")


def _version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
