"""A bounded load run through vllm-router over two replicas, next to one replica alone.

Started here, on loopback: a throwaway PostgreSQL (tests/pgserver.py), two `inferscale serve`
replicas sharing its database, vllm-router (`--policy consistent_hash`, hashing X-User-Id).
The same workload runs twice, on fresh users each time: through the router, then against one
replica directly. N clients, each its own user: one chat that adds F facts (memory.add), then M
requests, a fraction `--add-share` of them chats that add one fact, the rest chats with memory
(k facts). Every response is checked: it names its user and only that user's facts. The record
has requests/s, p50/p99 per kind, errors, cross-user facts, and how the router spread the users
(replica of each response). Nothing here asserts anything about speed.

  python benchmarks/replicas_load.py --model tiny --clients 16 --requests 12     # CPU
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import environment, write_record  # noqa: E402
from benchmarks.server_load import stats  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="what the replicas serve (tiny, small)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=12, help="per client, after seeding")
    parser.add_argument("--facts", type=int, default=4, help="facts each user starts with")
    parser.add_argument("--add-share", type=float, default=0.25)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tag", default="")
    return parser.parse_args(argv)


class Arm:
    """One workload run against one base URL; what it saw."""

    def __init__(self, name: str, base_url: str, key: str, args: argparse.Namespace) -> None:
        self.name, self.base_url, self.key, self.args = name, base_url, key, args
        self.latencies: dict[str, list[float]] = {"add": [], "ask": []}
        self.errors: Counter[str] = Counter()
        self.samples: list[str] = []
        self.cross_user = 0
        self.replica_of: dict[str, Counter[str]] = {}

    async def run(self) -> dict[str, Any]:
        import httpx

        limits = httpx.Limits(max_connections=self.args.clients + 4)
        async with httpx.AsyncClient(base_url=self.base_url, timeout=300, limits=limits) as http:
            model = (await http.get("/v1/models", headers=self._headers("x"))
                     ).json()["data"][0]["id"]
            users = [f"a:{self.name}-{i}" for i in range(self.args.clients)]
            own: dict[str, set[int]] = {u: set() for u in users}
            await asyncio.gather(*(self._chat(http, model, u, own, [
                f"{u} keeps notebook {n} in a drawer" for n in range(self.args.facts)])
                for u in users))
            started = time.perf_counter()
            await asyncio.gather(*(self._client(http, model, u, own) for u in users))
            wall = time.perf_counter() - started
        done = sum(len(v) for v in self.latencies.values()) - self.args.clients
        return {"requests_per_s": done / wall, "wall_s": wall, "requests_ok": done,
                "latency": {k: stats(v) for k, v in self.latencies.items()},
                "errors": dict(self.errors), "error_samples": self.samples,
                "cross_user_facts": self.cross_user,
                "users_per_replica": dict(Counter(c.most_common(1)[0][0]
                                                  for c in self.replica_of.values())),
                "users_on_several_replicas": sum(len(c) > 1 for c in self.replica_of.values())}

    async def _client(self, http: Any, model: str, user: str, own: dict[str, set[int]]) -> None:
        rng = random.Random(f"{self.args.seed}-{user}")
        for n in range(self.args.requests):
            add = ([f"{user} also keeps notebook {100 + n}"]
                   if rng.random() < self.args.add_share else None)
            await self._chat(http, model, user, own, add)

    async def _chat(self, http: Any, model: str, user: str, own: dict[str, set[int]],
                    add: list[str] | None) -> None:
        memory: dict[str, Any] = {"k": self.args.k, **({"add": add} if add else {})}
        started = time.perf_counter()
        try:
            response = await http.post("/v1/chat/completions", headers=self._headers(user), json={
                "model": model, "max_tokens": self.args.max_tokens, "temperature": 0,
                "memory": memory, "messages": [{"role": "user", "content": "Which notebook?"}]})
            if response.status_code != 200:
                raise RuntimeError(f"{response.status_code}: {response.text[:200]}")
            info = response.json()["memory"]
        except Exception as exc:  # noqa: BLE001 - counted, never stops the run
            self.errors["add" if add else "ask"] += 1
            if len(self.samples) < 10:
                self.samples.append(f"{type(exc).__name__}: {exc}"[:300])
            return
        self.latencies["add" if add else "ask"].append(1e3 * (time.perf_counter() - started))
        own[user].update(e["id"] for e in info.get("added", []))
        self.cross_user += (info["user_id"] != user) + sum(
            f not in own[user] for f in info["fact_ids"])
        self.replica_of.setdefault(user, Counter())[info.get("replica", "?")] += 1

    def _headers(self, user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}", "X-User-Id": user}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from tests.pgserver import PostgresServer
    from tests.server.process import KEYS, RouterProcess, ServerProcess, keys_file

    args = parse_args(argv)
    arms: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder, PostgresServer() as postgres:
        work = Path(folder)
        keys = keys_file(work / "keys.json")
        replicas = [ServerProcess(postgres.url, work / f"replica{i}.log", model=args.model,
                                  api_keys=keys, admin_key=KEYS["admin"],
                                  extra_args=["--replica-id", f"r{i}"]) for i in range(2)]
        router = None
        try:
            for replica in replicas:
                replica.launch()
            for replica in replicas:
                replica.wait_ready(timeout_s=900)
            router = RouterProcess([r.base_url for r in replicas], work / "router.log")
            for name, url in (("router", router.base_url), ("one-replica", replicas[0].base_url)):
                arms[name] = asyncio.run(Arm(name, url, KEYS["a"], args).run())
                print(f"{name}: {arms[name]['requests_per_s']:.2f} req/s, ask p50 "
                      f"{arms[name]['latency']['ask'].get('p50_ms', 0):.0f} ms p99 "
                      f"{arms[name]['latency']['ask'].get('p99_ms', 0):.0f} ms, errors "
                      f"{sum(arms[name]['errors'].values())}, cross-user "
                      f"{arms[name]['cross_user_facts']}, users per replica "
                      f"{arms[name]['users_per_replica']}", flush=True)
        finally:
            if router is not None:
                router.stop()
            for replica in replicas:
                replica.stop()
    record = {"benchmark": "replicas_load", "config": vars(args), "environment": environment(),
              "arms": arms}
    path = write_record("replicas_load-" + args.model + (f"-{args.tag}" if args.tag else ""),
                        record)
    print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
