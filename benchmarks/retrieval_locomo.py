"""Retrieval on LoCoMo (dev fold; --fold test once): evidence recall of vector vs hybrid; latency.

Recall: each dev conversation's facts (turns by default) are added to one Memory, a user per
conversation, through the public API (Memory.add, Memory.search) with the default embedder
(all-MiniLM-L6-v2); per question with evidence, the share of its evidence turns that the top k
facts come from, averaged, at k = 5, 10, 20. No model runs: the Engine is driven by
tests/fake_runner.py and no KV is encoded (retrieval does not read it). --weights sweeps the
hybrid keyword weight (search/hybrid.py KEYWORD_WEIGHT): the dev fold only (locomo_protocol).
The default search leaves older versions out of questions about now (search/versions.py);
the hybrid mode is also measured without that (hide_older_versions=never), and with --recency
weights (Memory(recency_weight=...), search/recency.py). Facts are added a session at a time
with the session's date as their timestamp.

Latency: one user's RetrievalIndex of N facts (the dev fold's facts, cycled and numbered, their
MiniLM vectors jittered), each mode's ranking (search/retrieval.py ranked) plus the query's
embedding, on --device (the keyword index is SQLite's, on the CPU, whatever the device).
--latency-only skips recall: it needs no model and no vLLM, and any MiniLM (a random-init one
has the real one's cost) through --embedder.

  python benchmarks/retrieval_locomo.py                       # recall + latency
  python benchmarks/retrieval_locomo.py --weights 0.3,0.5,0.7,1.0 --sizes ""
  python benchmarks/retrieval_locomo.py --recency 0.1,0.3,1.0 --sizes ""
  python benchmarks/retrieval_locomo.py --latency-only --sizes 1000,100000,1000000 --device cuda

Writes one JSON record (benchmarks/out by default).
"""

from __future__ import annotations

import argparse
import itertools
import re
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import environment, write_tagged  # noqa: E402
from benchmarks.locomo_data import DEFAULT_DATA, Conversation, load_conversations  # noqa: E402
from benchmarks.locomo_protocol import fold  # noqa: E402

KS = (5, 10, 20)


def recall(memory: Any, conversations: list[Conversation], mode: str,
           versions: str | None = None) -> dict[str, float]:
    """Mean gold-evidence recall at each k of `mode` over the questions with evidence
    (versions: Memory.search's hide_older_versions; None: the default)."""
    per_k: dict[int, list[float]] = {k: [] for k in KS}
    for conv in conversations:
        sources = {r.fact_id: f.source_ids for r, f in conv_facts(memory, conv)}
        for q in conv.questions:
            if not q.evidence:
                continue
            for k in KS:  # one search per k: hybrid's k chosen facts are not a prefix
                hits = memory.search(user_id=conv.sample_id, query=q.question, k=k,
                                     search_mode=mode, hide_older_versions=versions
                                     ).handle.fact_ids
                covered = {s for f in hits for s in sources[f]}
                per_k[k].append(sum(e in covered for e in q.evidence) / len(q.evidence))
    print(f"{mode}: {len(per_k[KS[0]])} questions", flush=True)
    return {f"R@{k}": statistics.mean(v) for k, v in per_k.items()} | {
        "questions": len(per_k[KS[0]])}


_ADDED: dict[str, list[Any]] = {}


def conv_facts(memory: Any, conv: Conversation) -> list[tuple[Any, Any]]:
    """The conversation's facts added (once) as its user's, a session at a time with the
    session's date as their timestamp, with their AddResults."""
    if conv.sample_id not in _ADDED:
        added: list[Any] = []
        for day, group in itertools.groupby(conv.facts, key=session_day):
            added += memory.add(user_id=conv.sample_id, dedupe=False, timestamp=day,
                                texts=[f.retrieval_text for f in group])
        _ADDED[conv.sample_id] = added
    return list(zip(_ADDED[conv.sample_id], conv.facts, strict=True))


def session_day(fact: Any) -> datetime | None:
    """The date a LoCoMo fact's text starts with ('[8 May 2023] ...'), None if none."""
    match = re.match(r"\[(\d{1,2} \w+ \d{4})\]", fact.text)
    return (datetime.strptime(match.group(1), "%d %B %Y").replace(tzinfo=UTC)
            if match else None)


def latency(embedder: Any, texts: list[str], queries: list[str], sizes: list[int],
            repeats: int, device: str = "cpu", postings: tuple[int, ...] = (),
            keyword_context: bool = False) -> dict[str, Any]:
    """Per size and mode, ms per search (query embedding + ranking the top 20); hybrid also
    with each postings budget of `postings` (lexical.MAX_POSTINGS; default: the package's),
    and the keyword query alone (host work the hybrid search overlaps with the vector scan);
    keyword_context: the index built as Memory(keyword_context=True) builds it."""
    import torch

    from inferscale_engine.memory.search import lexical
    from inferscale_engine.memory.search.index import RetrievalIndex

    out: dict[str, Any] = {}
    if not sizes:
        return out
    base = embedder.encode(texts).cpu()
    budgets = postings or (lexical.MAX_POSTINGS,)
    default = lexical.MAX_POSTINGS
    for size in sizes:
        index = RetrievalIndex(device=device,
                               context_facts=lexical.context_facts(keyword_context))
        build = time.perf_counter()
        generator = torch.Generator().manual_seed(0)
        for lo in range(0, size, 4096):
            ids = list(range(lo, min(size, lo + 4096)))
            rows = base[[i % len(texts) for i in ids]]
            rows = rows + 0.01 * torch.randn(rows.shape, generator=generator)
            index.add(user_id="bench", fact_ids=ids, embeddings=rows,
                      texts=[f"{texts[i % len(texts)]} ({i // len(texts)})" for i in ids])
        print(f"{size} facts indexed in {time.perf_counter() - build:.0f} s", flush=True)
        runs = [("vector", default)] + [(m, b) for b in budgets for m in ("hybrid", "keywords")]
        for mode, budget in runs:
            lexical.MAX_POSTINGS = budget
            for query in queries[:5]:  # warm-up (CUDA kernels, caches), not timed
                _one_search(index, embedder, query, mode, device)
            times = []
            for _ in range(repeats):
                for query in queries:
                    start = time.perf_counter()
                    _one_search(index, embedder, query, mode, device)
                    times.append((time.perf_counter() - start) * 1e3)
            times.sort()
            key = f"{size}/{mode}" + (f"/postings{budget}" if mode != "vector" and
                                      budget != default else "")
            out[key] = {"p50_ms": statistics.median(times),
                        "p99_ms": times[min(len(times) - 1, int(0.99 * len(times)))],
                        "mean_ms": statistics.mean(times), "n": len(times),
                        "max_postings": budget}
            print(f"{size} facts, {key}: p50 {out[key]['p50_ms']:.2f} ms", flush=True)
        lexical.MAX_POSTINGS = default
    return out


def _one_search(index: Any, embedder: Any, query: str, mode: str, device: str) -> None:
    """One timed search: vector or hybrid (with the query's embedding), or keywords alone."""
    import torch

    from inferscale_engine.memory.search import hybrid, retrieval

    if mode == "keywords":
        index.keyword_search(user_id="bench", query=query, k=hybrid.KEYWORD_CANDIDATES)
        return
    vector = embedder.encode([query])[0]
    retrieval.ranked(index, "bench", vector, 20, False, query if mode == "hybrid" else None)
    if device != "cpu":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--facts", default="turns", choices=("turns", "observation"))
    parser.add_argument("--fold", default="dev", choices=("dev", "test"),
                        help="test: the held-out conversations, once per chosen setting")
    parser.add_argument("--weights", default="", help="also sweep these hybrid keyword weights")
    parser.add_argument("--recency", default="", help="also measure hybrid search with these "
                        "recency weights (Memory(recency_weight=...), dev fold only)")
    parser.add_argument("--recency-half-life", type=float, default=30.0, help="days")
    parser.add_argument("--neighbors", default="", help="also measure hybrid search with "
                        "these neighbor shares (Memory(neighbor_share=...), search/neighbors.py)")
    parser.add_argument("--keyword-context", action="store_true", help="also measure hybrid "
                        "search with Memory(keyword_context=True) (and with --neighbors)")
    parser.add_argument("--context-facts", type=int, default=None, help="keyword context: "
                        "facts before each (lexical.CONTEXT_FACTS; default the package's)")
    parser.add_argument("--context-weights", default="", help="with --keyword-context, also "
                        "these keyword-context weights (lexical.CONTEXT_WEIGHT; 0: off)")
    parser.add_argument("--sizes", default="1000,100000", help="latency sizes ('' = none)")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--device", default="cpu", help="latency: where the index and the "
                        "query embedder run (cpu, cuda)")
    parser.add_argument("--embedder", default=None, help="default: the offline all-MiniLM-L6-v2")
    parser.add_argument("--latency-only", action="store_true", help="no recall (no model)")
    parser.add_argument("--max-postings", default="", help="latency: also time hybrid search "
                        "with these postings budgets (lexical.MAX_POSTINGS), e.g. 2000,10000")
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    if args.fold == "test" and (args.weights or args.recency or args.context_weights):
        parser.error("--weights, --recency and --context-weights tune on the dev fold only; "
                     "the test fold "
                     "measures the default and --neighbors (the share chosen on dev)")

    import torch

    from inferscale_engine.memory.config import DEFAULT_EMBEDDING_MODEL
    from inferscale_engine.memory.search import hybrid, lexical
    from inferscale_engine.memory.search.embedder import Embedder

    torch.set_num_threads(args.threads)
    if args.context_facts is not None:
        lexical.CONTEXT_FACTS = args.context_facts
    conversations = fold(load_conversations(Path(args.data), facts=args.facts), args.fold)
    results: dict[str, Any] = {"default_weight": hybrid.KEYWORD_WEIGHT,
                               "context_facts": lexical.CONTEXT_FACTS,
                               "context_weight": lexical.CONTEXT_WEIGHT}
    if not args.latency_only:
        recalls(args, conversations, results)
    texts = [f.retrieval_text for c in conversations for f in c.facts]
    queries = [q.question for c in conversations for q in c.questions][:args.queries]
    sizes = [int(s) for s in args.sizes.split(",") if s]
    embedder = Embedder(args.embedder or DEFAULT_EMBEDDING_MODEL, device=args.device)
    record = {"benchmark": "retrieval_locomo", "config": vars(args),
              "environment": environment(), "recall": results,
              "latency": latency(embedder, texts, queries, sizes, args.repeats, args.device,
                                 tuple(int(b) for b in args.max_postings.split(",") if b),
                                 args.keyword_context)}
    write_tagged(f"retrieval-locomo-{args.facts}-{args.fold}", args.tag, record)
    return record


def recalls(args: argparse.Namespace, conversations: list[Conversation],
            results: dict[str, Any]) -> None:
    """Evidence recall of each search setting, into `results`."""
    from inferscale_engine.memory import Memory
    from inferscale_engine.memory.config import DEFAULT_EMBEDDING_MODEL
    from inferscale_engine.memory.search import hybrid, lexical
    from inferscale_engine.memory.search.embedder import Embedder
    from inferscale_engine.runtime.engine import Engine
    from tests.conftest import engine_config
    from tests.fake_runner import FakeRunner
    from tests.tiny_model import TinyModelSpec, tiny_model_path

    embedder = Embedder(args.embedder or DEFAULT_EMBEDDING_MODEL, device="cpu")
    model = tiny_model_path(TinyModelSpec("qwen2"))
    options = dict(dedupe_threshold=None, encode_on_add=False, startup="lazy",
                   progress_bar=False, device="cpu")
    with tempfile.TemporaryDirectory() as tmp, Engine(engine_config(
            model, max_model_len=4096, max_fact_tokens=2048), runner=FakeRunner) as engine:
        with Memory(engine, f"{tmp}/m.db", embedder, **options) as memory:
            results["vector"] = recall(memory, conversations, "vector")
            default = hybrid.KEYWORD_WEIGHT
            for weight in [default] + [float(w) for w in args.weights.split(",") if w]:
                hybrid.KEYWORD_WEIGHT = weight
                results[f"hybrid w={weight}"] = recall(memory, conversations, "hybrid")
            hybrid.KEYWORD_WEIGHT = default
            results["hybrid, hide_older_versions=never"] = recall(memory, conversations,
                                                                  "hybrid", "never")
        for weight in [float(w) for w in args.recency.split(",") if w]:  # the same store
            with Memory(engine, f"{tmp}/m.db", embedder, recency_weight=weight,
                        recency_half_life_days=args.recency_half_life, **options) as memory:
                results[f"hybrid + recency {weight}, half-life {args.recency_half_life:g} d"] = (
                    recall(memory, conversations, "hybrid"))
        for share in [float(s) for s in args.neighbors.split(",") if s]:  # the same store
            with Memory(engine, f"{tmp}/m.db", embedder, neighbor_share=share,
                        **options) as memory:
                results[f"hybrid + neighbors {share:g}"] = recall(memory, conversations,
                                                                  "hybrid")
        if args.keyword_context:  # the same store, its index rebuilt with contexts
            with Memory(engine, f"{tmp}/m.db", embedder, keyword_context=True,
                        **options) as memory:
                results["hybrid + keyword context"] = recall(memory, conversations, "hybrid")
                context = lexical.CONTEXT_WEIGHT
                for weight in [float(w) for w in args.context_weights.split(",") if w]:
                    lexical.CONTEXT_WEIGHT = weight
                    results[f"hybrid + keyword context, weight {weight:g}"] = recall(
                        memory, conversations, "hybrid")
                lexical.CONTEXT_WEIGHT = context
            for share in [float(s) for s in args.neighbors.split(",") if s]:
                with Memory(engine, f"{tmp}/m.db", embedder, keyword_context=True,
                            neighbor_share=share, **options) as memory:
                    results[f"hybrid + keyword context + neighbors {share:g}"] = recall(
                        memory, conversations, "hybrid")
    for name, row in results.items():
        if isinstance(row, dict):
            print(name, " ".join(f"{k} {v:.1%}" for k, v in row.items() if k.startswith("R@")),
                  f"(n={row['questions']})")


if __name__ == "__main__":
    main()
