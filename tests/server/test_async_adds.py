"""Asynchronous adds through `inferscale serve`: REST async_mode (native and mem0 routes) and
event status, chat-borne adds (asynchronous by default) served before and after their KV is
ready, and 429 under a full queue (a server of its own with --max-queued-facts 1)."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.server.conftest import MAX_TOKENS, auth
from tests.server.process import KEYS, keys_file, running_server

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

WAIT_S = 120.0
"""A bound on waiting for the queue on a loaded machine, not a speed requirement."""


def _event(http: httpx.Client, path: str, tenant: str = "a") -> dict:
    """Poll an event until it is no longer PENDING or RUNNING."""
    deadline = time.monotonic() + WAIT_S
    while True:
        response = http.get(path, headers=auth(tenant))
        assert response.status_code == 200, response.text
        event = response.json()
        if event["status"] not in ("PENDING", "RUNNING") or time.monotonic() > deadline:
            return event
        time.sleep(0.2)


def _chat(user: str, question: str, **memory) -> dict:
    return {"messages": [{"role": "user", "content": question}], "max_tokens": MAX_TOKENS,
            "temperature": 0, "user": user, **({"memory": memory} if memory else {})}


def test_rest_async_mode_answers_at_once_with_an_event_per_fact(http, user_a):
    body = {"user_id": user_a, "texts": ["My boat is called Aurora.", "I fish on Sundays."],
            "async_mode": True}
    response = http.post("/v1/memories", json=body, headers=auth("a"))
    assert response.status_code == 200, response.text
    added = response.json()
    assert added["pending"] is True
    assert [(r["event"], r["status"]) for r in added["results"]] == [("ADD", "PENDING")] * 2
    assert all(r["event_id"] == str(r["id"]) for r in added["results"])
    listed = http.get("/v1/memories", params={"user_id": user_a}, headers=auth("a")).json()
    assert {r["id"] for r in listed["results"]} == {r["id"] for r in added["results"]}
    for result in added["results"]:  # stored at once, searchable once its event succeeded
        event = _event(http, f"/v1/memories/events/{result['event_id']}")
        assert event["status"] == "SUCCEEDED" and event["results"][0]["event"] == "ADD"
    found = http.post("/v1/memories/search", headers=auth("a"), json={
        "user_id": user_a, "query": "What is my boat called?", "top_k": 2}).json()["results"]
    assert {r["id"] for r in found} == {r["id"] for r in added["results"]}
    assert http.get(f"/v1/memories/events/{added['results'][0]['id']}",
                    headers=auth("b")).status_code == 404  # another tenant's event


def test_mem0_async_mode_and_its_event(http, user_a):
    response = http.post("/v3/memories/add/", headers={"Authorization": f"Token {KEYS['a']}"},
                         json={"messages": [{"role": "user", "content": "I own a red kayak."}],
                               "user_id": user_a, "async_mode": True})
    assert response.status_code == 200, response.text
    (result,) = response.json()["results"]
    assert result["status"] == "PENDING" and result["event_id"] == result["id"]
    event = _event(http, f"/v1/event/{result['event_id']}/")
    assert event["status"] == "SUCCEEDED" and event["event_type"] == "ADD"


def test_mem0_clients_default_add_infers_in_the_background(http, user_a):
    """mem0's client sends infer=True with async_mode=True: the message is stored at once,
    the served model reads it in the background, and the event says what it did."""
    token = {"Authorization": f"Token {KEYS['a']}"}
    response = http.post("/v3/memories/add/", headers=token, json={
        "messages": [{"role": "user", "content": "I moved to Porto in May."}],
        "user_id": user_a, "infer": True, "async_mode": True})
    assert response.status_code == 200, response.text
    (result,) = response.json()["results"]
    assert result["status"] == "PENDING" and result["memory"] == "I moved to Porto in May."
    event = _event(http, f"/v1/event/{result['event_id']}/")
    assert event["status"] == "SUCCEEDED", event
    listed = http.get("/v1/memories", params={"user_id": user_a}, headers=auth("a")).json()
    stored = {str(r["id"]) for r in listed["results"]}
    assert result["id"] not in stored  # the message row is gone: the model's facts stay
    for change in event["results"]:
        assert change["event"] in ("ADD", "UPDATE", "DELETE", "NONE")
        if change["event"] in ("ADD", "UPDATE"):
            assert change["id"] in stored
    assert http.get(f"/v1/event/{result['event_id']}/",
                    headers={"Authorization": f"Token {KEYS['b']}"}).status_code == 404


def test_a_chat_borne_add_is_served_at_once_then_from_kv(http, model, user_a):
    headers = {**auth("a"), "X-User-Id": user_a}
    fact = "My violin teacher is called Ottilie."
    first = http.post("/v1/chat/completions", headers=headers, json={
        **_chat(user_a, "Who teaches me the violin?", k=2, add=[fact]), "model": model})
    assert first.status_code == 200, first.text
    memory = first.json()["memory"]
    (added,) = memory["added"]
    assert added["event"] == "ADD" and added["status"] == "PENDING"
    assert added["id"] in memory["fact_ids"]  # in the answer already: as text
    assert memory["plan_status"] == "inject"  # beside the injected preamble
    event = _event(http, f"/v1/memories/events/{added['id']}")
    assert event["status"] == "SUCCEEDED"
    later = http.post("/v1/chat/completions", headers=headers, json={
        **_chat(user_a, "Who teaches me the violin?", k=2), "model": model}).json()["memory"]
    # the KV path (its preamble may already be in vLLM's prefix cache from the first turn,
    # which injected it beside the pending fact written as text)
    assert added["id"] in later["fact_ids"] and later["plan_status"] == "inject"


def test_a_full_queue_answers_429_and_stores_nothing(tmp_path, model, user_a):
    with running_server(tmp_path / "m.db", tmp_path / "server.log",
                        api_keys=keys_file(tmp_path / "keys.json"), admin_key=KEYS["admin"],
                        extra_args=["--max-queued-facts", "1"]) as server, httpx.Client(
            base_url=server.base_url, timeout=120) as http:
        headers = {**auth("a"), "X-User-Id": user_a}
        two = ["I have a green bike.", "I have a blue car."]
        refused = [
            http.post("/v1/memories", headers=auth("a"), json={
                "user_id": user_a, "texts": two, "async_mode": True}),
            http.post("/v1/chat/completions", headers=headers, json={
                **_chat(user_a, "What do I ride?", add=two), "model": model})]
        for response in refused:
            assert response.status_code == 429, response.text
            assert "max_queued_facts=1" in response.json()["error"]["message"]
        assert http.get("/v1/memories", params={"user_id": user_a},
                        headers=auth("a")).json()["results"] == []
        ok = http.post("/v1/chat/completions", headers=headers, json={
            **_chat(user_a, "What do I ride?", add=two[:1]), "model": model})
        assert ok.status_code == 200, ok.text
        assert [a["status"] for a in ok.json()["memory"]["added"]] == ["PENDING"]


def test_the_remote_client_adds_asynchronously(client_a, user_a):
    (result,) = client_a.add(user_id=user_a, texts=["My cello is called Bruno."], wait=False)
    assert (result.event, result.status) == ("ADD", "PENDING")
    deadline = time.monotonic() + WAIT_S
    while (status := client_a.add_status(user_id=user_a, fact_id=result.fact_id)).status in (
            "PENDING", "RUNNING") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (status.status, status.event) == ("SUCCEEDED", "ADD")
