"""One tenant's maximal add does not stall another tenant's chats.

Tenant A posts the largest add the server takes (--max-add-facts). The add stores every fact in
one transaction, then encodes their KV in chunks that yield to chats between them
(memory/gate.py). Once A's facts are stored and the add is still encoding, tenant B chats, one
chat after another, until the add returns. Asserted on the structure of the run, not on the
machine's speed (which may be a loaded 2-core box or a GPU host): B's chats complete while the
add is still in flight, and B's worst chat takes a small fraction of the add's time. A chat
that waited behind the whole add would complete only after it, and take about its time.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.conftest import FACTS
from tests.server.conftest import MAX_TOKENS, auth
from tests.server.process import TEST_FLAGS

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

MAX_ADD = int(TEST_FLAGS[TEST_FLAGS.index("--max-add-facts") + 1])
SERVED_DURING = 2
"""B's chats that must complete while A's add is in flight."""
FRACTION = 4
"""B's worst chat takes at most 1/FRACTION of A's add: it waited for a chunk at most, not for
the add (the chunk is one of many: the add is MAX_ADD facts in chunks of a fraction of a
second of work each)."""


def _chat(http: httpx.Client, model: str, user: str) -> tuple[float, float]:
    """(start, end) of one chat of B's with memory."""
    start = time.perf_counter()
    response = http.post("/v1/chat/completions", headers=auth("b"), json={
        "model": model, "user": user, "max_tokens": MAX_TOKENS, "temperature": 0,
        "messages": [{"role": "user", "content": "Who has two cats?"}]})
    end = time.perf_counter()
    assert response.status_code == 200, response.text
    # Served from the user's memory (a repeat finds its blocks in vLLM's prefix cache: then
    # fewer tokens, or none, are injected).
    assert response.json()["memory"]["facts"] > 0
    return start, end


def test_a_maximal_add_leaves_other_tenants_chats_served(server, model, user_a, user_b):
    texts = [f"Note {i}: the meeting about project {i % 37} moved to room {i % 11}."
             for i in range(MAX_ADD)]
    add: dict[str, float] = {}
    with httpx.Client(base_url=server.base_url, timeout=600) as http:
        assert http.post("/v1/memories", headers=auth("b"), json={
            "user_id": user_b, "texts": FACTS}).status_code == 200
        for _ in range(2):  # warm-up
            _chat(http, model, user_b)

        def post_add() -> None:
            with httpx.Client(base_url=server.base_url, timeout=600) as own:
                add["start"] = time.perf_counter()
                response = own.post("/v1/memories", headers=auth("a"),
                                    json={"user_id": user_a, "texts": texts})
                add["end"] = time.perf_counter()
                add["status"] = response.status_code

        adder = threading.Thread(target=post_add)
        adder.start()
        # the add is in flight once its facts are stored (one transaction) and it has not
        # returned: it is encoding them, chunk by chunk
        while adder.is_alive() and len(http.get(
                "/v1/memories", params={"user_id": user_a},
                headers=auth("a")).json()["results"]) < MAX_ADD:
            time.sleep(0.05)
        chats = []
        while adder.is_alive():
            chats.append(_chat(http, model, user_b))
        adder.join()
        assert add["status"] == 200
        assert len(http.get("/v1/memories", params={"user_id": user_a},
                            headers=auth("a")).json()["results"]) == MAX_ADD

    add_s = add["end"] - add["start"]
    during = [end - start for start, end in chats if end < add["end"]]
    worst = max((end - start for start, end in chats), default=0.0)
    report = (f"\nfairness: A added {MAX_ADD} facts in {add_s:.2f} s; B chatted {len(chats)} "
              f"times while it encoded, {len(during)} completed before it returned; B's worst "
              f"chat {worst:.3f} s ({worst / add_s:.3f} of the add)")
    print(report)
    assert len(during) >= SERVED_DURING, report  # B was served during the add, not after it
    assert worst <= add_s / FRACTION, report  # and never waited for the add
