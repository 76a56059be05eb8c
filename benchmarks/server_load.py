"""A bounded load test of `inferscale serve`: N concurrent clients x M mixed requests.

Each client is its own user with its own facts. After seeding them, every client sends M
requests drawn at random (seeded): adds (POST /v1/memories), searches, chats with memory
(whole and streamed) and completions with memory. Every response is checked for cross-user
facts: a chat's `memory.fact_ids` and a search's results must only ever name facts the caller
added, and each user's get_all at the end must hold exactly its own facts. The record has
p50/p99 latency per request kind, error counts, cross-user fact counts and the server's
InferScale counters. Nothing here asserts anything about speed.

  python benchmarks/server_load.py --model tiny                 # starts its own server
  python benchmarks/server_load.py --base-url http://127.0.0.1:8000 --model tiny
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import environment, write_record  # noqa: E402

KINDS = {"add": 0.2, "search": 0.25, "chat": 0.35, "chat_stream": 0.15, "completion": 0.05}
"""Request mix (probabilities)."""
_PETS = ["beagle", "parrot", "turtle", "cat", "hamster", "goldfish", "ferret", "pony"]
_COLORS = ["red", "blue", "green", "amber", "violet", "silver", "black", "white"]
_CITIES = ["Lisbon", "Oslo", "Lima", "Kyoto", "Boston", "Nairobi", "Quito", "Hanoi"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="what the server serves (tiny, small)")
    parser.add_argument("--base-url", default=None, help="a running server; default: start one")
    parser.add_argument("--api-key", default=None, help="a key reaching the users")
    parser.add_argument("--user-prefix", default="load-", help="user ids: PREFIX<seed>-<i>")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=20, help="per client, after seeding")
    parser.add_argument("--facts", type=int, default=4, help="facts seeded per user")
    parser.add_argument("--k", type=int, default=3, help="memory.k of chats")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--mix", default=",".join(f"{k}={v}" for k, v in KINDS.items()),
                        help="request kinds and their weights")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per request")
    parser.add_argument("--tag", default="")
    return parser.parse_args(argv)


@dataclass
class Tally:
    """What the run saw: latencies per kind, errors, cross-user facts."""

    latencies_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    ttft_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    error_samples: list[str] = field(default_factory=list)
    cross_user_facts: int = 0
    checked_responses: int = 0
    lost_facts: int = 0

    def error(self, kind: str, message: str) -> None:
        self.errors[kind] += 1
        if len(self.error_samples) < 10:
            self.error_samples.append(f"{kind}: {message[:300]}")


def fact_text(rng: random.Random, user: int, n: int) -> str:
    return (f"Client {user} keeps a {rng.choice(_COLORS)} {rng.choice(_PETS)} named "
            f"{rng.choice(['Pepper', 'Rex', 'Tom', 'Kiwi', 'Luna', 'Ziggy'])}{n} in "
            f"{rng.choice(_CITIES)}.")


class Client:
    """One user: its own facts, M mixed requests, every answer checked for foreign facts."""

    def __init__(self, http: Any, index: int, args: argparse.Namespace, model: str,
                 tally: Tally) -> None:
        self.http, self.index, self.args, self.model, self.tally = http, index, args, model, tally
        self.user_id = f"{args.user_prefix}{args.seed}-{index}"
        self.rng = random.Random(args.seed * 100_003 + index)
        self.own: set[int] = set()

    async def seed(self) -> None:
        texts = [fact_text(self.rng, self.index, n) for n in range(self.args.facts)]
        await self._timed("seed", self._add(texts))

    async def run(self) -> None:
        mix = {kind: float(weight) for kind, weight in
               (item.split("=") for item in self.args.mix.split(","))}
        if set(mix) - set(KINDS):
            raise SystemExit(f"--mix kinds are {sorted(KINDS)}, got {sorted(mix)}")
        kinds = self.rng.choices(list(mix), weights=list(mix.values()), k=self.args.requests)
        for n, kind in enumerate(kinds):
            if kind == "add":
                request = self._add([fact_text(self.rng, self.index, 100 + n)])
            else:
                request = getattr(self, f"_{kind}")()
            await self._timed(kind, request)

    async def _timed(self, kind: str, request: Any) -> None:
        start = time.perf_counter()
        try:
            await request
        except Exception as exc:  # noqa: BLE001 - every failure is counted, none stops the run
            self.tally.error(kind, f"{type(exc).__name__}: {exc}")
            return
        self.tally.latencies_ms[kind].append(1000 * (time.perf_counter() - start))

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        response = await self.http.post(path, json=body)
        if response.status_code != 200:
            raise RuntimeError(f"{path} {response.status_code}: {response.text[:200]}")
        return response.json()

    async def _add(self, texts: list[str]) -> None:
        data = await self._post("/v1/memories", {"user_id": self.user_id, "texts": texts})
        self.own.update(int(r["id"]) for r in data["results"])

    def _check(self, fact_ids: list[int], users: list[str] = ()) -> None:
        self.tally.checked_responses += 1
        self.tally.cross_user_facts += sum(f not in self.own for f in fact_ids)
        self.tally.cross_user_facts += sum(u != self.user_id for u in users)

    async def _search(self) -> None:
        data = await self._post("/v1/memories/search", {
            "user_id": self.user_id, "query": f"Which pet does client {self.index} keep?",
            "top_k": self.args.k})
        self._check([int(r["id"]) for r in data["results"]],
                    [r["user_id"] for r in data["results"]])

    def _chat_body(self, stream: bool) -> dict[str, Any]:
        return {"model": self.model, "max_tokens": self.args.max_tokens, "temperature": 0,
                "stream": stream, "user": self.user_id, "memory": {"k": self.args.k},
                "messages": [{"role": "user", "content": "What is my pet called?"}]}

    async def _chat(self) -> None:
        data = await self._post("/v1/chat/completions", self._chat_body(False))
        memory = data["memory"]
        if memory["plan_status"] != "inject" or memory["injected_tokens"] <= 0:
            raise RuntimeError(f"not served from injected KV: {memory}")
        self._check(memory["fact_ids"], [memory["user_id"]])

    async def _chat_stream(self) -> None:
        start = time.perf_counter()
        async with self.http.stream("POST", "/v1/chat/completions",
                                    json=self._chat_body(True)) as response:
            if response.status_code != 200:
                raise RuntimeError(f"stream {response.status_code}: "
                                   f"{(await response.aread())[:200]!r}")
            self._check([], [response.headers["x-inferscale-user"]])
            if int(response.headers["x-inferscale-injected-tokens"]) <= 0:
                raise RuntimeError("streamed without injected KV")
            first = None
            async for line in response.aiter_lines():
                if first is None and line.startswith("data: {"):
                    first = time.perf_counter()
                if line == "data: [DONE]":
                    break
            else:
                raise RuntimeError("stream ended without [DONE]")
        self.tally.ttft_ms.append(1000 * ((first or time.perf_counter()) - start))

    async def _completion(self) -> None:
        data = await self._post("/v1/completions", {
            "model": self.model, "prompt": f"Client {self.index} keeps a", "temperature": 0,
            "max_tokens": self.args.max_tokens, "user": self.user_id,
            "memory": {"k": self.args.k}})
        self._check(data["memory"]["fact_ids"], [data["memory"]["user_id"]])

    async def verify(self) -> None:
        """The user's memories are its own, and every acknowledged one is there."""
        response = await self.http.get("/v1/memories", params={"user_id": self.user_id})
        results = response.json()["results"]
        self.tally.cross_user_facts += sum(r["user_id"] != self.user_id for r in results)
        self.tally.lost_facts += len(self.own - {int(r["id"]) for r in results})


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(samples)
    return ordered[max(0, min(len(ordered), math.ceil(q * len(ordered))) - 1)]


def stats(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {"n": 0}
    return {"n": len(samples), "p50_ms": percentile(samples, 0.50),
            "p99_ms": percentile(samples, 0.99), "mean_ms": sum(samples) / len(samples),
            "max_ms": max(samples)}


async def load(base_url: str, args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    limits = httpx.Limits(max_connections=args.clients + 8)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(base_url=base_url, timeout=args.timeout_s, limits=limits,
                                 headers=headers) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        before = await server_counters(http)
        tally = Tally()
        clients = [Client(http, i, args, model, tally) for i in range(args.clients)]
        start = time.perf_counter()
        await asyncio.gather(*(c.seed() for c in clients))
        seeded = time.perf_counter()
        await asyncio.gather(*(c.run() for c in clients))
        wall_s = time.perf_counter() - seeded
        await asyncio.gather(*(c.verify() for c in clients))
        after = await server_counters(http)
    mixed = sum(len(v) for k, v in tally.latencies_ms.items() if k != "seed")
    return {
        "latency": {kind: stats(samples) for kind, samples in sorted(tally.latencies_ms.items())},
        "stream_ttft": stats(tally.ttft_ms),
        "errors": dict(tally.errors), "num_errors": sum(tally.errors.values()),
        "error_samples": tally.error_samples,
        "cross_user_facts": tally.cross_user_facts, "lost_facts": tally.lost_facts,
        "checked_responses": tally.checked_responses,
        "seed_wall_s": seeded - start, "mixed_wall_s": wall_s,
        "mixed_requests_ok": mixed, "mixed_requests_per_s": mixed / wall_s,
        "server_counters_delta": {k: after.get(k, 0) - before.get(k, 0) for k in after},
    }


async def server_counters(http: Any) -> dict[str, float]:
    text = (await http.get("/metrics")).text
    return {name: float(value) for name, value in
            re.findall(r"^(inferscale_[a-z_]+) ([0-9.e+-]+)$", text, re.MULTILINE)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = {k: v for k, v in vars(args).items() if k != "api_key"}
    if args.base_url:
        results = asyncio.run(load(args.base_url, args))
    else:
        from tests.server.process import ServerProcess

        with tempfile.TemporaryDirectory() as folder:
            server = ServerProcess(Path(folder) / "load.db", Path(folder) / "server.log",
                                   model=args.model)
            server.start()
            try:
                results = asyncio.run(load(server.base_url, args))
            finally:
                server.stop()
        config["server"] = "started by the benchmark (tests/server/process.py settings)"
    record = {"benchmark": "server_load", "config": config, "environment": environment(),
              "results": results}
    name = f"server_load-{args.model}" + (f"-{args.tag}" if args.tag else "")
    path = write_record(name, record)
    print(json.dumps({k: results[k] for k in ("latency", "stream_ttft", "errors",
                                              "cross_user_facts", "lost_facts",
                                              "mixed_requests_per_s")}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
