"""Issue 54, items 3 and 5 through `inferscale serve`: the native /v1/memories routes take
agent_id / run_id as the mem0 routes do, and expiration_date reaches every REST surface (the
native and mem0 routes, MemoryClient, the inspector's API); an expired memory is never
returned; a bad expiration_date is a 400 that stores nothing."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from inferscale_integrations.client import MemoryServerError
from tests.server.conftest import auth

pytestmark = pytest.mark.vllm


def test_native_routes_take_agent_and_run_and_carry_expires_at(client_a, http, user_a):
    later = datetime.now(UTC) + timedelta(days=3)
    planned = client_a.add(user_id=user_a, texts=["I fly to Oslo on Friday."],
                           agent_id="planner", run_id="trip", expiration_date=later)
    client_a.add(user_id=user_a, texts=["I am allergic to peanuts."], agent_id="doctor")
    (fact,) = [r.fact_id for r in planned]
    mine = {m.fact_id: m for m in client_a.get_all(user_id=user_a)}
    assert mine[fact].agent_id == "planner" and mine[fact].run_id == "trip"
    assert mine[fact].expires_at == pytest.approx(later.timestamp())
    assert [m.expires_at for m in mine.values() if m.fact_id != fact] == [None]
    assert [m.fact_id for m in client_a.get_all(user_id=user_a, agent_id="planner")] == [fact]
    assert client_a.get_all(user_id=user_a, run_id="other") == []
    found = client_a.search(user_id=user_a, query="Where do I fly?", k=5, agent_id="planner")
    assert [(m.fact_id, m.run_id) for m in found] == [(fact, "trip")]
    assert found[0].expires_at == pytest.approx(later.timestamp())
    assert client_a.get(user_id=user_a, fact_id=fact).expires_at == pytest.approx(
        later.timestamp())
    ui = http.get("/ui/api/memories", params={"user_id": user_a}, headers=auth("a")).json()
    assert {m["id"]: m["expires_at"] for m in ui["memories"]}[fact] == pytest.approx(
        later.timestamp())
    conflict = http.post("/v1/memories/search", headers=auth("a"), json={
        "query": "x", "user_id": user_a, "agent_id": "planner",
        "filters": {"agent_id": "doctor"}})
    assert conflict.status_code == 400 and "differ" in conflict.text
    gone = http.delete("/v1/memories", params={"user_id": user_a, "agent_id": "doctor"},
                       headers=auth("a"))  # a scoped delete needs no admin key
    assert gone.status_code == 200 and gone.json()["deleted"] == 1
    assert [m.fact_id for m in client_a.get_all(user_id=user_a)] == [fact]


def test_an_expired_memory_is_never_returned(client_a, http, user_a):
    (kept,) = client_a.add(user_id=user_a, texts=["The door is painted green."])
    (soon,) = client_a.add(user_id=user_a, texts=["The door code is 4417."],
                           expiration_date=time.time() + 15)  # adds take seconds on the CPU
    assert {m.fact_id for m in client_a.get_all(user_id=user_a)} == {soon.fact_id, kept.fact_id}
    deadline = time.monotonic() + 90
    while len(client_a.get_all(user_id=user_a)) > 1:
        assert time.monotonic() < deadline, "the memory did not expire"
        time.sleep(0.5)
    assert [m.fact_id for m in client_a.search(user_id=user_a, query="door code", k=5)] == [
        kept.fact_id]
    with pytest.raises(MemoryServerError) as caught:
        client_a.get(user_id=user_a, fact_id=soon.fact_id)
    assert caught.value.status == 404
    listed = http.post("/v3/memories/", headers=auth("a"),
                       json={"filters": {"user_id": user_a}}).json()
    assert [r["id"] for r in listed["results"]] == [str(kept.fact_id)]


def test_mem0_routes_take_and_return_expiration_date(http, user_a):
    added = http.post("/v3/memories/add/", headers=auth("a"), json={
        "messages": [{"role": "user", "content": "My passport expires in June."}],
        "user_id": user_a, "agent_id": "travel", "expiration_date": "2099-06-30"})
    assert added.status_code == 200, added.text
    (memory_id,) = [r["id"] for r in added.json()["results"]]
    one = http.get(f"/v1/memories/{memory_id}/", headers=auth("a")).json()
    assert one["expiration_date"] == "2099-07-01T00:00:00+00:00"  # when that day ends, UTC
    assert one["agent_id"] == "travel"


@pytest.mark.parametrize("bad", ["2001-01-01", "soon", True])
def test_a_bad_expiration_date_is_a_400_and_stores_nothing(http, user_a, bad):
    for path, body in [("/v1/memories", {"texts": ["A fact that must not be stored."]}),
                       ("/v3/memories/add/", {"messages": "A fact that must not be stored."})]:
        answer = http.post(path, headers=auth("a"),
                           json={**body, "user_id": user_a, "expiration_date": bad})
        assert answer.status_code in (400, 422), answer.text
        assert "expiration_date" in answer.text
    listed = http.get("/v1/memories", params={"user_id": user_a}, headers=auth("a")).json()
    assert listed["results"] == []


def test_a_chat_borne_add_takes_expiration_date(http, model, client_a, user_a):
    headers = {**auth("a"), "X-User-Id": user_a}

    def chat(memory: dict) -> httpx.Response:
        return http.post("/v1/chat/completions", headers=headers, json={
            "model": model, "messages": [{"role": "user", "content": "Which gate?"}],
            "max_tokens": 2, "temperature": 0, "memory": memory})

    answered = chat({"add": ["My flight leaves from gate 12."], "expiration_date": "2099-06-30"})
    assert answered.status_code == 200, answered.text
    (added,) = [a["id"] for a in answered.json()["memory"]["added"]]
    (stored,) = client_a.get_all(user_id=user_a)
    assert stored.fact_id == added and stored.expires_at == pytest.approx(
        datetime(2099, 7, 1, tzinfo=UTC).timestamp())  # when that day ends, UTC
    for memory, words in [
            ({"add": ["Not stored."], "expiration_date": "soon"}, "not an ISO 8601"),
            ({"add": ["Not stored."], "expiration_date": "2001-01-01"}, "expiration_date"),
            ({"expiration_date": "2099-06-30"}, "send it with memory.add")]:
        refused = chat(memory)
        assert refused.status_code == 400 and words in refused.text, refused.text
    assert [m.fact_id for m in client_a.get_all(user_id=user_a)] == [added]
