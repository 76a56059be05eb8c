"""Add latency through `inferscale serve`: what a chat-borne add costs the turn, sync vs async.

One server per mode, the same model and settings (the server's default contexts: similar facts,
W=256): `async` (the default: memory.add returns once the facts are stored, their embedding and
KV queued) and `sync` (`--sync-adds`: the add waits for both). For n in --facts, each sample is
a fresh user's chat turn (max_tokens 1) carrying memory.add of n new facts; before it, the same
user's turn without an add (the baseline turn). Per sample:
  add_ms       the seam's "add" phase (Server-Timing): the time the add itself adds to the turn
  turn_ms      the whole turn with the add, client side
  base_ms      the baseline turn without an add, client side
  kv_ready_ms  request sent -> every added fact's event SUCCEEDED (embedded, KV encoded,
               indexed; polled every --poll-ms); for sync the turn itself
  seam_ms      the seam's own phases summed (Server-Timing: identify, add, retrieve, plan, ...),
               and seam_base_ms the same for the baseline turn
Reports p50 / p99 per (mode, n). Nothing here asserts anything about speed.

  python benchmarks/add_latency.py --model tiny                      # CPU, minutes
  python benchmarks/add_latency.py --model small --facts 1,10,100 --samples 5   # the 0.5B
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402

MODES = ("async", "sync")
WORDS = ("red", "green", "blue", "amber", "violet", "silver", "golden", "black", "white", "grey")
PLACES = ("window", "garage", "attic", "kitchen", "office", "harbour", "library", "garden")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="tiny | small (the 0.5B) | a folder")
    parser.add_argument("--facts", default="1,10,100", help="facts per add, comma-separated")
    parser.add_argument("--samples", type=int, default=10, help="turns per (mode, n)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed turns per mode first")
    parser.add_argument("--poll-ms", type=float, default=10.0, help="event polling interval")
    parser.add_argument("--slab-mib", type=int, default=256, help="fact KV per worker (MiB)")
    parser.add_argument("--cpu-kv-mib", type=int, default=512, help="vLLM's KV cache (MiB)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--tag", default="")
    return parser.parse_args(argv)


def facts_of(user: str, n: int) -> list[str]:
    """n distinct short facts of one user (about 15 tokens each)."""
    return [f"{user} keeps notebook {i} in a {WORDS[i % 10]} box by the {PLACES[i % 8]}."
            for i in range(n)]


def turn(http: Any, model: str, user: str, add: list[str] | None) -> tuple[float, dict, dict]:
    """One chat turn: (client ms, the response's memory field, Server-Timing phases ms)."""
    body = {"model": model, "user": user, "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "user", "content": "Where is notebook 0?"}],
            **({"memory": {"add": add}} if add else {})}
    start = time.perf_counter()
    response = http.post("/v1/chat/completions", json=body, headers={"X-User-Id": user})
    elapsed = (time.perf_counter() - start) * 1e3
    response.raise_for_status()
    phases = {}
    for part in response.headers.get("server-timing", "").split(","):
        name, _, value = part.strip().partition(";dur=")
        if value:
            phases[name] = float(value)
    return elapsed, response.json()["memory"], phases


def wait_ready(http: Any, ids: list[int], poll_s: float, timeout_s: float = 600.0) -> None:
    """Poll the facts' events until every one has settled (SUCCEEDED, or FAILED)."""
    deadline = time.monotonic() + timeout_s
    left = list(ids)
    while left:
        status = http.get(f"/v1/memories/events/{left[0]}").json()["status"]
        if status in ("SUCCEEDED", "FAILED"):
            left.pop(0)
            continue
        if time.monotonic() > deadline:
            raise TimeoutError(f"facts {left} not ready after {timeout_s:.0f} s")
        time.sleep(poll_s)


def measure(http: Any, model: str, mode: str, sizes: list[int], args: argparse.Namespace
            ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for w in range(args.warmup):
        user = f"warm-{mode}-{w}"
        _, memory, _ = turn(http, model, user, facts_of(user, 2))
        wait_ready(http, [a["id"] for a in memory["added"]], args.poll_ms / 1e3)
    for n in sizes:
        samples: dict[str, list[float]] = {"add_ms": [], "turn_ms": [], "base_ms": [],
                                           "kv_ready_ms": [], "seam_ms": [],
                                           "seam_base_ms": []}
        phases_of: list[dict[str, float]] = []
        for s in range(args.samples):
            user = f"{mode}-{n}-{s}"
            base, _, base_phases = turn(http, model, user, None)
            started = time.perf_counter()
            elapsed, memory, phases = turn(http, model, user, facts_of(user, n))
            ids = [a["id"] for a in memory["added"]]
            assert len(ids) == n and all(a["event"] == "ADD" for a in memory["added"]), memory
            wait_ready(http, ids, args.poll_ms / 1e3)
            samples["kv_ready_ms"].append((time.perf_counter() - started) * 1e3)
            samples["add_ms"].append(phases.get("add", 0.0))
            samples["turn_ms"].append(elapsed)
            samples["base_ms"].append(base)
            samples["seam_ms"].append(sum(phases.values()))  # identify ... back, add included
            samples["seam_base_ms"].append(sum(base_phases.values()))
            phases_of.append(phases)
            print(f"{mode} n={n:3d} #{s}: add {samples['add_ms'][-1]:8.2f} ms, turn "
                  f"{elapsed:8.1f} ms (base {base:7.1f}), kv ready "
                  f"{samples['kv_ready_ms'][-1]:8.1f} ms", flush=True)
        out[str(n)] = {"raw": samples, "server_timing": phases_of,
                       "summary": {k: {"p50": _pct(v, 50), "p99": _pct(v, 99),
                                       "mean": sum(v) / len(v)} for k, v in samples.items()}}
    return out


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import httpx

    from tests.server.process import ServerProcess

    args = parse_args(argv)
    sizes = [int(n) for n in args.facts.split(",")]
    model_args = "tiny" if args.model == "tiny" else args.model
    sizing = ["--enforce-eager", "--slab-mib", str(args.slab_mib), "--kv-cache-memory-bytes",
              str(args.cpu_kv_mib * 2**20), "--max-model-len", str(args.max_model_len),
              "--max-add-facts", str(max(sizes))]
    results: dict[str, Any] = {}
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory() as workdir:
            server = ServerProcess(Path(workdir) / "server.db", Path(workdir) / "server.log",
                                   model=model_args, sizing_args=sizing,
                                   extra_args=["--sync-adds"] if mode == "sync" else [])
            server.start(timeout_s=900)
            try:
                with httpx.Client(base_url=server.base_url, timeout=600) as http:
                    model = http.get("/v1/models").json()["data"][0]["id"]
                    results[mode] = measure(http, model, mode, sizes, args)
            finally:
                server.stop()
    record = {"benchmark": "add_latency", "config": vars(args),
              "environment": common.environment(), "results": results}
    print("\n| mode | facts | add p50 / p99 ms | turn p50 / p99 ms | base turn p50 ms | "
          "KV ready p50 / p99 ms |")
    print("|---|---|---|---|---|---|")
    for mode, by_n in results.items():
        for n, r in by_n.items():
            s = r["summary"]
            print(f"| {mode} | {n} | {s['add_ms']['p50']:.2f} / {s['add_ms']['p99']:.2f} | "
                  f"{s['turn_ms']['p50']:.1f} / {s['turn_ms']['p99']:.1f} | "
                  f"{s['base_ms']['p50']:.1f} | {s['kv_ready_ms']['p50']:.1f} / "
                  f"{s['kv_ready_ms']['p99']:.1f} |")
    common.write_tagged(f"add_latency-{args.model}", args.tag, record)
    return record


if __name__ == "__main__":
    main()
