"""Command line: `inferscale serve | mcp | demo [--ui] | calibrate | build-model | export | ...`.

`export | import | backup | restore` are data_commands.py's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from inferscale_engine import data_commands
from inferscale_engine.model.resolve import resolve_model

DEMO_FACTS = [
    "Caroline moved to Lisbon in 2021 and works as a pottery teacher.",
    "Caroline's dog is a beagle named Pepper.",
    "Caroline is allergic to peanuts.",
    "Caroline's sister Melanie lives in Boston and runs marathons.",
    "Caroline started learning the cello last spring.",
    "Caroline's favourite food is grilled sardines.",
    "Caroline volunteers at an animal shelter on Saturdays.",
    "Caroline's birthday is on the 14th of March.",
]
DEMO_QUESTION = "What is the name of Caroline's dog?"
DEMO_CHAT = [
    {"role": "user", "content": "I'm thinking of a weekend in Boston to see my sister."},
    {"role": "assistant", "content": "Lovely! Melanie could show you the marathon route."},
]
DEMO_USER = "demo:caroline"


def _ttft_ms(engine, handle, question: str, mode: str, repeats: int) -> float:
    from vllm import SamplingParams

    one_token = SamplingParams(max_tokens=1, temperature=0.0)
    engine.generate(handle, question, one_token, mode=mode)  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.generate(handle, question, one_token, mode=mode)
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def demo(args: argparse.Namespace) -> int:
    """Add facts, answer one question in KV mode and in text mode, print answers and TTFTs."""
    from vllm import SamplingParams

    from inferscale_engine import Engine, EngineConfig, MemoryHandle
    from inferscale_engine.prompting.contexts import run_contexts

    model, dtype = resolve_model(args.model)
    print(f"model: {model} ({dtype})", flush=True)
    # Prefix caching off: every request prefills like a new conversation would, so the TTFTs
    # compare prefilling the facts (text) with injecting their stored KV (kv).
    config = EngineConfig(model=str(model), dtype=dtype, max_model_len=2048,
                          context_window_tokens=args.window, context_run_tokens=args.run_tokens,
                          enable_prefix_caching=False)
    with Engine(config) as engine:
        # The facts are encoded as one run, each after the facts before it (Context-Window
        # Encoding), as facts from one conversation would be: one save request.
        lengths = [len(engine.tokenize_fact(f)) for f in DEMO_FACTS]
        contexts = run_contexts([], DEMO_FACTS, lengths, run_tokens=args.run_tokens,
                                lead_facts=16)
        start = time.perf_counter()
        fact_ids = engine.add_facts("caroline", DEMO_FACTS, contexts)
        print(f"encoded {len(fact_ids)} facts once in {time.perf_counter() - start:.2f} s")
        handle = MemoryHandle("caroline", tuple(fact_ids))
        answer = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
        rows = []
        for mode in ("kv", "text"):
            out = engine.generate(handle, args.question, answer, mode=mode)
            ttft = _ttft_ms(engine, handle, args.question, mode, args.repeats)
            rows.append((mode, ttft, out))
        stats = engine.stats()
    # The result last, after vLLM's start-up lines: the answers and TTFTs side by side.
    totals = stats.worker_totals
    print(f"\nslab: {totals['num_tokens']} tokens stored, "
          f"{totals['injected_tokens']} injected so far")
    print(f"question: {args.question}\n")
    print("| mode | TTFT ms | prompt tokens injected | facts repaired as text | answer |")
    print("|------|--------:|-----------------------:|-----------------------:|--------|")
    for mode, ttft, out in rows:
        repaired = out.num_repaired_facts if mode == "kv" else "-"
        print(f"| {mode} | {ttft:,.1f} | {out.num_injected_tokens} of {out.num_prompt_tokens} | "
              f"{repaired} | {out.text.strip()} |")
    return 0


def demo_ui(args: argparse.Namespace, serve_flags: list[str]) -> int:
    """`inferscale demo --ui`: serve the model with the inspector, Caroline's memories, a key.

    The key (admin, this run only), the database and the keys file live in a temporary folder
    removed at exit; `serve_flags` go to `inferscale serve` as they are.
    """
    import json
    import secrets
    import tempfile
    import threading
    from pathlib import Path

    from inferscale_engine.server.main import main as serve

    key = "sk-demo-" + secrets.token_urlsafe(18)
    with tempfile.TemporaryDirectory(prefix="inferscale-demo-ui-") as folder:
        keys = Path(folder) / "keys.json"
        keys.touch(mode=0o600)
        keys.write_text(json.dumps({"keys": {key: {"tenant": "demo", "users": ["demo:*"],
                                                   "admin": True}}}))
        host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
        threading.Thread(target=_seed_demo, args=(f"http://{host}:{args.port}", key),
                         name="inferscale-demo-seed", daemon=True).start()
        return serve([args.model, "--host", args.host, "--port", str(args.port),
                      "--db", str(Path(folder) / "demo.db"), "--api-keys", str(keys),
                      "--window", str(args.window), "--run-tokens", str(args.run_tokens),
                      *serve_flags])


def _seed_demo(base_url: str, key: str, timeout_s: float = 3600.0) -> None:
    """Once the server answers: add Caroline's facts and a chat, print where to look."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{base_url}/health", headers=headers, timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            return
        time.sleep(1)
    for body in ({"texts": DEMO_FACTS}, {"messages": DEMO_CHAT, "session_id": "weekend-plans"}):
        httpx.post(f"{base_url}/v1/memories", headers=headers, timeout=600,
                   json={"user_id": DEMO_USER, **body}).raise_for_status()
    print(f"\nInferScale memory inspector: {base_url}/ui\nAPI key (admin, this run only): "
          f"{key}\nUser {DEMO_USER}: open it and Ask {DEMO_QUESTION!r}\n", flush=True)


def calibrate(args: argparse.Namespace) -> int:
    """Fit the key temperature on a user's stored facts and save it (no gold answers)."""
    from inferscale_engine.config import EngineConfig
    from inferscale_engine.memory import Memory, MemoryConfig
    from inferscale_engine.memory.ingest import fact_contexts
    from inferscale_engine.model.calibration import fit

    model, dtype = resolve_model(args.model)
    config = MemoryConfig(EngineConfig(model=str(model), dtype=dtype,
                                       context_window_tokens=args.window),
                          db_path=args.db, startup="lazy")
    with Memory.from_config(config) as memory:
        texts = [f.text for f in memory.get_all(user_id=args.user)]
        contexts = fact_contexts([], texts)  # each after the user's facts before it
        result = fit(memory.engine, texts, contexts,
                     [float(s) for s in args.scales.split(",")], args.sets, args.k)
    result.save(args.out)
    for scale, kl in result.mean_kl.items():
        print(f"key_scale {scale}: mean first-token KL(text || kv) {kl:.4f}")
    print(f"best: {result.key_scale:g}; saved to {args.out} (EngineConfig(calibration=...))")
    return 0


def build_model(args: argparse.Namespace) -> int:
    """Build the real small model into the cache and print its path."""
    print(resolve_model(args.model)[0])
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `inferscale` console script."""
    parser = argparse.ArgumentParser(prog="inferscale", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("demo", help="answer a question from memory in KV mode and text mode")
    run.add_argument("--model", default="small", help="small (the real 0.5B) | a model folder")
    run.add_argument("--question", default=DEMO_QUESTION)
    run.add_argument("--window", type=int, default=256, help="context window W (tokens)")
    run.add_argument("--run-tokens", type=int, default=512,
                     help="R: facts are encoded together in runs of up to R tokens")
    run.add_argument("--max-tokens", type=int, default=24)
    run.add_argument("--repeats", type=int, default=5, help="TTFT samples per mode")
    run.set_defaults(func=demo)
    run.add_argument("--verbose", action="store_true", help="show vLLM's INFO log")
    run.add_argument("--ui", action="store_true",
                     help="instead: serve the model with the memory inspector (/ui) and "
                          "Caroline's memories; prints the URL and an API key. Other flags "
                          "go to `inferscale serve`")
    run.add_argument("--host", default="127.0.0.1", help="with --ui: where to listen")
    run.add_argument("--port", type=int, default=8000, help="with --ui: the port")
    cal = sub.add_parser("calibrate", help="fit the key temperature on a user's facts")
    cal.add_argument("--model", default="small", help="small | a model folder")
    cal.add_argument("--db", required=True,
                     help="the Memory's fact database (a SQLite file or a postgresql:// URL)")
    cal.add_argument("--user", required=True, help="whose facts to sample")
    cal.add_argument("--out", required=True, help="where to write the fit (JSON)")
    cal.add_argument("--scales", default="0.8,0.9,1.0,1.1", help="candidate key scales")
    cal.add_argument("--sets", type=int, default=12, help="random fact sets")
    cal.add_argument("--k", type=int, default=8, help="facts per set")
    cal.add_argument("--window", type=int, default=256, help="context window W (tokens)")
    cal.set_defaults(func=calibrate)
    build = sub.add_parser("build-model", help="build a model into the cache, print its path")
    build.add_argument("--model", default="small", help="small")
    build.set_defaults(func=build_model)
    sub.add_parser("serve", help="vLLM's OpenAI server with per-user KV memory (see "
                                 "`inferscale serve --help`)", add_help=False)
    sub.add_parser("mcp", help="one user's memory as MCP tools over stdio (see `inferscale mcp "
                               "--help`)", add_help=False)
    data_commands.add_parsers(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        from inferscale_engine.server.main import main as serve

        return serve(argv[1:])
    if argv[:1] == ["mcp"]:
        from inferscale_engine.server.mcp_stdio import main as mcp

        return mcp(argv[1:])
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "ui", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if not getattr(args, "verbose", False):  # vLLM reads it when first imported
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if getattr(args, "ui", False):
        return demo_ui(args, rest)
    if args.command in data_commands.COMMANDS:
        return data_commands.run(args)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
