"""TTFT through `inferscale serve` (HTTP, streamed) vs in-process, same facts, same run.

A server child process (vLLM's OpenAI server with the memory; its EngineCore runs in a process
of its own) and an in-process Memory over vllm.LLM run side by side on one device. Timed
question i goes to user i, who holds k facts drawn from a pool: retrieval with k returns all
of them whatever the embedder (the GPU has only a random-init MiniLM), and every request
injects a fact set of its own, as in ttft.py. Per question, in a shuffled order:
  http-kv      streamed chat completion, memory.k = k (retrieval, prompt, injection, SSE)
  http-text    streamed chat completion, memory off, the same facts pasted in the system
               message (serving text-RAG through plain vLLM)
  memory-kv    Memory.generate(k): retrieval + injection in-process (the server's work)
  engine-kv    Engine.generate(handle) with the handle retrieved beforehand (ttft.py's kv),
               on a twin user holding the same facts (memory-kv's prompt is prefix-cached)
  engine-text  Engine.generate(handle, mode="text") (ttft.py's text)
TTFT over HTTP: request sent -> first SSE chunk with a choice (vLLM sends none before the first
token). In-process: wall time of a max_tokens=1 request. The server's own overhead is http-kv
- memory-kv (also per question, paired). Nothing here asserts anything about speed.

  python benchmarks/server_ttft.py --model llama-3.1-8b --embedder /tmp/minilm   # H200
  python benchmarks/server_ttft.py --model tiny --k 10 --requests 2 --warmup 1    # CPU smoke
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (  # noqa: E402
    add_serving_arguments,
    compilation_overrides,
    environment,
    resolve_model,
    summarize,
    synthetic_texts,
    write_record,
)

MODES = ("http-kv", "http-text", "memory-kv", "engine-kv", "engine-text")
PAIRS = {"server": ("http-kv", "memory-kv"), "retrieval+memory": ("memory-kv", "engine-kv"),
         "http-text": ("http-text", "engine-text")}
"""Differences reported: name -> (minuend, subtrahend)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_serving_arguments(parser, requests=15, warmup=3)
    parser.add_argument("--pool", type=int, default=300, help="facts to draw fact sets from")
    parser.add_argument("--multiprocessing", action="store_true",
                        help="in-process vLLM EngineCore in its own process (as the server's)")
    parser.add_argument("--detokenize", action="store_true",
                        help="in-process requests detokenize (the server always does)")
    return parser.parse_args(argv)


def start_server(args: argparse.Namespace, folder: str, dtype: str, load_format: str,
                 workdir: Path, gpu: bool) -> Any:
    """`inferscale serve` in a child process, sized like the in-process engine."""
    from tests.server.process import ServerProcess

    sizing = (["--gpu-memory-utilization", str(args.gpu_memory_utilization)] if gpu else
              ["--enforce-eager", "--kv-cache-memory-bytes", str(args.cpu_kv_mib * 2**20)])
    sizing += ["--max-model-len", str(args.max_model_len), "--slab-mib", str(args.slab_mib),
               "--window", str(args.window), "--dtype", dtype, "--load-format", load_format,
               "--embedding-model", args.embedder, "--dedupe-threshold", "none"]
    if compilation := compilation_overrides(args.cudagraph_sizes):
        sizing += ["--compilation-config", json.dumps(compilation["compilation_config"])]
    server = ServerProcess(workdir / "server.db", workdir / "server.log", model=folder,
                           sizing_args=sizing)
    return server.start(timeout_s=900)


def open_memory(args: argparse.Namespace, folder: str, dtype: str, load_format: str,
                gpu: bool) -> Any:
    """The in-process Memory: same model, window, slab and embedder as the server."""
    from inferscale_engine import EngineConfig
    from inferscale_engine.memory import Memory, MemoryConfig

    engine = EngineConfig(
        model=folder, dtype=dtype, load_format=load_format, max_model_len=args.max_model_len,
        slab_capacity_bytes=args.slab_mib * 2**20, context_window_tokens=args.window,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory_bytes=None if gpu else args.cpu_kv_mib * 2**20,
        multiprocessing=args.multiprocessing,
        vllm_overrides={"disable_log_stats": False, **compilation_overrides(args.cudagraph_sizes)})
    return Memory.from_config(MemoryConfig(engine=engine, db_path=":memory:",
                                           embedding_model=args.embedder,
                                           dedupe_threshold=None))


def stream_chat(http: Any, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(ms to the first SSE chunk with a choice, what the response said it served)."""
    start = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] = {}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"chat {response.status_code}: {response.read()[:300]!r}")
        for line in response.iter_lines():
            if first is None and line.startswith("data: {") and '"choices":[{' in line:
                first = time.perf_counter()
            if line == "data: [DONE]":
                break
            if line.startswith("data: {") and '"usage":{' in line:
                usage = json.loads(line[6:]).get("usage") or usage
        headers = response.headers
    if first is None:
        raise RuntimeError("the stream ended without a chunk carrying a choice")
    return (first - start) * 1e3, {
        "prompt_tokens": usage.get("prompt_tokens"),
        "injected_tokens": int(headers.get("x-inferscale-injected-tokens", 0)),
        "facts": int(headers.get("x-inferscale-facts", 0)),
        "server_timing": parse_server_timing(headers.get("server-timing", ""))}


def parse_server_timing(value: str) -> dict[str, float]:
    """{'retrieve': 3.1, ...} from 'retrieve;dur=3.1, plan;dur=0.8' (ms)."""
    out = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        name, _, rest = part.partition(";dur=")
        if rest:
            out[name] = float(rest)
    return out


def add_facts_http(http: Any, user_id: str, texts: list[str]) -> None:
    response = http.post("/v1/memories", json={"user_id": user_id, "texts": texts})
    if response.status_code != 200:
        raise RuntimeError(f"POST /v1/memories {response.status_code}: {response.text[:300]}")
    events = [r["event"] for r in response.json()["results"]]
    if events != ["ADD"] * len(texts):
        raise RuntimeError(f"{user_id}: expected {len(texts)} ADD events, got {events[:8]}")


def server_counters(http: Any) -> dict[str, float]:
    text = http.get("/metrics").text
    return {name: float(value) for name, value in
            re.findall(r"^(inferscale_[a-z_]+) ([0-9.e+-]+)$", text, re.MULTILINE)}


def run(args: argparse.Namespace, http: Any, memory: Any, model_id: str,
        questions: list[str]) -> dict[str, Any]:
    """Interleaved timed requests; per mode the samples (ms) and what each served."""
    from vllm import SamplingParams

    one_token = SamplingParams(max_tokens=1, temperature=0.0, detokenize=args.detokenize)
    rng = random.Random(args.seed + 1)
    raw: dict[str, list[float]] = {m: [] for m in MODES}
    served: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for i, question in enumerate(questions):
        calls = requests_of(args, http, memory, model_id, i, question, one_token)
        order = list(MODES)
        rng.shuffle(order)
        for mode in order:
            elapsed, info = calls[mode]()
            if i >= args.warmup:
                raw[mode].append(elapsed)
                served[mode].append(info)
        row = "  ".join(f"{m}={raw[m][-1]:7.2f}" for m in MODES if raw[m])
        print(f"q{i:3d} {'timed' if i >= args.warmup else 'warm '} {row}", flush=True)
    return {"raw_ms": raw, "served": served}


def requests_of(args: argparse.Namespace, http: Any, memory: Any, model_id: str, i: int,
                question: str, one_token: Any) -> dict[str, Any]:
    """Question i's request in each mode (a call returning ms and what was served)."""
    from inferscale_engine.config import DEFAULT_SYSTEM_PROMPT
    from inferscale_engine.prompting.prompt import FACT_FORMAT

    engine = memory.engine
    user, twin = f"ttft-{i}", f"ttft-{i}-twin"
    found = memory.search(user_id=user, query=question, k=args.k)  # untimed: engine-* modes
    twin_handle = memory.search(user_id=twin, query=question, k=args.k).handle
    facts_text = "".join(FACT_FORMAT.format(text=f.text) for f, _ in found.hits)
    chat = {"model": model_id, "max_tokens": 1, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    return {
        "http-kv": lambda: stream_chat(http, {
            **chat, "user": user, "memory": {"k": args.k},
            "messages": [{"role": "user", "content": question}]}),
        "http-text": lambda: stream_chat(http, {
            **chat, "memory": {"enabled": False},
            "messages": [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT + facts_text},
                         {"role": "user", "content": question}]}),
        "memory-kv": lambda: _timed(lambda: memory.generate(
            user_id=user, query=question, k=args.k, sampling=one_token, mode="kv")),
        "engine-kv": lambda: _timed(lambda: engine.generate(
            twin_handle, question, one_token, mode="kv")),
        "engine-text": lambda: _timed(lambda: engine.generate(
            found.handle, question, one_token, mode="text")),
    }


def _timed(call: Any) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    out = call()
    elapsed = (time.perf_counter() - start) * 1e3
    return elapsed, {"prompt_tokens": out.num_prompt_tokens,
                     "injected_tokens": out.num_injected_tokens, "plan_status": out.plan_status,
                     "fallback": out.fallback}


def summary_of(result: dict[str, Any]) -> dict[str, Any]:
    raw, served = result["raw_ms"], result["served"]
    out: dict[str, Any] = {"modes": {}, "differences_ms": {}}
    for mode in MODES:
        out["modes"][mode] = {
            **summarize(raw[mode]),
            "prompt_tokens": statistics.median(s["prompt_tokens"] or 0 for s in served[mode]),
            "injected_tokens": statistics.median(s["injected_tokens"] for s in served[mode])}
    out["kv_requests_not_injected"] = sum(
        bool(not info["injected_tokens"] or info.get("fallback")) for mode in MODES if "kv" in mode
        for info in served[mode])
    for name, (a, b) in PAIRS.items():
        paired = [x - y for x, y in zip(raw[a], raw[b], strict=True)]
        out["differences_ms"][name] = {
            "of": f"{a} - {b}",
            "median_minus_median": statistics.median(raw[a]) - statistics.median(raw[b]),
            "paired": summarize(paired)}
    return out


def workload(args: argparse.Namespace, pool_size: int
             ) -> tuple[bool, tuple[str, str, str], list[str], list[list[str]]]:
    """(GPU?, the model's folder/dtype/load format, the questions, each question's k facts).

    Fills in args.model ('auto') and args.slab_mib (None) for the device.
    """
    import torch
    from transformers import AutoTokenizer

    gpu = torch.cuda.is_available()
    if args.model == "auto":
        args.model = "llama-3.1-8b" if gpu else "tiny"
    if args.slab_mib is None:
        args.slab_mib = 8192 if gpu else 256
    model = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model[0])
    count = args.warmup + args.requests
    pool = synthetic_texts(tokenizer, max(pool_size, args.k), args.fact_tokens, seed=1)
    questions = synthetic_texts(tokenizer, count, args.question_tokens, seed=2, fmt="{text}")
    rng = random.Random(args.seed)
    return gpu, model, questions, [rng.sample(pool, args.k) for _ in range(count)]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import httpx

    args = parse_args(argv)
    gpu, (folder, dtype, load_format), questions, fact_sets = workload(args, args.pool)
    with tempfile.TemporaryDirectory() as workdir:
        server = start_server(args, folder, dtype, load_format, Path(workdir), gpu)
        memory = None
        try:
            started = time.perf_counter()
            memory = open_memory(args, folder, dtype, load_format, gpu)
            print(f"in-process memory up in {time.perf_counter() - started:.1f} s", flush=True)
            with httpx.Client(base_url=server.base_url, timeout=300) as http:
                model_id = http.get("/v1/models").json()["data"][0]["id"]
                started = time.perf_counter()
                for i, facts in enumerate(fact_sets):
                    add_facts_http(http, f"ttft-{i}", facts)
                    for user in (f"ttft-{i}", f"ttft-{i}-twin"):
                        memory.add(user_id=user, texts=facts)
                print(f"added {len(fact_sets)} x {args.k} facts (server) and twice that "
                      f"in-process in {time.perf_counter() - started:.1f} s", flush=True)
                before = server_counters(http)
                result = run(args, http, memory, model_id, questions)
                after = server_counters(http)
            stats = memory.engine.stats().workers
        finally:
            if memory is not None:
                memory.close()
            server.stop()
    summary = summary_of(result)
    record = {"benchmark": "server_ttft", "config": {**vars(args), "model_folder": folder,
                                                     "dtype": dtype, "load_format": load_format},
              "environment": environment(), "summary": summary, **result,
              "server_counters_after": after,
              "server_counters_delta": {k: v - before.get(k, 0) for k, v in after.items()},
              "in_process_engine_stats": stats}
    _print_table(summary)
    path = write_record(f"server_ttft-{args.model}" + (f"-{args.tag}" if args.tag else ""),
                        record)
    print(f"wrote {path}")
    return record


def _print_table(summary: dict[str, Any]) -> None:
    print("\n| mode | median ms | p90 ms | prompt tokens | injected tokens |")
    print("|---|---|---|---|---|")
    for mode, s in summary["modes"].items():
        print(f"| {mode} | {s['median_ms']:.2f} | {s['p90_ms']:.2f} | {s['prompt_tokens']:.0f} "
              f"| {s['injected_tokens']:.0f} |")
    if summary["kv_requests_not_injected"]:
        print(f"WARNING: {summary['kv_requests_not_injected']} kv requests were not served "
              "from injected KV (slab too small? see `served`)")
    for name, d in summary["differences_ms"].items():
        print(f"{name} ({d['of']}): {d['median_minus_median']:+.2f} ms between medians, paired "
              f"median {d['paired']['median_ms']:+.2f} ms, p90 {d['paired']['p90_ms']:+.2f} ms")


if __name__ == "__main__":
    main()
