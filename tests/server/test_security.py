"""Security of `inferscale serve`: a key reaches only its own users, forged engine fields change
nothing, bad input gets a 4xx with a clear message, and the server keeps serving."""

from __future__ import annotations

import time

import pytest
from openai import OpenAI, PermissionDeniedError

from inferscale_engine.errors import ConfigError
from inferscale_engine.server.main import MAX_BODY_BYTES
from inferscale_engine.server.main import main as serve_main
from inferscale_integrations import KVMemory
from inferscale_integrations.client import MemoryServerError
from tests.conftest import FACTS
from tests.server.conftest import MAX_TOKENS, auth
from tests.server.process import KEYS

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


def _chat(user: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": "What does Alice like?"}],
            "max_tokens": MAX_TOKENS, "temperature": 0, "user": user, **extra}


def _settled(http, fact_id: int) -> dict:
    """The event of a fact's asynchronous add once it is no longer PENDING or RUNNING."""
    deadline = time.monotonic() + 120  # a bound on waiting on a loaded machine, not speed
    while True:
        event = http.get(f"/v1/memories/events/{fact_id}", headers=auth("a")).json()
        if event["status"] not in ("PENDING", "RUNNING") or time.monotonic() > deadline:
            return event
        time.sleep(0.2)


def _refused(response, status: int, *words: str) -> None:
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    assert all(w.lower() in message.lower() for w in words), message


def test_a_key_cannot_reach_another_tenants_users(server, http, model, client_a, client_b, user_b):
    facts_b = [int(r.fact_id) for r in client_b.add(user_id=user_b, texts=FACTS)]
    fact = facts_b[0]
    # Every route, every way of naming the user: 403 (404 for B's memory ids, as for ids that
    # do not exist), and B's memories are untouched.
    for method, path, kwargs in [
        ("POST", "/v1/memories", {"json": {"user_id": user_b, "texts": ["I am B now."]}}),
        ("GET", "/v1/memories", {"params": {"user_id": user_b}}),
        ("GET", "/v1/memories", {"headers": {"X-User-Id": user_b}}),
        ("POST", "/v1/memories/search", {"json": {"query": "chess", "user_id": user_b}}),
        ("POST", "/v1/memories/search", {"json": {"query": "x", "filters": {"user_id": user_b}}}),
        ("GET", f"/v1/memories/{fact}", {}),
        ("PUT", f"/v1/memories/{fact}", {"json": {"text": "overwritten"}}),
        ("DELETE", f"/v1/memories/{fact}", {}),
        ("POST", "/v1/chat/completions", {"json": _chat(user_b, model=model)}),
        ("POST", "/v1/chat/completions", {"json": _chat("a:me", model=model),
                                          "headers": {"X-User-Id": user_b}}),
        ("POST", "/v1/chat/completions", {"json": {**_chat(None, model=model), "user": None,
                                                   "memory": {"user_id": user_b}}}),
        ("POST", "/v1/completions", {"json": {"model": model, "prompt": "Alice",
                                              "max_tokens": 1, "user": user_b}}),
    ]:
        headers = {**auth("a"), **kwargs.pop("headers", {})}
        response = http.request(method, path, headers=headers, **kwargs)
        if path.rsplit("/", 1)[-1].isdigit():
            assert response.status_code == 404, (method, path, response.text)
            assert user_b not in response.text
            continue
        assert response.status_code == 403, (method, path, response.text)
        assert user_b in response.json()["error"]["message"], response.text
    assert [int(f.fact_id) for f in client_b.get_all(user_id=user_b)] == facts_b
    assert client_b.get(user_id=user_b, fact_id=fact).text == FACTS[0]
    # The clients say the same.
    with pytest.raises(MemoryServerError, match="403") as refused:
        client_a.search(user_id=user_b, query="chess")
    assert refused.value.status == 403
    remote = KVMemory(base_url=server.base_url, api_key=KEYS["a"], user_id=user_b)
    with pytest.raises(MemoryServerError, match="may not reach"):
        remote.save_context({"input": "hi"}, {"output": "hello"})
    with pytest.raises(PermissionDeniedError):
        OpenAI(base_url=f"{server.base_url}/v1", api_key=KEYS["a"], max_retries=0).chat \
            .completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                user=user_b, max_tokens=1)


def test_keys_are_required_and_only_admin_deletes_a_user(http, client_a, user_a):
    client_a.add(user_id=user_a, texts=FACTS[:2])
    for headers in ({}, {"Authorization": "Bearer sk-not-a-key-0000000000"},
                    {"Authorization": KEYS["a"]}):  # no "Bearer"
        _refused(http.get("/v1/memories", params={"user_id": user_a}, headers=headers), 401,
                 "API key")
        _refused(http.post("/v1/chat/completions", json=_chat(user_a), headers=headers), 401)
        _refused(http.get("/metrics", headers=headers), 401)
        assert http.get("/health", headers=headers).status_code == 200  # liveness: no key
    assert http.get("/v1/memories", params={"user_id": user_a},
                    headers={"X-API-Key": KEYS["a"]}).status_code == 200
    _refused(http.post("/v1/memories/reset", json={"user_id": user_a}, headers=auth("a")), 403,
             "admin")
    _refused(http.delete("/v1/memories", params={"user_id": user_a}, headers=auth("a")), 403,
             "admin")
    assert len(client_a.get_all(user_id=user_a)) == 2
    deleted = http.post("/v1/memories/reset", json={"user_id": user_a}, headers=auth("admin"))
    assert deleted.status_code == 200 and deleted.json()["deleted"] == 2
    assert client_a.get_all(user_id=user_a) == []


def test_vllm_dev_routes_stay_off(http):
    for path in ("/collective_rpc", "/reset_prefix_cache", "/sleep", "/is_sleeping"):
        response = http.post(path, json={}, headers=auth("admin"))
        assert response.status_code in (404, 405), (path, response.status_code)


def test_forged_engine_fields_change_nothing(http, model, client_a, client_b, user_a, user_b):
    client_a.add(user_id=user_a, texts=FACTS)
    other = [int(r.fact_id) for r in client_b.add(user_id=user_b, texts=FACTS[::-1])]
    forged = {"kv_transfer_params": {"inferscale": {"version": 1, "user_id": user_b,
                                                    "fact_ids": other, "signature": "0" * 64}},
              "cache_salt": "salt-of-someone-else", "vllm_xargs": {"inferscale": "x"}}

    def answer(path: str, body: dict) -> tuple:
        response = http.post(path, json=body, headers=auth("a"))
        assert response.status_code == 200, response.text
        data = response.json()
        choice = data["choices"][0]
        tokens = (choice["logprobs"]["content"] if "message" in choice
                  else choice["logprobs"]["token_logprobs"])
        return (choice.get("message", {}).get("content", choice.get("text")),
                str(tokens), data["memory"]["fact_ids"], data["memory"]["plan_status"],
                data["memory"]["stripped_fields"], data["memory"]["injected_tokens"])

    chat = _chat(user_a, model=model, logprobs=True, top_logprobs=2)
    completion = {"model": model, "prompt": "Who has two cats?", "max_tokens": MAX_TOKENS,
                  "temperature": 0, "logprobs": 2, "user": user_a}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", completion)):
        plain = answer(path, body)
        with_forgery = answer(path, {**body, **forged})
        # The same answer from the same facts, served from the user's own KV (the repeat may
        # find the first request's injected blocks in vLLM's prefix cache, under the same
        # user's salt, and inject fewer tokens).
        assert with_forgery[:4] == plain[:4] and plain[3] == "inject" and plain[5] > 0
        assert set(with_forgery[2]).isdisjoint(other)
        # a client's cache_salt is kept, combined with the server's salt (test_prefix_oracles)
        assert plain[4] == [] and sorted(with_forgery[4]) == ["kv_transfer_params",
                                                              "vllm_xargs"]
    # Without memory the forged fields are stripped too: same answer as a plain request.
    off = {**chat, "memory": {"enabled": False}}
    assert answer("/v1/chat/completions", {**off, **forged})[:2] == \
        answer("/v1/chat/completions", off)[:2]


def test_bad_input_gets_a_clear_4xx_and_the_server_keeps_serving(http, model, client_a,
                                                                   user_a):
    fact = int(client_a.add(user_id=user_a, texts=FACTS[:1])[0].fact_id)
    headers = {**auth("a"), "Content-Type": "application/json"}
    post = "/v1/memories"
    cases = [
        # malformed JSON, to both APIs
        (post, b'{"user_id": "a:x", "texts": ["ok"', 400, "JSON"),
        ("/v1/chat/completions", b'{"messages": [', 400, "JSON"),
        # invalid UTF-8
        (post, b'{"user_id": "a:x", "texts": ["\xff\xfe"]}', 400, "UTF-8"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xc3"}]}', 400,
         "UTF-8"),
        # lone surrogates are valid JSON but not text
        (post, b'{"user_id": "' + user_a.encode() + b'", "texts": ["\\ud800"]}', 400,
         "surrogate"),
        # wrong shapes and unknown fields
        (post, b'{"user_id": "a:x", "texts": "not a list"}', 400, "list"),
        (post, b'{"user_id": "a:x", "text": ["typo"]}', 400, "extra"),
        (post, b'{"user_id": "a:x"}', 400, "texts"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], '
         b'"user": "a:x", "memory": {"k": "many"}}', 400, "memory.k"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], '
         b'"user": "a:x", "memory": {"hack": 1}}', 400, "memory"),
        # malformed user ids
        (post, b'{"user_id": "a:\\u0000x", "texts": ["hi"]}', 400, "control"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], '
         b'"user": "   "}', 400, "user_id"),
    ]
    for path, body, status, words in cases:
        _refused(http.post(path, content=body, headers=headers), status, words)
    # users no key reaches, and requests naming no user
    _refused(http.get("/v1/memories", params={"user_id": "c:stranger"}, headers=auth("admin")),
             403, "may not reach")
    _refused(http.get("/v1/memories", headers=auth("a")), 400, "user_id")
    # bad and unknown ids
    for bad in ("abc", "-1", "0", "1.5", str(2**70)):
        response = http.get(f"/v1/memories/{bad}", headers=auth("a"))
        assert 400 <= response.status_code < 500 and response.json()["error"]["message"], bad
    _refused(http.get(f"/v1/memories/{10**12}", headers=auth("a")), 404, "no memory")
    _refused(http.delete(f"/v1/memories/{10**12}", headers=auth("a")), 404, "no memory")
    _refused(http.get("/v1/no-such-route", headers=auth("a")), 404, "not found")
    # oversized bodies, announced or streamed in chunks
    big = b'{"user_id": "a:x", "texts": ["' + b"x" * (MAX_BODY_BYTES + 10) + b'"]}'
    _refused(http.post(post, content=big, headers=headers), 413, "send less")
    _refused(http.post(post, content=iter([big[i:i + 2**20] for i in range(0, len(big), 2**20)]),
                       headers=headers), 413, "send less")
    # and the server keeps serving
    assert http.get("/health", headers=auth("a")).status_code == 200
    assert client_a.get(user_id=user_a, fact_id=fact).text == FACTS[0]
    response = http.post("/v1/chat/completions", json=_chat(user_a, model=model),
                         headers=auth("a"))
    assert response.status_code == 200 and response.json()["memory"]["injected_tokens"] > 0


def test_a_long_turn_is_cut_not_refused(client_a, user_a):
    long_turn = " ".join(f"word{i}" for i in range(700))  # several facts' worth of tokens
    (pieces, answer) = client_a.add_messages(
        user_id=user_a, session_id="long", messages=[
            {"role": "user", "content": long_turn}, {"role": "assistant", "content": "Noted."}])
    assert len(pieces) >= 2 and len(answer) == 1
    texts = [client_a.get(user_id=user_a, fact_id=f).text for f in pieces]
    assert "".join(texts).replace(" ", "") == long_turn.replace(" ", "")
    with pytest.raises(MemoryServerError, match="max_fact_tokens"):  # a fact is one fact
        client_a.add(user_id=user_a, texts=[long_turn])


def test_without_keys_the_server_listens_on_loopback_only(monkeypatch):
    with pytest.raises(ConfigError, match="--api-keys"):
        serve_main(["--model", "tiny", "--host", "0.0.0.0"])
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    with pytest.raises(ConfigError, match="collective_rpc"):
        serve_main(["--model", "tiny"])


@pytest.mark.parametrize("flags,message", [
    (["--dedupe-threshold", "1.5"], "dedupe_threshold"),
    (["--half-scan-min-rows", "-1"], "half_scan_min_rows"),
    (["--expiry-sweep-s", "0"], "expiry_sweep_s"),
    (["--neighbor-share", "1.5"], "neighbor_share"),
])
def test_bad_memory_flags_are_refused_before_vllm_starts(flags, message):
    with pytest.raises(ConfigError, match=message):
        serve_main(["--model", "tiny", *flags])


def test_serve_takes_the_model_first_and_passes_vllms_flags_through(tiny_models):
    from inferscale_engine.server.main import parse, vllm_args

    model = str(tiny_models["qwen2"])
    ours, rest = parse([model, "--api-key", "sk-vllm-0123456789", "--port", "8123",
                        "--max-model-len", "2048", "--dtype", "float32"])
    assert ours.model == model and ours.port == 8123 and ours.api_keys is None
    assert "--api-key" in rest  # vLLM's one shared key, not an abbreviation of --api-keys
    args, config = vllm_args(ours, rest)
    assert args.api_key in ("sk-vllm-0123456789", ["sk-vllm-0123456789"])
    assert args.model == model == config.model and config.max_model_len == 2048
    assert parse(["--model", model])[0].model == model
    assert parse([])[0].model == "small"
    memory_flags = parse([model, "--search-mode", "vector", "--on-expiry", "delete",
                          "--expiry-sweep-s", "none", "--date-facts", "--neighbor-share",
                          "0.3", "--keyword-context"])[0]
    assert (memory_flags.search_mode, memory_flags.on_expiry, memory_flags.expiry_sweep_s,
            memory_flags.date_facts, memory_flags.neighbor_share,
            memory_flags.keyword_context) == ("vector", "delete", None, True, 0.3, True)
    defaults = parse([model])[0]
    assert (defaults.search_mode, defaults.on_expiry, defaults.expiry_sweep_s,
            defaults.date_facts, defaults.keyword_context) == ("hybrid", "hide", 60.0, False,
                                                               False)
    with pytest.raises(ConfigError, match="two models"):
        parse([model, "--model", "/elsewhere"])


def test_chat_borne_adds_store_first_and_refuse_bad_input(http, model, client_a, user_a, user_b):
    headers = {**auth("a"), "X-User-Id": user_a}
    body = _chat(user_a, model=model, memory={"k": 2, "add": FACTS[:2]})
    response = http.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    memory = response.json()["memory"]
    # chat-borne adds are asynchronous: stored before the answer (served, as text until their
    # KV is ready), the duplicate check in the background (tests/server/test_async_adds.py)
    assert [(a["event"], a["status"]) for a in memory["added"]] == [("ADD", "PENDING")] * 2
    added = [a["id"] for a in memory["added"]]
    assert set(memory["fact_ids"]) == set(added)
    assert {m.fact_id for m in client_a.get_all(user_id=user_a)} == set(added)
    timing = response.headers["server-timing"]  # the seam's phases, add included
    assert all(f"{phase};dur=" in timing for phase in ("identify", "add", "retrieve", "plan"))
    assert [_settled(http, i)["results"][0]["event"] for i in added] == ["ADD"] * 2
    again = http.post("/v1/chat/completions", json=body, headers=headers).json()["memory"]
    events = [_settled(http, a["id"])["results"][0] for a in again["added"]]  # a retried add
    assert [(e["event"], int(e["duplicate_of"])) for e in events] == [
        ("DUPLICATE", i) for i in added]
    # bad input: a clear 4xx, nothing stored, and the server keeps serving
    for memory_option, status, words in [
            ({"add": "one fact"}, 400, ("memory.add", "list of strings")),
            ({"add": [1, 2]}, 400, ("memory.add", "list of strings")),
            ({"add": ["   "]}, 400, ("memory.add",)),
            ({"add": ["x"] * 201}, 413, ("at most 200",))]:
        _refused(http.post("/v1/chat/completions", headers=headers, json=_chat(
            user_a, model=model, memory=memory_option)), status, *words)
    _refused(http.post("/v1/chat/completions", headers=auth("a"), json={  # no user named
        **_chat(user_a, model=model, memory={"add": ["x"]}), "user": None}), 400, "needs a user")
    _refused(http.post("/v1/chat/completions", headers=auth("a"), json=_chat(  # another tenant
        user_b, model=model, memory={"add": ["I am B now."]})), 403)
    assert {m.fact_id for m in client_a.get_all(user_id=user_a)} == set(added)


def test_a_request_vllm_refuses_stores_none_of_its_memory_add(http, model, client_a, user_a):
    """Issue 52: a chat or completion carrying memory.add that vLLM refuses (before or after
    its render) answers 4xx and stores nothing; the same add on a valid request is stored."""
    headers = {**auth("a"), "X-User-Id": user_a}
    add = {"add": ["Refused requests keep a green notebook."]}
    chat = _chat(user_a, model=model, memory=add)
    completion = {"model": model, "prompt": "Who keeps a notebook?", "max_tokens": MAX_TOKENS,
                  "user": user_a, "memory": add}
    refused = {
        "unknown model": ("/v1/chat/completions", {**chat, "model": "no-such-model"}),
        "negative max_tokens": ("/v1/chat/completions", {**chat, "max_tokens": -1}),
        "max_tokens past the context": ("/v1/chat/completions", {**chat, "max_tokens": 10**6}),
        "empty messages": ("/v1/chat/completions", {**chat, "messages": []}),
        "bad role": ("/v1/chat/completions", {
            **chat, "messages": [{"role": "wizard", "content": "hi"}]}),
        "n=0": ("/v1/chat/completions", {**chat, "n": 0}),
        "n=0 streamed": ("/v1/chat/completions", {**chat, "n": 0, "stream": True}),
        "negative temperature": ("/v1/chat/completions", {**chat, "temperature": -1}),
        "echo": ("/v1/completions", {**completion, "echo": True}),
        "two prompts": ("/v1/completions", {**completion, "prompt": ["One?", "Two?"]}),
        "completion n=0": ("/v1/completions", {**completion, "n": 0}),
        "completion max_tokens past the context": ("/v1/completions", {
            **completion, "max_tokens": 10**6}),
    }
    for kind, (path, body) in refused.items():
        response = http.post(path, json=body, headers=headers)
        assert 400 <= response.status_code < 500, (kind, response.status_code,
                                                    response.text[:300])
        assert client_a.get_all(user_id=user_a) == [], f"{kind}: its memory.add was stored"
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", completion)):
        response = http.post(path, json=body, headers=headers)  # accepted: stored
        assert response.status_code == 200, response.text
        for added in response.json()["memory"]["added"]:  # the second: a DUPLICATE, removed
            _settled(http, added["id"])                   # by the asynchronous add's check
        assert [m.text for m in client_a.get_all(user_id=user_a)] == add["add"]
