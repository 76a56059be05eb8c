"""Answer quality on LoCoMo with a real model: facts as text vs injected KV, per category.

Per conversation, the facts (`observation` facts or raw turns, dated) go into one user's memory
once per context window W (Context-Window Encoding: each fact encoded after <= W tokens of its
context, see locomo_data.py). Each question of categories 1-4 retrieves k facts (all-MiniLM-L6-v2
cosine top-k over the conversation's facts), put in the prompt in chronological order, not score
order. The SAME facts and token ids are then answered in several modes:
  text      facts prefilled as text (the baseline)
  kv-wW     facts' stored KV (encoded with window W) injected; kv = W=64, kv-naive = W=0
Greedy decoding, short answers. Metrics (locomo_metrics.py): LoCoMo token F1 and EM, KL(text ||
kv) of the first answer token from top-N log-probs, evidence recall of the retrieved facts.

Resumable: per-question records are appended to a JSONL file (default name from the settings);
a rerun skips questions already there. The summary JSON goes through common.write_record.

  python benchmarks/locomo.py --conversations conv-26 --max-questions 20 --k 20
  python benchmarks/locomo.py --windows 0,32,64,128 --max-questions 40 --tag ablation
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import RESULTS_DIR, environment, resolve_model, write_record  # noqa: E402
from benchmarks.locomo_data import (  # noqa: E402
    CATEGORIES,
    DEFAULT_DATA,
    Conversation,
    Question,
    load_conversations,
)
from benchmarks.locomo_metrics import (  # noqa: E402
    exact_match,
    first_token_kl,
    locomo_f1,
    markdown_table,
    summarize_records,
    top_n_mass,
)

SYSTEM_PROMPT = (
    "You answer questions about a long conversation between two people, using memories taken "
    "from it. Each memory starts with the date of the conversation it comes from. Answer with a "
    "short phrase of a few words, using exact words from the memories whenever possible. Do not "
    "explain and do not repeat the question.\nMemory:\n")
"""With Qwen2.5's chat template the preamble is 64 tokens: two whole 32-token KV blocks
(--block-size 32), so every save request and text prompt reuses it from vLLM's prefix cache."""
CATEGORY_HINTS = {2: " Use the dates of the memories to answer with an approximate date."}
"""Appended to the question (LoCoMo's own evaluation adds a date hint to category 2)."""
RESULT_KEYS = ("model", "dtype", "facts", "context", "windows", "k", "max_tokens", "logprobs",
               "hints", "system_prompt", "embedder")
"""Settings a question's result depends on: a results file only holds one combination."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="locomo10.json")
    parser.add_argument("--model", default="small", help="small | tiny | a model folder")
    parser.add_argument("--dtype", default="float32", help="float32 on CPU (bf16 is emulated)")
    parser.add_argument("--facts", default="observation", choices=("observation", "turns"))
    parser.add_argument("--context", default="memory", choices=("memory", "dialogue"),
                        help="what a fact is encoded after (see locomo_data.py)")
    parser.add_argument("--windows", default="64,0", help="W of each kv mode (kv-wW)")
    parser.add_argument("--k", type=int, default=20, help="facts retrieved per question")
    parser.add_argument("--conversations", default="all",
                        help="'all' or comma-separated sample ids (conv-26) or indices (0-9)")
    parser.add_argument("--categories", default="1,2,3,4")
    parser.add_argument("--max-questions", type=int, default=0,
                        help="per conversation: a seeded sample of this many (0 = all)")
    parser.add_argument("--seed", type=int, default=0)
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
    parser.add_argument("--summarize-only", action="store_true", help="no model: tables only")
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    args.windows = [int(w) for w in args.windows.split(",")]
    args.categories = [int(c) for c in args.categories.split(",")]
    if not args.windows or any(w < 0 for w in args.windows) or len(set(args.windows)) < len(
            args.windows):
        parser.error("--windows takes distinct integers >= 0, e.g. 64,0")
    if not set(args.categories) <= set(CATEGORIES):
        parser.error(f"--categories must be a subset of {CATEGORIES} (5 has no answers)")
    args.system_prompt = SYSTEM_PROMPT
    return args


def kv_mode(window: int) -> str:
    return f"kv-w{window}"


def mode_labels(windows: list[int]) -> dict[str, str]:
    """Table names: W=64 is 'kv', W=0 is 'kv-naive' (the issue's names), others 'kv-wW'."""
    return {kv_mode(w): {64: "kv", 0: "kv-naive"}.get(w, kv_mode(w)) for w in windows}


def default_out(args: argparse.Namespace) -> Path:
    results = Path(os.environ.get("INFERSCALE_RESULTS", RESULTS_DIR))
    name = f"locomo-{args.facts}-{args.context}-k{args.k}{('-' + args.tag) if args.tag else ''}"
    return results / f"{name}.jsonl"


def select_questions(conversations: list[Conversation], args: argparse.Namespace
                     ) -> list[tuple[Conversation, list[Question]]]:
    """The chosen conversations, each with its sampled questions in dataset order."""
    if args.conversations != "all":
        wanted = args.conversations.split(",")
        by_id = {c.sample_id: c for c in conversations}
        chosen = [conversations[int(w)] if w.isdigit() else by_id[w] for w in wanted]
    else:
        chosen = conversations
    out = []
    for conv in chosen:
        questions = [q for q in conv.questions if q.category in args.categories]
        if 0 < args.max_questions < len(questions):
            rng = random.Random(f"{args.seed}/{conv.sample_id}")
            questions = sorted(rng.sample(questions, args.max_questions), key=lambda q: q.index)
        out.append((conv, questions))
    return out


def read_results(path: Path, args: argparse.Namespace) -> tuple[dict, list[dict]]:
    """Question records already in `path` by (conversation, index), and ingest records.

    Raises:
        SystemExit: the file was written with other settings (RESULT_KEYS).
    """
    questions: dict = {}
    ingests: list[dict] = []
    if not path.exists():
        return questions, ingests
    with path.open() as lines:
        for line in lines:
            record = json.loads(line)
            if record["type"] == "config":
                theirs = {k: record["config"].get(k) for k in RESULT_KEYS}
                ours = {k: getattr(args, k) for k in RESULT_KEYS}
                if theirs != ours:
                    diff = {k: (theirs[k], ours[k]) for k in RESULT_KEYS if theirs[k] != ours[k]}
                    raise SystemExit(f"{path} holds results of other settings {diff}; pass "
                                     "another --out or --tag")
            elif record["type"] == "question":
                questions[(record["conversation"], record["index"])] = record
            elif record["type"] == "ingest":
                ingests.append(record)
    return questions, ingests


def build_engine(args: argparse.Namespace) -> Any:
    from inferscale_engine import Engine, EngineConfig

    model, _, load_format = resolve_model(args.model)
    config = EngineConfig(
        model=model, dtype=args.dtype, load_format=load_format, max_model_len=args.max_model_len,
        context_window_tokens=max(args.windows), system_prompt=SYSTEM_PROMPT,
        block_size=args.block_size, max_fact_tokens=args.max_fact_tokens,
        slab_capacity_bytes=args.slab_mib * 2**20, on_slab_full="error",
        kv_cache_memory_bytes=int(args.kv_cache_gib * 2**30),
        vllm_overrides={"max_logprobs": args.logprobs})
    return Engine(config)


def ingest(engine: Any, conv: Conversation, windows: list[int]) -> tuple[dict, list[dict]]:
    """Add the conversation's facts once per W, each under its own user; fact ids by W."""
    fact_ids, records = {}, []
    texts = [f.text for f in conv.facts]
    for window in windows:
        start = time.perf_counter()
        fact_ids[window] = engine.add_facts(f"{conv.sample_id}/w{window}", texts,
                                            list(conv.contexts), window=window)
        records.append({"type": "ingest", "conversation": conv.sample_id, "window": window,
                        "num_facts": len(texts), "seconds": time.perf_counter() - start})
    return fact_ids, records


def retrieve(embedder: Any, conv: Conversation, questions: list[Question], k: int
             ) -> list[list[int]]:
    """Per question, the positions of its top-k facts, sorted chronologically."""
    from inferscale_engine.retrieval import UserIndex

    index = UserIndex(embedder.dim)
    index.add(list(range(len(conv.facts))), embedder.encode([f.retrieval_text
                                                             for f in conv.facts]))
    vectors = embedder.encode([q.question for q in questions])
    return [sorted(int(fid) for fid, _ in index.search(vectors[i], k))
            for i in range(len(questions))]


def evidence_recall(conv: Conversation, positions: list[int], question: Question
                    ) -> float | None:
    if not question.evidence:
        return None
    covered = {s for p in positions for s in conv.facts[p].source_ids}
    return sum(e in covered for e in question.evidence) / len(question.evidence)


def _mode_result(out: Any, question: Question) -> dict:
    answer = out.text.strip().split("\n")[0].strip()
    return {"answer": answer, "raw": out.text, "f1": locomo_f1(answer, question.answer,
                                                               question.category),
            "em": exact_match(answer, question.answer, question.category),
            "first_token": out.token_ids[0] if out.token_ids else None,
            "top_n_mass": top_n_mass(out.first_token_logprobs),
            "first_token_logprobs": [[t, round(lp, 6)]
                                     for t, lp in out.first_token_logprobs.items()],
            "num_prompt_tokens": out.num_prompt_tokens,
            "num_injected_tokens": out.num_injected_tokens, "plan_status": out.plan_status}


def answer_batch(engine: Any, conv: Conversation, batch: list[Question], positions: list[list[int]],
                 fact_ids: dict, args: argparse.Namespace) -> list[dict]:
    """Answer a batch of questions in text mode and every kv mode; one record per question."""
    from vllm import SamplingParams

    from inferscale_engine import MemoryHandle

    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0,
                              logprobs=args.logprobs)
    messages = [q.question + (CATEGORY_HINTS.get(q.category, "") if args.hints else "")
                for q in batch]

    def handles(window: int) -> list[MemoryHandle]:
        return [MemoryHandle(f"{conv.sample_id}/w{window}",
                             tuple(fact_ids[window][p] for p in pos)) for pos in positions]

    start = time.perf_counter()
    text_requests = list(zip(handles(args.windows[0]), messages, strict=True))
    text_outs = engine.generate_many(text_requests, sampling, mode="text")
    text_s = time.perf_counter() - start
    requests = [req for w in args.windows for req in zip(handles(w), messages, strict=True)]
    start = time.perf_counter()
    kv_outs = engine.generate_many(requests, sampling, mode="kv")
    kv_s = time.perf_counter() - start
    records = []
    for i, question in enumerate(batch):
        modes = {"text": _mode_result(text_outs[i], question)}
        for j, window in enumerate(args.windows):
            out = kv_outs[j * len(batch) + i]
            modes[kv_mode(window)] = _mode_result(out, question)
            modes[kv_mode(window)]["kl_vs_text"] = first_token_kl(
                text_outs[i].first_token_logprobs, out.first_token_logprobs)
        records.append({
            "type": "question", "conversation": conv.sample_id, "index": question.index,
            "category": question.category, "question": question.question,
            "gold": question.answer, "evidence": list(question.evidence),
            "retrieved": [conv.facts[p].source_ids for p in positions[i]],
            "recall": evidence_recall(conv, positions[i], question),
            "seconds_per_question": {"text": text_s / len(batch), "kv_all": kv_s / len(batch)},
            "modes": modes})
    return records


def run(args: argparse.Namespace, selection: list, done: dict, out_path: Path) -> None:
    """Answer every selected question not in `done`, appending records to out_path."""
    from tqdm import tqdm

    from inferscale_engine.retrieval import Embedder

    todo = [(conv, [q for q in qs if (conv.sample_id, q.index) not in done])
            for conv, qs in selection]
    todo = [(conv, qs) for conv, qs in todo if qs]
    if not todo:
        return
    engine = build_engine(args)
    embedder = Embedder(args.embedder, device="cpu")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with out_path.open("a") as out:
        out.write(json.dumps({"type": "config", "config": vars(args)}, default=str) + "\n")
        bar = tqdm(total=sum(len(qs) for _, qs in todo), desc="questions")
        try:
            for conv, questions in todo:
                bar.set_postfix_str(f"{conv.sample_id}: encoding {len(conv.facts)} facts")
                fact_ids, ingests = ingest(engine, conv, args.windows)
                for record in ingests:
                    out.write(json.dumps(record) + "\n")
                positions = retrieve(embedder, conv, questions, args.k)
                bar.set_postfix_str(conv.sample_id)
                for lo in range(0, len(questions), args.batch_size):
                    batch = questions[lo:lo + args.batch_size]
                    for record in answer_batch(engine, conv, batch,
                                               positions[lo:lo + args.batch_size], fact_ids, args):
                        out.write(json.dumps(record) + "\n")
                    out.flush()
                    bar.update(len(batch))
                for window in args.windows:
                    engine.delete(f"{conv.sample_id}/w{window}", fact_ids[window])
        finally:
            bar.close()
            engine.close()


def timing(records: list[dict], ingests: list[dict]) -> dict[str, Any]:
    """Mean seconds per question (batched, per mode group) and per fact encoded, by W."""
    out: dict[str, Any] = {}
    if records:
        per_q = [r["seconds_per_question"] for r in records]
        out["text_s_per_question"] = sum(p["text"] for p in per_q) / len(per_q)
        out["kv_all_windows_s_per_question"] = sum(p["kv_all"] for p in per_q) / len(per_q)
    for window in sorted({i["window"] for i in ingests}):
        rows = [i for i in ingests if i["window"] == window]
        out[f"ingest_s_per_fact_w{window}"] = (sum(i["seconds"] for i in rows)
                                               / sum(i["num_facts"] for i in rows))
    return out


def use_all_cores() -> dict[str, str]:
    """vLLM's CPU backend serves on one thread unless told to bind all cores (2x here)."""
    cores = os.cpu_count() or 1
    for name, value in (("VLLM_CPU_OMP_THREADS_BIND", f"0-{cores - 1}"),
                        ("OMP_NUM_THREADS", str(cores))):
        os.environ.setdefault(name, value)
    return {n: os.environ[n] for n in ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS")}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    threads_env = use_all_cores()
    selection = select_questions(load_conversations(args.data, args.facts, args.context), args)
    out_path = args.out or default_out(args)
    done, _ = read_results(out_path, args)
    if not args.summarize_only:
        run(args, selection, done, out_path)
        done, _ = read_results(out_path, args)
    _, ingests = read_results(out_path, args)
    wanted = {(conv.sample_id, q.index) for conv, qs in selection for q in qs}
    records = [r for key, r in done.items() if key in wanted]
    kv_modes = [kv_mode(w) for w in args.windows]
    summary = summarize_records(records, kv_modes)
    fallbacks = sum(r["modes"][m]["plan_status"] != "inject" for r in records for m in kv_modes)
    table = markdown_table(summary, kv_modes, mode_labels(args.windows))
    from inferscale_engine.small_model import GGUF_SHA256

    record = {"benchmark": "locomo", "config": vars(args), "environment": environment(),
              "model_gguf_sha256": GGUF_SHA256 if args.model == "small" else None,
              "threads_env": threads_env, "results_file": str(out_path),
              "num_questions": len(records),
              "num_conversations": len({r["conversation"] for r in records}),
              "kv_fallbacks": fallbacks, "timing": timing(records, ingests),
              "summary": summary, "table": table}
    print(f"\n{len(records)} questions ({out_path.name}); kv requests not injected: {fallbacks}")
    print(table)
    print(f"wrote {write_record(out_path.stem, record)}")
    return record


if __name__ == "__main__":
    main()
