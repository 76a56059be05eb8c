"""What `inferscale serve` adds to plain `vllm serve`: TTFT over HTTP, paired, one run.

Three servers side by side on one device, the same model and vLLM settings: plain `vllm serve`
(vLLM's own OpenAI server), the same with a KV connector that does nothing
(benchmarks/noop_connector.py: what loading any connector costs vLLM) and `inferscale serve`
(the same server with the memory seam and the KV connector). Question i, in a shuffled mode
order:
  vllm        plain vLLM, the question alone
  noop        plain vLLM with the no-op connector, the question alone
  ours-off    inferscale, memory.enabled=false, the question alone (the seam and connector
              with nothing to serve)
  vllm-text   plain vLLM, the user's k facts pasted in the system message (text RAG)
  ours-text   inferscale, memory off, the same pasted facts
  ours-kv     inferscale, memory.k = k: the user's k facts retrieved and injected as KV
TTFT: request sent -> first streamed chunk carrying a choice. vLLM's connector framework costs
noop - vllm; ours on top of it is ours-off - noop. Our whole share is ours-off - vllm and
ours-text - vllm-text (paired per question); ours-kv - vllm-text is what memory as KV saves
against text RAG on plain vLLM. ours-kv responses carry a Server-Timing header (the seam's own
phases: identify, vllm_render, hop, retrieve, plan, back), reported as medians: where our
share goes. After every timed request the server's vLLM metrics are read (their sums move by
that request alone): vLLM's own TTFT (API process: arrival -> first token), queue and prefill
time (engine core), so each mode's client TTFT splits into before vLLM's arrival (HTTP, the
seam), vLLM's API process, the engine core, and after the first token (streaming it out).
Nothing here asserts anything about speed.

  python benchmarks/serve_overhead.py --model llama-3.1-8b --embedder /tmp/minilm   # H200
  python benchmarks/serve_overhead.py --model tiny --k 10 --requests 4 --warmup 1   # CPU
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common, server_ttft  # noqa: E402

MODES = ("vllm", "noop", "ours-off", "vllm-text", "ours-text", "ours-kv")
PAIRS = {"ours (no memory)": ("ours-off", "vllm"),
         "vLLM's connector framework": ("noop", "vllm"),
         "ours beyond the framework": ("ours-off", "noop"),
         "ours (text prompt)": ("ours-text", "vllm-text"),
         "kv vs text RAG": ("ours-kv", "vllm-text")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_serving_arguments(parser, requests=30, warmup=5)
    return parser.parse_args(argv)


def vllm_args(args: argparse.Namespace, dtype: str, load_format: str, gpu: bool) -> list[str]:
    """vLLM's own flags, the same for both servers."""
    out = (["--gpu-memory-utilization", str(args.gpu_memory_utilization)] if gpu else
           ["--enforce-eager", "--kv-cache-memory-bytes", str(args.cpu_kv_mib * 2**20)])
    out += ["--max-model-len", str(args.max_model_len), "--dtype", dtype,
            "--load-format", load_format]
    if compilation := common.compilation_overrides(args.cudagraph_sizes):
        out += ["--compilation-config", json.dumps(compilation["compilation_config"])]
    return out


def start_servers(args: argparse.Namespace, folder: str, dtype: str, load_format: str,
                  workdir: Path, gpu: bool) -> tuple[Any, Any, Any]:
    """(plain vllm serve, the same with the no-op connector, inferscale serve), all up; one
    failing stops them all."""
    from tests.server.process import ServerProcess

    class PlainVllm(ServerProcess):
        def command(self) -> list[str]:
            return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                    folder, "--port", str(self.port), "--uvicorn-log-level", "warning",
                    *self.sizing_args]

    common = vllm_args(args, dtype, load_format, gpu)
    plain = PlainVllm(workdir / "unused.db", workdir / "vllm.log", model=folder,
                      sizing_args=common)
    noop = PlainVllm(workdir / "unused2.db", workdir / "noop.log", model=folder,
                     sizing_args=[*common, "--kv-transfer-config", json.dumps(NOOP_CONNECTOR)])
    ours = ServerProcess(workdir / "server.db", workdir / "server.log", model=folder,
                         sizing_args=[*common, "--slab-mib", str(args.slab_mib), "--window",
                                      str(args.window), "--embedding-model", args.embedder,
                                      "--dedupe-threshold", "none"])
    started = []
    try:
        for server in (plain, noop, ours):  # one at a time: each sizes itself on what is free
            started.append(server.start(timeout_s=900))
    except BaseException:
        for server in started:
            server.stop()
        raise
    return plain, noop, ours


NOOP_CONNECTOR = {"kv_connector": "NoopConnector", "kv_role": "kv_both",
                  "kv_connector_module_path": "benchmarks.noop_connector"}


def stream_chat(http: Any, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """server_ttft.stream_chat, naming the model this client's server serves."""
    return server_ttft.stream_chat(http, {**body, "model": http.model_id})


ENGINE_METRICS = {"vllm_ttft": "vllm:time_to_first_token_seconds",
                  "queue": "vllm:request_queue_time_seconds",
                  "prefill": "vllm:request_prefill_time_seconds"}
"""Per-request histograms of vLLM read after each request (ms, from their _sum)."""


def engine_sums(http: Any) -> dict[str, float]:
    """The running sums (s) of ENGINE_METRICS on one server."""
    text = http.get("/metrics").text
    out = {}
    for name, metric in ENGINE_METRICS.items():
        total = 0.0
        for line in text.splitlines():
            if line.startswith(metric + "_sum"):
                total += float(line.rsplit(" ", 1)[1])
        out[name] = total
    return out


def run(args: argparse.Namespace, plain: Any, noop: Any, ours: Any,
        questions: list[str], fact_sets: list[list[str]]) -> dict[str, Any]:
    from inferscale_engine.config import DEFAULT_SYSTEM_PROMPT
    from inferscale_engine.prompting.prompt import FACT_FORMAT

    rng = random.Random(args.seed + 1)
    raw: dict[str, list[float]] = {m: [] for m in MODES}
    served: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    chat = {"max_tokens": 1, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    for i, (question, facts) in enumerate(zip(questions, fact_sets, strict=True)):
        alone = [{"role": "user", "content": question}]
        pasted = [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT + "".join(
            FACT_FORMAT.format(text=t) for t in facts)}, *alone]
        user = f"u{i}"
        calls: dict[str, tuple[Any, dict[str, Any]]] = {
            "vllm": (plain, {"messages": alone}),
            "noop": (noop, {"messages": alone}),
            "ours-off": (ours, {"messages": alone, "memory": {"enabled": False}}),
            "vllm-text": (plain, {"messages": pasted}),
            "ours-text": (ours, {"messages": pasted, "memory": {"enabled": False}}),
            "ours-kv": (ours, {"messages": alone, "user": user, "memory": {"k": args.k}}),
        }
        order = list(MODES)
        rng.shuffle(order)
        for mode in order:
            client, body = calls[mode]
            before = engine_sums(client)
            elapsed, info = stream_chat(client, {**chat, **body})
            time.sleep(0.05)  # the engine core's stats reach the API process after the response
            after = engine_sums(client)
            info["engine_ms"] = {k: (after[k] - before[k]) * 1e3 for k in after}
            if i >= args.warmup:
                raw[mode].append(elapsed)
                served[mode].append(info)
        if raw["vllm"]:
            print(f"q{i:3d} " + "  ".join(f"{m}={raw[m][-1]:7.2f}" for m in MODES), flush=True)
    return {"raw_ms": raw, "served": served}


def summary_of(result: dict[str, Any]) -> dict[str, Any]:
    raw, served = result["raw_ms"], result["served"]
    out: dict[str, Any] = {"modes": {}, "differences_ms": {}, "server_timing_ms": {}}
    for mode in MODES:
        out["modes"][mode] = {
            **common.summarize(raw[mode]),
            "prompt_tokens": statistics.median(s["prompt_tokens"] or 0 for s in served[mode]),
            "injected_tokens": statistics.median(s["injected_tokens"] for s in served[mode])}
    for name, (a, b) in PAIRS.items():
        out["differences_ms"][name] = {
            "of": f"{a} - {b}",
            "paired": common.summarize([x - y for x, y in zip(raw[a], raw[b], strict=True)])}
    out["engine_ms"] = {mode: {name: statistics.median(s["engine_ms"][name] for s in served[mode])
                               for name in ENGINE_METRICS} for mode in MODES}
    for mode in MODES:  # client TTFT outside vLLM's own arrival -> first token
        out["engine_ms"][mode]["outside_vllm"] = statistics.median(
            t - s["engine_ms"]["vllm_ttft"] for t, s in zip(raw[mode], served[mode],
                                                             strict=True))
    phases = sorted({p for s in served["ours-kv"] for p in s["server_timing"]})
    for phase in phases:
        values = [s["server_timing"].get(phase, 0.0) for s in served["ours-kv"]]
        out["server_timing_ms"][phase] = {"median": statistics.median(values),
                                          "p90": sorted(values)[int(0.9 * (len(values) - 1))]}
    out["kv_requests_not_injected"] = sum(not s["injected_tokens"] for s in served["ours-kv"])
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import httpx

    args = parse_args(argv)
    gpu, (folder, dtype, load_format), questions, fact_sets = server_ttft.workload(args, 300)
    with tempfile.TemporaryDirectory() as workdir:
        servers = start_servers(args, folder, dtype, load_format, Path(workdir), gpu)
        try:
            with httpx.Client(base_url=servers[0].base_url, timeout=300) as plain, \
                    httpx.Client(base_url=servers[1].base_url, timeout=300) as noop, \
                    httpx.Client(base_url=servers[2].base_url, timeout=300) as ours:
                clients: list[Any] = [plain, noop, ours]
                for client in clients:
                    client.model_id = client.get("/v1/models").json()["data"][0]["id"]
                for i, facts in enumerate(fact_sets):
                    response = ours.post("/v1/memories", json={"user_id": f"u{i}",
                                                               "texts": facts})
                    response.raise_for_status()
                result = run(args, plain, noop, ours, questions, fact_sets)
        finally:
            for server in servers:
                server.stop()
    summary = summary_of(result)
    record = {"benchmark": "serve_overhead", "config": {**vars(args), "model_folder": folder,
                                                        "dtype": dtype,
                                                        "load_format": load_format},
              "environment": common.environment(), "summary": summary, **result}
    print("\n| mode | median ms | p90 ms | prompt tokens | injected tokens |")
    print("|---|---|---|---|---|")
    for mode, s in summary["modes"].items():
        print(f"| {mode} | {s['median_ms']:.2f} | {s['p90_ms']:.2f} | {s['prompt_tokens']:.0f} "
              f"| {s['injected_tokens']:.0f} |")
    for name, d in summary["differences_ms"].items():
        print(f"{name} ({d['of']}): paired median {d['paired']['median_ms']:+.2f} ms, "
              f"p90 {d['paired']['p90_ms']:+.2f} ms")
    print("\n| mode | client TTFT | vLLM TTFT (API) | queue | prefill | outside vLLM |")
    print("|---|---|---|---|---|---|")
    for mode, e in summary["engine_ms"].items():
        print(f"| {mode} | {summary['modes'][mode]['median_ms']:.2f} | {e['vllm_ttft']:.2f} | "
              f"{e['queue']:.2f} | {e['prefill']:.2f} | {e['outside_vllm']:.2f} |")
    print("seam phases (ours-kv, median ms): " + ", ".join(
        f"{p} {v['median']:.2f}" for p, v in summary["server_timing_ms"].items()))
    if summary["kv_requests_not_injected"]:
        print(f"WARNING: {summary['kv_requests_not_injected']} ours-kv requests injected nothing")
    name = f"serve_overhead-{args.model}" + (f"-{args.tag}" if args.tag else "")
    path = common.write_record(name, record)
    print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
