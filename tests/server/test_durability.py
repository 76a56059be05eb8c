"""SIGKILL `inferscale serve` while clients add memories: after a restart on the same database,
every acknowledged memory is there and served as injected KV."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from inferscale_integrations.client import MemoryClient, MemoryServerError
from tests.server.conftest import auth, metric, wait_metric
from tests.server.process import KEYS

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

NUM_WRITERS = 4


def _writer(server, user_id: str, acked: list[tuple[int, str]], stop: threading.Event) -> None:
    """Add one fact per call until the server goes away; keep what it acknowledged."""
    with MemoryClient(server.base_url, KEYS["a"], timeout_s=30) as client:
        for n in range(10_000):
            if stop.is_set():
                return
            text = f"{user_id} remembers durable fact number {n} about tea."
            try:
                (result,) = client.add(user_id=user_id, texts=[text])
            except (MemoryServerError, httpx.HTTPError):
                return  # the server was killed: this write was never acknowledged
            acked.append((int(result.fact_id), text))


def test_acknowledged_memories_survive_sigkill(server, user_a):
    if server.attached:
        pytest.skip("needs a server this test starts and kills (unset INFERSCALE_TEST_SERVER)")
    users = [f"{user_a}-{i}" for i in range(NUM_WRITERS)]
    acked: dict[str, list[tuple[int, str]]] = {u: [] for u in users}
    stop = threading.Event()
    writers = [threading.Thread(target=_writer, args=(server, u, acked[u], stop))
               for u in users]
    for writer in writers:
        writer.start()
    deadline = time.monotonic() + 120
    while min(len(a) for a in acked.values()) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    server.kill()  # mid-flight: some adds are in progress
    stop.set()
    for writer in writers:
        writer.join(timeout=60)
    assert min(len(a) for a in acked.values()) >= 3, "the writers never got going"

    server.start()  # same port, same database
    resident = wait_metric(server, "inferscale_resident_facts",
                           sum(len(a) for a in acked.values()))
    assert resident >= sum(len(a) for a in acked.values())
    before = metric(server, "inferscale_injected_tokens_total")
    with MemoryClient(server.base_url, KEYS["a"]) as client:
        for user_id, facts in acked.items():
            stored = {int(f.fact_id): f.text for f in client.get_all(user_id=user_id)}
            assert dict(facts).items() <= stored.items(), "an acknowledged memory was lost"
            # ...and served as KV: a request retrieving all of the user's facts injects them.
            response = httpx.post(f"{server.base_url}/v1/chat/completions", headers=auth("a"),
                                  timeout=60, json={
                "messages": [{"role": "user", "content": "What do I remember about tea?"}],
                "max_tokens": 1, "user": user_id, "memory": {"k": len(stored)}})
            assert response.status_code == 200, response.text
            memory = response.json()["memory"]
            assert memory["plan_status"] == "inject" and memory["injected_tokens"] > 0
            assert {f for f, _ in facts} <= set(memory["fact_ids"])
    assert wait_metric(server, "inferscale_injected_tokens_total", before + 1) > before
