"""Pinned memories through `inferscale serve`: `pinned` on POST /v1/memories and PUT
/v1/memories/{id}, in every returned record, MemoryClient and the inspector's API; a pinned
memory is the first fact of every chat answer of its user (and of no other user's)."""

from __future__ import annotations

import pytest

from tests.server.conftest import MAX_TOKENS, auth

pytestmark = pytest.mark.vllm


def _chat(user: str, question: str) -> dict:
    return {"messages": [{"role": "user", "content": question}], "max_tokens": MAX_TOKENS,
            "temperature": 0, "user": user, "memory": {"k": 1}}


def test_pinned_round_trips_through_the_native_routes(http, client_a, user_a):
    added = http.post("/v1/memories", headers=auth("a"), json={
        "user_id": user_a, "texts": ["My name is Ottilie Brandt."], "pinned": True})
    assert added.status_code == 200, added.text
    (pin,) = [r["id"] for r in added.json()["results"]]
    (plain,) = client_a.add(user_id=user_a, texts=["I keep bees."])
    listed = http.get("/v1/memories", params={"user_id": user_a}, headers=auth("a")).json()
    assert {r["id"]: r["pinned"] for r in listed["results"]} == {pin: True,
                                                                 plain.fact_id: False}
    assert http.get(f"/v1/memories/{pin}", headers=auth("a")).json()["pinned"] is True
    assert {m.fact_id: m.pinned for m in client_a.get_all(user_id=user_a)}[pin] is True
    ui = http.get("/ui/api/memories", params={"user_id": user_a}, headers=auth("a")).json()
    assert {m["id"]: m["pinned"] for m in ui["memories"]} == {pin: True, plain.fact_id: False}
    unpinned = http.put(f"/v1/memories/{pin}", headers=auth("a"), json={"pinned": False})
    assert unpinned.status_code == 200 and unpinned.json()["pinned"] is False
    repinned = http.put(f"/v1/memories/{plain.fact_id}", headers=auth("a"),
                        json={"pinned": True})
    assert repinned.status_code == 200 and repinned.json()["pinned"] is True
    assert repinned.json()["memory"] == "I keep bees."


def test_bad_pinned_values_are_400s_that_change_nothing(http, user_a):
    bad = http.post("/v1/memories", headers=auth("a"), json={
        "user_id": user_a, "texts": ["I like figs."], "pinned": "yes"})
    assert bad.status_code in (400, 422), bad.text
    assert http.get("/v1/memories", params={"user_id": user_a},
                    headers=auth("a")).json()["results"] == []
    (fact,) = http.post("/v1/memories", headers=auth("a"), json={
        "user_id": user_a, "texts": ["I like figs."]}).json()["results"]
    empty = http.put(f"/v1/memories/{fact['id']}", headers=auth("a"), json={})
    assert empty.status_code == 400 and "pinned" in empty.text


def test_a_pinned_memory_leads_every_answer_of_its_user_only(http, model, user_a, user_b):
    (pin,) = [r["id"] for r in http.post("/v1/memories", headers=auth("a"), json={
        "user_id": user_a, "texts": ["I am allergic to peanuts."], "pinned": True,
    }).json()["results"]]
    http.post("/v1/memories", headers=auth("a"), json={
        "user_id": user_a, "texts": ["My bike is blue.", "I live by the sea."]})
    http.post("/v1/memories", headers=auth("b"), json={
        "user_id": user_b, "texts": ["My bike is red."]})
    served = http.post("/v1/chat/completions", headers={**auth("a"), "X-User-Id": user_a},
                       json={**_chat(user_a, "What colour is my bike?"), "model": model})
    assert served.status_code == 200, served.text
    memory = served.json()["memory"]
    assert memory["fact_ids"][0] == pin and len(memory["fact_ids"]) == 2  # pinned + k=1
    other = http.post("/v1/chat/completions", headers={**auth("b"), "X-User-Id": user_b},
                      json={**_chat(user_b, "What colour is my bike?"), "model": model})
    assert pin not in other.json()["memory"]["fact_ids"]
