"""Where a search's time goes: query embedding and top-k over one user's N facts, phase by phase.

Memory.search is a query embedding (Embedder.encode: tokenize, then a CUDA-graph replay of the
embedding model) and a top-k over the user's index (UserIndex.search: one matmul over all rows,
top-k, one transfer). Per query, in rounds that interleave the index's scan modes (float32 rows;
float16 copies re-ranked in float32), this times with the device synchronized between phases:

  preprocess   the embedding model's preprocess (host only)
  tokenize     the query path's tokenizer (a copy of the Rust tokenizer when it matches)
  embed        Embedder.encode until its vector is on the device
  search       UserIndex.search of a ready query vector (ends with its one transfer)
  end_to_end   encode then search with no sync in between (Memory.search's work)

and the device time of a bare float16 matmul + top-k over the same rows (a floor). Then
torch.profiler over a few end-to-end queries at the largest N: the tops by self device time and
by self CPU time. Index rows are seeded random unit vectors (the scan's cost does not depend on
their values); queries go through the real embedder.

  python benchmarks/gpu/search_probe.py --device cuda --sizes 10000,1000000 --embedder /tmp/minilm
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import environment, summarize, write_record  # noqa: E402
from benchmarks.memory_ops import query_texts  # noqa: E402

SCANS = {"float32": 0, "float16": 1}
"""Scan mode -> UserIndex half_scan_min_rows (0: never float16; 1: always)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--embedder", default=None, help="sentence-transformers folder "
                        "(default: the packaged all-MiniLM-L6-v2)")
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--k", type=int, default=50)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--scans", default="float32,float16")
    parser.add_argument("--profiled", type=int, default=20, help="profiled queries per scan")
    parser.add_argument("--tag", default="")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    import torch

    from inferscale_engine.memory.config import DEFAULT_EMBEDDING_MODEL
    from inferscale_engine.memory.search.embedder import Embedder
    from inferscale_engine.memory.search.index import UserIndex

    args = parse_args(argv)
    scans = args.scans.split(",")
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    embedder = Embedder(args.embedder or DEFAULT_EMBEDDING_MODEL, device=args.device)
    queries = query_texts(args.queries)
    for query in queries[:20]:
        embedder.encode([query])  # load, capture the graphs of the queries' lengths
    preprocess = embedder._queries._model.preprocess
    tokenize = embedder._queries._tokenize  # the query path's tokenizer (preprocess or faster)
    generator = torch.Generator(device=args.device).manual_seed(0)
    print(f"machine/versions: {environment()}\nsettings: {vars(args)}", flush=True)
    results: dict[str, Any] = {}
    for size in sorted(int(s) for s in args.sizes.split(",")):
        indexes = {scan: UserIndex(embedder.dim, device=args.device,
                                   half_scan_min_rows=SCANS[scan]) for scan in scans}
        for lo in range(0, size, 100_000):
            rows = torch.nn.functional.normalize(torch.randn(
                min(100_000, size - lo), embedder.dim, device=args.device, generator=generator),
                dim=-1)
            for index in indexes.values():
                index.add(list(range(lo, lo + len(rows))), rows)
        vector = embedder.encode([queries[0]])[0]
        for index in indexes.values():
            index.search(vector, args.k)  # warm-up
        timings: dict[str, dict[str, list[float]]] = {
            scan: {p: [] for p in ("preprocess", "tokenize", "embed", "search", "end_to_end")}
            for scan in scans}
        for query in queries:
            for scan, index in indexes.items():
                phases = timings[scan]
                vector = embedder.encode([query])[0]
                calls: dict[str, Callable[[], Any]] = {
                    "preprocess": partial(preprocess, [query]),
                    "tokenize": partial(tokenize, query),
                    "embed": partial(embedder.encode, [query]),
                    "search": partial(index.search, vector, args.k),
                    "end_to_end": partial(_end_to_end, embedder, index, query, args.k)}
                for phase, call in calls.items():
                    phases[phase].append(_timed(sync, call))
        row: dict[str, Any] = {scan: {p: summarize(v) for p, v in phases.items()}
                               for scan, phases in timings.items()}
        if cuda:
            row["bare_fp16_matmul_topk_ms"] = _bare_scan_ms(
                indexes[scans[0]]._embeddings[:size].half(), vector.half(), args.k)
        results[str(size)] = row
        print(f"\n{size} facts, k={args.k}: medians (p99) in ms", flush=True)
        for scan in scans:
            print(f"  {scan:8s} " + "  ".join(
                f"{p} {row[scan][p]['median_ms']:.3f} ({row[scan][p]['p99_ms']:.3f})"
                for p in timings[scan]), flush=True)
        if cuda:
            print(f"  bare float16 matmul + top-k (device): {row['bare_fp16_matmul_topk_ms']:.3f}")
        if size == max(int(s) for s in args.sizes.split(",")) and args.profiled and cuda:
            results["profiles"] = {scan: _profile(embedder, index, queries, args)
                                   for scan, index in indexes.items()}
        del indexes
    record = {"benchmark": "search_probe", "config": vars(args), "environment": environment(),
              "results": results}
    path = write_record(f"search_probe{('-' + args.tag) if args.tag else ''}", record)
    print(f"wrote {path}")
    return record


def _end_to_end(embedder: Any, index: Any, query: str, k: int) -> Any:
    return index.search(embedder.encode([query])[0], k)


def _timed(sync: Callable[[], Any], call: Callable[[], Any]) -> float:
    sync()
    start = time.perf_counter()
    call()
    sync()
    return (time.perf_counter() - start) * 1e3


def _bare_scan_ms(rows: Any, query: Any, k: int) -> float:
    """Device time of rows @ query + top-k (median of 50, CUDA events)."""
    import torch

    times = []
    for _ in range(50):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.topk(rows @ query, k, sorted=False)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _profile(embedder: Any, index: Any, queries: list[str], args: argparse.Namespace) -> dict:
    """Tops by self device time and self CPU time over `profiled` end-to-end queries."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for query in queries[:args.profiled]:
            index.search(embedder.encode([query])[0], args.k)
        torch.cuda.synchronize()
    averages = prof.key_averages()
    tops = {}
    for key in ("self_device_time_total", "self_cpu_time_total"):
        table = averages.table(sort_by=key, row_limit=18, max_name_column_width=60)
        print(f"\n== {index._half is not None and 'float16' or 'float32'} scan, by {key}\n"
              f"{table}", flush=True)
        tops[key] = table
    return tops


if __name__ == "__main__":
    main()
