"""A replica whose PostgreSQL store goes away: memory requests get 503 (retryable, never a 400
that blames the client), requests without memory and the health probe keep working, and once
the database is back the replica serves the same facts again, with nothing lost."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.pgserver import PostgresServer, unavailable_reason
from tests.server.process import KEYS, ServerProcess, keys_file

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

USER = "a:outage"


def _chat(http: httpx.Client, model: str, **memory) -> httpx.Response:
    return http.post("/v1/chat/completions", headers={"X-User-Id": USER}, json={
        "model": model, "max_tokens": 2, "temperature": 0, "memory": memory,
        "messages": [{"role": "user", "content": "Which notebook?"}]})


def test_a_database_outage_is_503_and_the_replica_recovers(tmp_path):
    if unavailable_reason():
        pytest.skip(unavailable_reason())
    with PostgresServer() as postgres:
        server = ServerProcess(postgres.url, tmp_path / "server.log",
                               api_keys=keys_file(tmp_path / "keys.json"),
                               admin_key=KEYS["admin"]).start()
        try:
            with httpx.Client(base_url=server.base_url, timeout=120, headers={
                    "Authorization": f"Bearer {KEYS['a']}"}) as http:
                model = http.get("/v1/models").json()["data"][0]["id"]
                added = _chat(http, model, k=2, add=["Outage keeps a blue notebook.",
                                                      "Outage keeps a red pen."])
                assert added.status_code == 200, added.text
                ids = {a["id"] for a in added.json()["memory"]["added"]}

                postgres.pause()
                down = _chat(http, model, k=2)
                assert down.status_code == 503, down.text
                assert down.json()["error"]["type"] == "service_unavailable"
                assert "postgres" in down.json()["error"]["message"].lower() or \
                    "database" in down.json()["error"]["message"].lower(), down.text
                refused = _chat(http, model, k=2, add=["Outage lost nothing."])
                assert refused.status_code == 503, refused.text
                assert _chat(http, model, enabled=False).status_code == 200  # no memory: served
                assert httpx.get(f"{server.base_url}/health").status_code == 200

                postgres.resume()
                deadline = time.monotonic() + 60
                while (back := _chat(http, model, k=2)).status_code != 200:
                    assert back.status_code == 503 and time.monotonic() < deadline, back.text
                    time.sleep(0.5)
                memory = back.json()["memory"]
                assert set(memory["fact_ids"]) == ids
                stored = http.get("/v1/memories", params={"user_id": USER}).json()["results"]
                assert {int(r["id"]) for r in stored} == ids  # the refused add stored nothing
        finally:
            server.stop()
