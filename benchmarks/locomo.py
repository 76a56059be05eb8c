"""Answer quality on LoCoMo with a real model: each arm (text, kv-wW, ...) per category, with
paired-bootstrap intervals against the text arms. The protocol (locomo_protocol.py):
  --split dev    conv-26 and conv-30, every question of categories 1-4: tune here
  --split test   the other eight; a category-stratified seeded sample (--test-questions)
  --conversations conv-26,...   ad-hoc runs (split: null in the record)
Per conversation, each question retrieves k facts (all-MiniLM-L6-v2 cosine top-k; --search-mode
hybrid: Memory's default search, cosine fused with keyword BM25) and every arm
(locomo_arms.py) answers from the SAME facts: text arms prefill them, kv arms inject their KV
encoded with context window W (Context-Window Encoding, locomo_data.py). Greedy decoding, short
answers. Metrics and tables: locomo_report.py. Text answers are cached across runs
(locomo_cache.py), so a new kv arm costs only its own requests.

Resumable: questions and answers are appended to a JSONL file (default name from the model,
split and settings); a rerun asks only the (question, arm) pairs not in it. The summary JSON
goes through common.write_record; --summarize-only rebuilds it from the JSONL without a model.

  python benchmarks/locomo.py --model small --split dev
  python benchmarks/locomo.py --model medium --split test --test-questions 400
  python benchmarks/locomo.py --model small --split dev --arms text,text-user4,kv-w64,kv-w64-user4
  python benchmarks/locomo.py --model small --split dev --search-mode hybrid --tag hybrid
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import RESULTS_DIR, environment, open_text, write_record  # noqa: E402
from benchmarks.locomo_arms import (  # noqa: E402
    DEFAULT_ARMS,
    Arm,
    get_arm,
    parse_arms,
    run_order,
)
from benchmarks.locomo_cache import TextAnswerCache  # noqa: E402
from benchmarks.locomo_data import CATEGORIES, DEFAULT_DATA, load_conversations  # noqa: E402
from benchmarks.locomo_protocol import SPLITS, Selection, select  # noqa: E402
from benchmarks.locomo_report import BOOTSTRAP_RESAMPLES, markdown, summarize, timing  # noqa: E402
from benchmarks.locomo_runner import gguf_sha256, run  # noqa: E402

SYSTEM_PROMPT = (
    "You answer questions about a long conversation between two people, using memories taken "
    "from it. Each memory starts with the date of the conversation it comes from. Answer with a "
    "short phrase of a few words, using exact words from the memories whenever possible. Do not "
    "explain and do not repeat the question.\nMemory:\n")
"""With Qwen2.5's chat template the preamble is 64 tokens: two whole 32-token KV blocks
(--block-size 32), so every save request and text prompt reuses it from vLLM's prefix cache."""
USER_BLOCK_HEADER = "More memories:\n"
"""Header of the repaired facts' block in the user turn (the arms' -userR layouts), worded for
SYSTEM_PROMPT; every dev and test run so far used it (EngineConfig.user_block_header)."""
RESULT_KEYS = ("model", "dtype", "facts", "context", "k", "search_mode", "max_tokens",
               "logprobs", "hints", "system_prompt", "embedder")
"""Settings every answer depends on: a results file holds one combination (arms may differ)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="locomo10.json")
    parser.add_argument("--model", default="small", help="small | medium | tiny | a folder")
    parser.add_argument("--dtype", default="float32", help="float32 on CPU (bf16 is emulated)")
    parser.add_argument("--split", choices=SPLITS, default=None, help="fold (default dev)")
    parser.add_argument("--conversations", default=None,
                        help="ad-hoc instead of --split: 'all' or sample ids / indices, comma-sep")
    parser.add_argument("--test-questions", type=int, default=400,
                        help="test fold: stratified sample size (0 = all 1,307)")
    parser.add_argument("--max-questions", type=int, default=0,
                        help="dev / ad-hoc: a seeded sample of this many per conversation")
    parser.add_argument("--arms", default=None,
                        help=f"comma-separated (default {','.join(DEFAULT_ARMS)}; with "
                             "--summarize-only: every arm in the file); names: "
                             "text[-end|-user R], kv-wW[-end|-user|-also R], e.g. text-user4, "
                             "kv-w64-end2")
    parser.add_argument("--default-mode", default=None,
                        help="the shipped arm, named in the record (default: the first kv arm)")
    parser.add_argument("--facts", default="observation", choices=("observation", "turns"))
    parser.add_argument("--context", default="memory", choices=("memory", "dialogue"),
                        help="what a fact is encoded after (see locomo_data.py)")
    parser.add_argument("--k", type=int, default=20, help="facts retrieved per question")
    parser.add_argument("--search-mode", default="vector",
                        choices=("vector", "hybrid", "hybrid-neighbors", "hybrid-context"),
                        help="how the k facts are found: cosine, or cosine fused with keyword "
                        "BM25 (Memory's default search, search/hybrid.py), and with the facts "
                        "beside the best ones (search/neighbors.py, share 0.3) or keyword "
                        "context (search/lexical.py)")
    parser.add_argument("--categories", default="1,2,3,4")
    parser.add_argument("--seed", type=int, default=0, help="samples and bootstrap")
    parser.add_argument("--bootstrap", type=int, default=BOOTSTRAP_RESAMPLES, help="resamples")
    parser.add_argument("--max-tokens", type=int, default=20)
    parser.add_argument("--logprobs", type=int, default=100, help="N of the top-N first-token KL")
    parser.add_argument("--no-hints", dest="hints", action="store_false")
    parser.add_argument("--batch-size", type=int, default=16, help="questions per vLLM batch")
    parser.add_argument("--block-size", type=int, default=32, help="vLLM KV block (tokens)")
    parser.add_argument("--embedder", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--max-fact-tokens", type=int, default=256)
    parser.add_argument("--slab-mib", type=int, default=2048)
    parser.add_argument("--kv-cache-gib", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=None, help="results JSONL (default: by name)")
    parser.add_argument("--text-cache", type=Path, default=None,
                        help="text-answer cache JSONL (default results/locomo-text-cache.jsonl)")
    parser.add_argument("--no-text-cache", dest="use_text_cache", action="store_false")
    parser.add_argument("--summarize-only", action="store_true", help="no model: tables only")
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    args.categories = [int(c) for c in args.categories.split(",")]
    if not set(args.categories) <= set(CATEGORIES):
        parser.error(f"--categories must be a subset of {CATEGORIES} (5 has no answers)")
    if args.conversations is not None and args.split is not None:
        parser.error("--split and --conversations exclude each other")
    if args.conversations is None:
        args.split = args.split or "dev"
    try:
        args.arm_list = parse_arms(args.arms) if args.arms else (
            None if args.summarize_only else parse_arms(DEFAULT_ARMS))
    except ValueError as error:
        parser.error(str(error))
    args.system_prompt = SYSTEM_PROMPT
    args.user_block_header = USER_BLOCK_HEADER
    return args


def results_dir() -> Path:
    return Path(os.environ.get("INFERSCALE_RESULTS", RESULTS_DIR))


def default_out(args: argparse.Namespace) -> Path:
    fold = args.split or "adhoc"
    model = Path(args.model).name if os.sep in args.model else args.model
    name = (f"locomo-{model}-{fold}-{args.facts}-{args.context}-k{args.k}"
            f"{('-' + args.tag) if args.tag else ''}")
    return results_dir() / f"{name}.jsonl"


@dataclass
class Results:
    """What a results JSONL holds."""

    questions: dict[tuple[str, int], dict] = field(default_factory=dict)
    answers: dict[tuple[str, int], dict[str, dict]] = field(default_factory=dict)
    ingests: list[dict] = field(default_factory=list)
    arm_names: list[str] = field(default_factory=list)
    """Arms in order of first appearance."""


def read_results(path: Path, args: argparse.Namespace) -> Results:
    """Records already in `path`. Files of the one-record-per-question format (before arms were
    pluggable: a 'modes' dict in each question record) are read too.

    Raises:
        SystemExit: the file was written with other settings (RESULT_KEYS).
    """
    out = Results()
    if not path.exists():
        return out
    with open_text(path) as lines:
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a killed run
                continue
            if record["type"] == "config":
                theirs = {k: record["config"].get(k, "vector" if k == "search_mode" else None)
                          for k in RESULT_KEYS}  # files before --search-mode: vector
                ours = {k: getattr(args, k) for k in RESULT_KEYS}
                if theirs != ours:
                    diff = {k: (theirs[k], ours[k]) for k in RESULT_KEYS if theirs[k] != ours[k]}
                    raise SystemExit(f"{path} holds results of other settings {diff}; pass "
                                     "another --out or --tag")
            elif record["type"] == "question":
                key = (record["conversation"], record["index"])
                out.questions[key] = record
                for arm, answer in record.pop("modes", {}).items():
                    out.answers.setdefault(key, {})[arm] = {**answer, "arm": arm,
                                                            "from_cache": False}
            elif record["type"] == "answer":
                out.answers.setdefault((record["conversation"], record["index"]),
                                       {})[record["arm"]] = record
            elif record["type"] == "ingest":
                out.ingests.append(record)
    out.arm_names = list(dict.fromkeys(arm for answers in out.answers.values()
                                       for arm in answers))
    return out


def use_all_cores() -> dict[str, str]:
    """vLLM's CPU backend serves on one thread unless told to bind all cores (2x here)."""
    cores = os.cpu_count() or 1
    for name, value in (("VLLM_CPU_OMP_THREADS_BIND", f"0-{cores - 1}"),
                        ("OMP_NUM_THREADS", str(cores))):
        os.environ.setdefault(name, value)
    return {n: os.environ[n] for n in ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS")}


def report(args: argparse.Namespace, arms: list[Arm], selection: Selection, results: Results,
           out_path: Path, cache: TextAnswerCache | None, threads_env: dict) -> dict:
    """The summary record of the selected questions (what write_record stores)."""
    questions = [results.questions[(conv.sample_id, q.index)] for conv, qs in selection.groups
                 for q in qs if (conv.sample_id, q.index) in results.questions]
    result = summarize(questions, results.answers, arms, seed=args.seed, resamples=args.bootstrap)
    wanted = selection.keys
    answers = [a for key, by_arm in results.answers.items() if key in wanted
               for a in by_arm.values()]
    default_mode = args.default_mode or next((a.name for a in arms if a.kind == "kv"), None)
    if default_mode is not None and default_mode not in {a.name for a in arms}:
        raise SystemExit(f"--default-mode {default_mode} is not one of the arms")
    overall = result["summary"].get("overall", {"n": 0})
    return {
        "benchmark": "locomo", "split": selection.split,
        "conversations": [conv.sample_id for conv, _ in selection.groups],
        "model": args.model, "model_gguf_sha256": gguf_sha256(args.model), "dtype": args.dtype,
        "k": args.k, "arms": [a.describe() for a in arms], "default_mode": default_mode,
        "best_text_mode": result["best_text_mode"], "comparisons": result["comparisons"],
        "config": {k: v for k, v in vars(args).items() if k != "arm_list"},
        "environment": environment(), "threads_env": threads_env,
        "load_average_1_5_15_min": list(os.getloadavg()),  # other jobs skew the timings
        "results_file": str(out_path),
        "text_cache_file": str(cache.path) if cache is not None and cache.path else None,
        "num_questions": overall["n"], "num_selected": selection.num_questions,
        "num_incomplete": result["num_incomplete"],
        "num_conversations": len({q["conversation"] for q in questions}),
        "kv_fallbacks": {a.name: sum(1 for x in answers if x["arm"] == a.name
                                     and x.get("plan_status") != "inject") for a in arms
                         if a.kind == "kv"},
        "text_cache_hits": {a.name: sum(1 for x in answers if x["arm"] == a.name
                                        and x.get("from_cache")) for a in arms
                            if a.kind == "text"},
        "timing": timing(answers, [i for i in results.ingests
                                   if i["conversation"] in {c.sample_id
                                                            for c, _ in selection.groups}]),
        "bootstrap": {"resamples": args.bootstrap, "seed": args.seed, "confidence": 0.95},
        "summary": result["summary"], "table": markdown(result, arms)}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    threads_env = use_all_cores()
    names = None if args.conversations is None else args.conversations.split(",")
    selection = select(load_conversations(args.data, args.facts, args.context),
                       split=args.split, names=names, categories=args.categories,
                       seed=args.seed, max_per_conversation=args.max_questions,
                       test_questions=args.test_questions)
    out_path = args.out or default_out(args)
    results = read_results(out_path, args)
    cache = None
    if not args.summarize_only:
        cache = TextAnswerCache((args.text_cache or results_dir() / "locomo-text-cache.jsonl")
                                if args.use_text_cache else None)
        run(args, args.arm_list, selection, results.answers, set(results.questions), out_path,
            cache)
        results = read_results(out_path, args)
    arms = args.arm_list or run_order(get_arm(n) for n in results.arm_names)
    record = report(args, arms, selection, results, out_path, cache, threads_env)
    print(f"\n{record['num_questions']} of {record['num_selected']} selected questions answered "
          f"by every arm ({out_path.name}); kv fallbacks {record['kv_fallbacks']}; text cache "
          f"hits {record['text_cache_hits']}")
    print(record["table"])
    print(f"wrote {write_record(out_path.name.split('.jsonl')[0], record)}")
    return record


if __name__ == "__main__":
    main()
