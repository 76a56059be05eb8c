"""Restart: how soon a Memory of many facts serves again, with the disk tier vs re-encoding.

Builds a store of --facts facts over --users users (each fact's KV written to a disk tier as it
is encoded), closes it, then opens the same database three ways, one after the other, and times
opening and each user's first and second request (k facts):

  disk       disk tier, startup 'lazy': nothing is encoded at start; a fact's KV is loaded from
             its disk entry on first use
  encode     no disk tier, startup 'encode': every stored fact is encoded again at start
  lazy       no disk tier, startup 'lazy': each fact is encoded again on first use

  python benchmarks/restart.py --model tiny --facts 20000 --users 100

Writes one JSON record (benchmarks/out by default). Asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (  # noqa: E402
    environment,
    resolve_model,
    summarize,
    synthetic_texts,
    write_tagged,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--facts", type=int, default=20000)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--fact-tokens", type=int, default=24)
    parser.add_argument("--k", type=int, default=20, help="facts per request")
    parser.add_argument("--requests", type=int, default=20, help="users asked after a restart")
    parser.add_argument("--slab-mib", type=int, default=64)
    parser.add_argument("--host-tier-mib", type=int, default=256)
    parser.add_argument("--modes", default="disk,lazy,encode")
    parser.add_argument("--workdir", default=None, help="keep the store and disk tier here")
    parser.add_argument("--tag", default="")
    return parser.parse_args(argv)


def memory_config(args: argparse.Namespace, db: Path, disk: Path | None, startup: str) -> object:
    from inferscale_engine import EngineConfig, MemoryConfig

    model, dtype, load_format = resolve_model(args.model)
    engine = EngineConfig(model=model, dtype=dtype, load_format=load_format,
                          max_model_len=2048, context_source="recent",
                          slab_capacity_bytes=args.slab_mib * 2**20,
                          host_tier_bytes=args.host_tier_mib * 2**20,
                          disk_tier_path=str(disk) if disk else None)
    return MemoryConfig(engine=engine, db_path=str(db), startup=startup, dedupe_threshold=None)


def build(args: argparse.Namespace, db: Path, disk: Path) -> dict[str, float]:
    from transformers import AutoTokenizer

    from inferscale_engine import Memory

    model, _, _ = resolve_model(args.model)
    texts = synthetic_texts(AutoTokenizer.from_pretrained(model), args.facts, args.fact_tokens,
                            seed=1)
    per_user = -(-args.facts // args.users)
    start = time.perf_counter()
    with Memory.from_config(memory_config(args, db, disk, "lazy")) as memory:
        for u in range(args.users):
            chunk = texts[u * per_user:(u + 1) * per_user]
            if chunk:
                memory.add(user_id=f"user{u}", texts=chunk)
    return {"seconds": time.perf_counter() - start, "facts": len(texts)}


def restart(args: argparse.Namespace, db: Path, disk: Path | None, startup: str
            ) -> dict[str, object]:
    from vllm import SamplingParams

    from inferscale_engine import Memory

    one_token = SamplingParams(max_tokens=1, temperature=0.0)
    rng = random.Random(7)
    users = rng.sample(range(args.users), min(args.requests, args.users))
    start = time.perf_counter()
    with Memory.from_config(memory_config(args, db, disk, startup)) as memory:
        opened = time.perf_counter() - start
        first, second = [], []
        for u in users:
            for samples in (first, second):
                t = time.perf_counter()
                out = memory.generate(user_id=f"user{u}", query="What is on the agenda?",
                                      k=args.k, sampling=one_token)
                samples.append((time.perf_counter() - t) * 1e3)
                assert out.plan_status == "inject", out.plan_status
        stats = memory.stats()
    return {"open_seconds": opened, "first_request_ms": summarize(first),
            "second_request_ms": summarize(second), "counters": stats.engine.counters,
            "workers": stats.engine.worker_totals}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="inferscale-restart-"))
    db, disk = work / "memory.db", work / "disk"
    built = build(args, db, disk) if not db.exists() else {"reused": True}
    print(f"built: {built}", flush=True)
    results = {}
    for mode in args.modes.split(","):
        results[mode] = restart(args, db, disk if mode == "disk" else None,
                                "encode" if mode == "encode" else "lazy")
        entry = results[mode]
        print(f"{mode}: open {entry['open_seconds']:.1f} s, first request "
              f"{entry['first_request_ms']['median_ms']:.1f} ms (median), second "
              f"{entry['second_request_ms']['median_ms']:.1f} ms", flush=True)
    disk_bytes = sum(p.stat().st_size for p in disk.glob("*.safetensors"))
    record = {"benchmark": "restart", "config": vars(args), "environment": environment(),
              "build": built, "disk_files": len(list(disk.glob("*.safetensors"))),
              "disk_bytes": disk_bytes, "results": results}
    write_tagged("restart", args.tag, record)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return record


if __name__ == "__main__":
    main()
