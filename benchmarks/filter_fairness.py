"""Tenant B's chats while tenant A sends the largest filters the server allows (issue 52).

Tenant A's user holds --a-facts facts with metadata; B's user a few facts. First B chats alone
(--chats chats with memory, one after another: "idle"); then A's --clients clients send
`POST /v3/memories/search/` with the largest filter the limits allow, back to back, while B
chats the same way ("busy"). The filter is the costliest to evaluate within the limits
(memory/search/filters.py): an OR of as many single-field conditions as MAX_FILTER_NODES allows,
none of which matches, so every one is evaluated against each of A's facts. The record has
B's latency (median, p90, p99, max) idle and busy, and A's search latency and count. Nothing
here asserts anything about speed.

  python benchmarks/filter_fairness.py                       # starts its own server (tiny)
  python benchmarks/filter_fairness.py --clients 8 --chats 200 --a-facts 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import environment, summarize, write_tagged  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="what the server serves (tiny, small)")
    parser.add_argument("--clients", type=int, default=8, help="A's concurrent filter clients")
    parser.add_argument("--chats", type=int, default=100, help="B's chats per phase")
    parser.add_argument("--a-facts", type=int, default=200, help="facts of A's user")
    parser.add_argument("--max-tokens", type=int, default=3, help="of B's chats")
    parser.add_argument("--tag", default="")
    return parser.parse_args(argv)


def largest_filter(user_id: str) -> dict[str, Any]:
    """The costliest filter within the limits: an OR of single-field conditions, no match."""
    from inferscale_engine.memory.search.filters import MAX_FILTER_LIST, MAX_FILTER_NODES

    # the filter, its user id and OR list count 3 values; each part 2 (its mapping, its value)
    parts = min(MAX_FILTER_LIST, (MAX_FILTER_NODES - 3) // 2)
    return {"user_id": user_id, "OR": [{"topic": f"absent-{i}"} for i in range(parts)]}


async def run(base_url: str, keys: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from tests.conftest import FACTS

    user_a, user_b = "a:filter-bench", "b:filter-bench"
    auth = {t: {"Authorization": f"Bearer {keys[t]}"} for t in ("a", "b")}
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:
        texts = [f"Note {i}: project {i % 37} meets in room {i % 11}." for i in range(
            args.a_facts)]
        for lo in range(0, len(texts), 100):
            added = await http.post("/v1/memories", headers=auth["a"], json={
                "user_id": user_a, "texts": texts[lo:lo + 100], "metadata": {"topic": "notes"}})
            added.raise_for_status()
        (await http.post("/v1/memories", headers=auth["b"], json={
            "user_id": user_b, "texts": FACTS})).raise_for_status()
        model = (await http.get("/v1/models", headers=auth["b"])).json()["data"][0]["id"]
        body = {"model": model, "user": user_b, "max_tokens": args.max_tokens,
                "temperature": 0, "messages": [{"role": "user", "content": "Who has cats?"}]}

        async def chats() -> list[float]:
            out = []
            for _ in range(args.chats):
                start = time.perf_counter()
                response = await http.post("/v1/chat/completions", headers=auth["b"],
                                           json=body)
                out.append((time.perf_counter() - start) * 1e3)
                response.raise_for_status()
            return out

        for _ in range(5):  # warm-up
            (await http.post("/v1/chat/completions", headers=auth["b"], json=body)
             ).raise_for_status()
        idle = await chats()

        search = {"query": "Which room?", "filters": largest_filter(user_a), "top_k": 5}
        searches: list[float] = []
        stop = asyncio.Event()

        async def filters() -> None:
            async with httpx.AsyncClient(base_url=base_url, timeout=600) as own:
                while not stop.is_set():
                    start = time.perf_counter()
                    response = await own.post("/v3/memories/search/", headers=auth["a"],
                                              json=search)
                    response.raise_for_status()
                    searches.append((time.perf_counter() - start) * 1e3)

        clients = [asyncio.create_task(filters()) for _ in range(args.clients)]
        await asyncio.sleep(1.0)  # A's filters are under way
        busy = await chats()
        stop.set()
        await asyncio.gather(*clients)
    return {"b_chat_idle": summarize(idle), "b_chat_busy": summarize(busy),
            "a_filtered_search": summarize(searches),
            "filter_bytes": len(json.dumps(search["filters"])),
            "filter_conditions": len(search["filters"]["OR"])}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tests.server.process import KEYS, TEST_FLAGS, ServerProcess, keys_file

    load_before = os.getloadavg()  # a shared machine: what else ran is part of the number
    with tempfile.TemporaryDirectory() as folder:
        server = ServerProcess(Path(folder) / "bench.db", Path(folder) / "server.log",
                               model=args.model, api_keys=keys_file(Path(folder) / "keys.json"),
                               admin_key=KEYS["admin"], extra_args=TEST_FLAGS)
        server.start()
        try:
            results = asyncio.run(run(server.base_url, KEYS, args))
        finally:
            server.stop()
    results["load_average"] = {"before": load_before, "after": os.getloadavg()}
    record = {"benchmark": "filter_fairness", "config": vars(args),
              "environment": environment(), "results": results}
    print(json.dumps(results, indent=1))
    write_tagged(f"filter_fairness-{args.model}", args.tag, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
