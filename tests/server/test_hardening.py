"""The server's hardening against a hostile tenant or a careless client.

Unicode spellings of another tenant's user, memory ids of other tenants, control routes,
unbounded headers, ids and metadata, echo with memory, non-string filters, oversized adds, and
the prefix-cache oracle on saved facts. Each test failed before its fix.
"""

from __future__ import annotations

import socket

import httpx
import pytest

from inferscale_engine.checks import MAX_METADATA_BYTES, MAX_USER_ID_CHARS
from inferscale_engine.server.limits import MAX_HEAD_BYTES
from tests.conftest import FACTS
from tests.server.conftest import MAX_TOKENS, auth, metric, wait_metric
from tests.server.process import KEYS, TEST_FLAGS

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

MAX_ADD = int(TEST_FLAGS[TEST_FLAGS.index("--max-add-facts") + 1])


def _chat(model: str, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "What does Ana like?"}],
            "max_tokens": MAX_TOKENS, "temperature": 0, **extra}


def _message(response: httpx.Response) -> str:
    return response.json()["error"]["message"]


@pytest.fixture()
def ana(request, http) -> tuple[str, list[int]]:
    """A user of tenant accent, 'café:<test>', with two facts; their ids."""
    user = "caf\u00e9:" + request.node.name[-24:]
    http.post("/v1/memories/reset", json={"user_id": user}, headers=auth("admin"))
    added = http.post("/v1/memories", json={"user_id": user, "texts": FACTS[:2]},
                      headers=auth("accent"))
    assert added.status_code == 200, added.text
    return user, [r["id"] for r in added.json()["results"]]


def _variants(user: str) -> dict[str, str]:
    """Spellings of `user` ('café:...') that tenant latin ('cafe*') might try."""
    rest = user.split(":", 1)[1]
    return {"decomposed": f"cafe\u0301:{rest}",
            "full-width": f"\uff43\uff41\uff46\u00e9:{rest}",
            "zero-width": f"cafe\u200b\u0301:{rest}",
            "zero-width joiner": f"caf\u200de\u0301:{rest}"}


def test_no_unicode_spelling_reaches_another_tenants_user(http, model, ana):
    user, fact_ids = ana
    for name, variant in _variants(user).items():
        encoded = variant.encode()
        attempts = [
            ("GET", "/v1/memories", {"params": {"user_id": variant}}),
            ("GET", "/v1/memories", {"headers": {"X-User-Id": encoded}}),
            ("POST", "/v1/memories/search", {"json": {"query": "chess", "user_id": variant}}),
            ("POST", "/v1/memories/search",
             {"json": {"query": "chess", "filters": {"user_id": variant}}}),
            ("POST", "/v1/memories/search",
             {"json": {"query": "chess"}, "headers": {"X-User-Id": encoded}}),
            ("POST", "/v1/memories", {"json": {"user_id": variant, "texts": ["planted"]}}),
            ("POST", "/v1/memories",
             {"json": {"texts": ["planted"]}, "headers": {"X-User-Id": encoded}}),
            ("POST", "/v1/chat/completions", {"json": _chat(model, user=variant)}),
            ("POST", "/v1/chat/completions",
             {"json": _chat(model), "headers": {"X-User-Id": encoded}}),
            ("POST", "/v1/chat/completions",
             {"json": _chat(model, memory={"user_id": variant})}),
            ("POST", "/v1/completions", {"json": {"model": model, "prompt": "Ana likes",
                                                  "max_tokens": 1, "user": variant}}),
        ]
        for method, path, kwargs in attempts:
            headers = {**auth("latin"), **kwargs.pop("headers", {})}
            response = http.request(method, path, headers=headers, **kwargs)
            where = (name, method, path, response.status_code, response.text[:200])
            # Either refused, or served as a distinct user of tenant latin: never ana's facts.
            assert response.status_code in (200, 403), where
            if response.status_code == 200:
                body = response.json()
                served = body.get("memory", {}).get("fact_ids") or [
                    r["id"] for r in body.get("results", [])]
                assert not set(served) & set(fact_ids), where
                assert user not in response.text, where
        # Admin-scoped deletes of the same spelling by latin's admin key.
        for method, path, kwargs in [
            ("DELETE", "/v1/memories", {"params": {"user_id": variant}}),
            ("POST", "/v1/memories/reset", {"json": {"user_id": variant}}),
        ]:
            response = http.request(method, path, headers=auth("latin-admin"), **kwargs)
            assert response.status_code in (200, 403), (name, path, response.text)
            # 200: a distinct user of tenant latin (the "planted" fact above) was deleted.
    # Ana's memories are exactly what they were: none read away, none planted, none deleted.
    after = http.get("/v1/memories", params={"user_id": user}, headers=auth("accent")).json()
    assert [r["id"] for r in after["results"]] == fact_ids
    assert [r["memory"] for r in after["results"]] == FACTS[:2]
    # Her own tenant reaches her by either spelling: normalization is the same everywhere.
    for spelling in (user, _variants(user)["decomposed"]):
        own = http.get("/v1/memories", headers={**auth("accent"),
                                                "X-User-Id": spelling.encode()})
        assert [r["id"] for r in own.json()["results"]] == fact_ids


def test_channels_naming_different_users_are_refused(http, model, user_a):
    response = http.post("/v1/chat/completions", json=_chat(model, user=user_a),
                         headers={**auth("a"), "X-User-Id": user_a + "-other"})
    assert response.status_code == 400 and "different users" in _message(response)
    response = http.post("/v1/memories/search", json={
        "query": "x", "user_id": user_a, "filters": {"user_id": user_a + "-other"}},
        headers=auth("a"))
    assert response.status_code == 400 and "different users" in _message(response)
    bad = http.get("/v1/memories", headers={**auth("a"), "X-User-Id": b"a:\xff\xfe"})
    assert bad.status_code == 400 and "UTF-8" in _message(bad)


def test_memory_ids_another_key_may_not_see_are_not_found(http, client_b, user_b):
    (fact,) = [int(r.fact_id) for r in client_b.add(user_id=user_b, texts=FACTS[:1])]
    missing = 10**12
    for method, kwargs in [("GET", {}), ("PUT", {"json": {"text": "overwritten"}}),
                           ("DELETE", {})]:
        theirs = http.request(method, f"/v1/memories/{fact}", headers=auth("a"), **kwargs)
        nobody = http.request(method, f"/v1/memories/{missing}", headers=auth("a"), **kwargs)
        assert theirs.status_code == nobody.status_code == 404, (method, theirs.text)
        assert _message(theirs) == _message(nobody).replace(str(missing), str(fact))
        assert user_b not in theirs.text and "b:" not in _message(theirs)
    assert client_b.get(user_id=user_b, fact_id=fact).text == FACTS[0]


def test_tenant_keys_reach_only_tenant_routes(server, http):
    for method, path in [("GET", "/metrics"), ("POST", "/scale_elastic_ep"),
                         ("POST", "/is_scaling_elastic_ep"), ("GET", "/load"),
                         ("POST", "/v1/messages"), ("POST", "/v1/responses")]:
        response = http.request(method, path, headers=auth("a"), json={})
        assert response.status_code == 403 and "admin" in _message(response), (path,
                                                                              response.text)
    assert http.get("/v1/models", headers=auth("a")).status_code == 200
    assert http.get("/health", headers=auth("a")).status_code == 200
    assert http.get("/v1/no-such-route", headers=auth("a")).status_code == 404
    admin = http.get("/metrics", headers=auth("admin"))
    assert admin.status_code == 200 and "inferscale_facts" in admin.text
    assert metric(server, "inferscale_host_capacity_tokens") > 0  # the host tier, on by default
    for name in ("inferscale_host_hits_total", "inferscale_disk_hits_total",
                 "inferscale_demoted_facts_total", "inferscale_host_bytes_in_total"):
        assert f"\n{name} " in admin.text, name
    assert metric(server, 'inferscale_refused_requests_total{status="403"}') >= 6


def test_forged_plans_on_routes_outside_the_seam_are_counted(server, http, model):
    before = metric(server, "inferscale_fallback_rejected_total")
    forged = {"inferscale": {"v": 6, "kind": "inject", "user": "b:x", "salt": "s",
                             "keys": "AAAAAAAAAAA=", "lengths": "AQAAAA==", "mac": "0" * 32}}
    response = http.post("/v1/messages", headers=auth("admin"), json={
        "model": model, "max_tokens": 1, "kv_transfer_params": forged,
        "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 200, response.text
    assert wait_metric(server, "inferscale_fallback_rejected_total", before + 1) >= before + 1


def test_non_string_filters_user_id_is_422(http):
    for value in (5, ["a:x"], {"id": "a:x"}, True):
        response = http.post("/v1/memories/search", headers=auth("a"),
                             json={"query": "x", "filters": {"user_id": value}})
        assert response.status_code == 422, (value, response.text)
        assert "must be a string" in _message(response)


def test_echo_with_memory_is_refused(http, model, client_a, user_a):
    client_a.add(user_id=user_a, texts=FACTS[:1])
    body = {"model": model, "prompt": "Alice likes", "max_tokens": 1, "echo": True,
            "user": user_a}
    refused = http.post("/v1/completions", json=body, headers=auth("a"))
    assert refused.status_code == 400 and "echo" in _message(refused)
    plain = http.post("/v1/completions", json={**body, "memory": {"enabled": False}},
                      headers=auth("a"))
    assert plain.status_code == 200
    assert plain.json()["choices"][0]["text"].startswith("Alice likes")


def test_metadata_depth_and_size_are_bounded_at_write(http, user_a):
    deep: dict = {}
    node = deep
    for _ in range(900):
        node["x"] = {}
        node = node["x"]
    for metadata, words in [(deep, "nested"), ({"blob": "x" * (MAX_METADATA_BYTES + 1)}, "bytes")]:
        response = http.post("/v1/memories", headers=auth("a"), json={
            "user_id": user_a, "texts": ["A fact."], "metadata": metadata})
        assert response.status_code == 400 and words in _message(response), response.text[:200]
    assert http.get("/v1/memories", params={"user_id": user_a},
                    headers=auth("a")).json()["results"] == []
    ok = http.post("/v1/memories", headers=auth("a"), json={
        "user_id": user_a, "texts": ["A fact."], "metadata": {"a": {"b": [1, {"c": 2}]}}})
    fact = ok.json()["results"][0]["id"]
    got = http.get(f"/v1/memories/{fact}", headers=auth("a"))
    assert got.status_code == 200 and got.json()["metadata"] == {"a": {"b": [1, {"c": 2}]}}


def _raw_request(server, head: bytes, chunk: int = 2**16) -> bytes:
    """Send a request head in chunks over a raw socket; the response (or b'' if cut off)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        try:
            for i in range(0, len(head), chunk):
                sock.sendall(head[i:i + chunk])
        except OSError:
            pass  # the server answered and closed while we were still sending
        data = b""
        try:
            while part := sock.recv(65536):
                data += part
        except OSError:
            pass
    return data


def test_headers_and_user_ids_are_bounded(server, http, user_a):
    for size in (2 * MAX_HEAD_BYTES, 8 * 2**20):
        head = (b"GET /v1/memories HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + KEYS["a"].encode() + b"\r\nX-User-Id: a:" + b"u" * size + b"\r\n\r\n")
        answer = _raw_request(server, head)
        assert answer.startswith(b"HTTP/1.1 431"), (size, answer[:200])
    long_id = "a:" + "u" * MAX_USER_ID_CHARS
    for kwargs in ({"json": {"user_id": long_id, "texts": ["hi"]}},
                   {"json": {"texts": ["hi"]}, "headers": {"X-User-Id": long_id}}):
        response = http.post("/v1/memories", **{**kwargs, "headers": {
            **auth("a"), **kwargs.get("headers", {})}})
        assert response.status_code == 400 and "at most" in _message(response)
    # The server keeps serving.
    assert http.get("/v1/memories", params={"user_id": user_a},
                    headers=auth("a")).status_code == 200


def test_an_add_is_bounded_in_memories(server, http, user_a):
    too_many = [f"Fact number {i}." for i in range(MAX_ADD + 1)]
    response = http.post("/v1/memories", headers=auth("a"),
                         json={"user_id": user_a, "texts": too_many})
    assert response.status_code == 413 and f"at most {MAX_ADD}" in _message(response)
    long_turn = " ".join(f"word{i}" for i in range(200 * MAX_ADD // 2))  # cut into > MAX_ADD
    response = http.post("/v1/memories", headers=auth("a"), json={
        "user_id": user_a, "messages": [{"role": "user", "content": long_turn}]})
    assert response.status_code == 413, response.text[:200]
    assert http.get("/v1/memories", params={"user_id": user_a},
                    headers=auth("a")).json()["results"] == []
    assert metric(server, 'inferscale_refused_requests_total{status="413"}') >= 2


def test_an_unsalted_prompt_never_hits_a_saved_facts_blocks(http, model, tiny_models, user_a):
    from inferscale_engine.config import EngineConfig
    from inferscale_engine.model.check import load_tokenizer
    from inferscale_engine.prompting.prompt import PromptBuilder

    config = EngineConfig(model=str(tiny_models["qwen2"]))  # what `--model tiny` serves
    prompts = PromptBuilder(load_tokenizer(config), config.system_prompt,
                            config.user_block_header)
    fact = "The door code is " + " ".join(f"{i:02d}" for i in range(60)) + "."
    assert 160 <= len(prompts.fact_ids(fact)) <= config.max_fact_tokens  # spans a full block
    added = http.post("/v1/memories", headers=auth("a"), json={"user_id": user_a,
                                                              "texts": [fact]})
    assert added.status_code == 200, added.text
    preamble = list(prompts.preamble())
    save_prompt = preamble + list(prompts.fact_ids(fact))  # the user's first fact: no context
    wrong = preamble + list(prompts.fact_ids(fact.replace("door", "gate")))

    def cached(ids: list[int]) -> int:
        response = http.post("/v1/completions", headers=auth("b"), json={
            "model": model, "prompt": ids + [11], "max_tokens": 1, "memory": {"enabled": False}})
        assert response.status_code == 200, response.text
        details = response.json()["usage"].get("prompt_tokens_details") or {}
        return int(details.get("cached_tokens") or 0)

    # The same cached count for the right and a wrong guess, and no more than the public
    # preamble (which text requests share): the response says nothing about the user's facts.
    right, guess = cached(save_prompt), cached(wrong)
    assert right == guess and right <= len(preamble), (right, guess, len(preamble),
                                                        len(save_prompt))


def _deep_and(user: str, depth: int) -> dict:
    filters: dict = {"topic": "home"}
    for _ in range(depth):
        filters = {"AND": [filters]}
    return {"user_id": user, **filters}


def test_filters_are_checked_before_evaluation_on_every_route(http, user_a):
    from inferscale_engine.memory.search.filters import MAX_FILTER_LIST
    from inferscale_engine.server.limits import MAX_FILTER_BODY_BYTES

    added = http.post("/v1/memories", headers=auth("a"), json={
        "user_id": user_a, "texts": FACTS[:2], "metadata": {"topic": "home"}})
    assert added.status_code == 200, added.text
    assert http.post("/v1/memories", headers=auth("a"), json={
        "user_id": user_a, "texts": FACTS[2:4], "metadata": {"topic": "work"}}).status_code == 200
    routes = [("/v3/memories/search/", {"query": "chess"}), ("/v3/memories/", {}),
              ("/v1/memories/search", {"query": "chess"})]
    for path, body in routes:
        def post(filters: dict, path=path, body=body) -> httpx.Response:
            return http.post(path, headers=auth("a"), json={**body, "filters": filters})

        for filters, words in [
                ({"AND": {"user_id": user_a}}, "AND takes a list of filters"),
                ({"user_id": user_a, "OR": {"topic": "home"}}, "OR takes a list"),
                ({"user_id": user_a, "NOT": [{"topic": "home"}]}, "NOT takes a filter"),
                (_deep_and(user_a, 350), "nests deeper than"),
                ({"user_id": user_a, "topic": {"$in": list(range(MAX_FILTER_LIST + 1))}},
                 f"at most {MAX_FILTER_LIST}")]:
            refused = post(filters)
            assert refused.status_code == 400, (path, refused.text[:300])
            assert words in _message(refused), (path, _message(refused))
        # the connection that carried the refusals still serves, and filters select
        found = post({"AND": [{"user_id": user_a}, {"topic": "work"}]})
        assert found.status_code == 200, found.text
        assert sorted(r["memory"] for r in found.json()["results"]) == sorted(FACTS[2:4])
        huge = {"user_id": user_a, "topic": {"$in": ["x" * 64] * (MAX_FILTER_BODY_BYTES // 64)}}
        too_big = post(huge)
        assert too_big.status_code == 413, (path, too_big.text[:200])
        assert str(MAX_FILTER_BODY_BYTES) in _message(too_big)


def test_infer_counters_and_the_users_held_are_on_metrics(server, http, model, user_a):
    """infer_calls / infer_invalid are exported; inferscale_served_users counts the users whose
    state the server holds, not every user id it was ever asked about."""
    def infer(text: str) -> bool:
        """An add(infer=True) of user_a's; whether user_a has facts after it."""
        inferred = http.post("/v3/memories/add/", headers=auth("a"), json={
            "user_id": user_a, "infer": True, "messages": [{"role": "user", "content": text}]})
        assert inferred.status_code == 200, inferred.text
        return bool(http.get("/v1/memories", params={"user_id": user_a},
                             headers=auth("a")).json()["results"])

    calls = metric(server, "inferscale_infer_calls_total")
    had = infer("I live in Oslo and keep two cats.")
    # the snapshot that counts this call was taken after it, and after every earlier write
    assert wait_metric(server, "inferscale_infer_calls_total", calls + 1) == calls + 1
    assert metric(server, "inferscale_infer_invalid_total") >= 0
    held = metric(server, "inferscale_served_users")
    for n in range(5):  # users without facts: answered, nothing held for them
        response = http.post("/v1/chat/completions", headers=auth("a"),
                             json=_chat(model, user=f"{user_a}-nobody-{n}"))
        assert response.status_code == 200, response.text
    has = infer("My sister lives in Rome.")
    assert wait_metric(server, "inferscale_infer_calls_total", calls + 2) == calls + 2
    assert metric(server, "inferscale_served_users") == held + (has and not had)


def test_a_search_about_now_leaves_older_versions_out_and_names_them(http, user_a):
    ids = []
    for text, when in (("I live in Denver.", "2023-01-09"),
                       ("We left Denver and relocated to Lisbon.", "2023-05-27")):
        added = http.post("/v1/memories", headers=auth("a"), json={
            "user_id": user_a, "texts": [text], "timestamp": when})
        assert added.status_code == 200, added.text
        ids.append(added.json()["results"][0]["id"])
    query = {"user_id": user_a, "query": "Which city do I live in now?", "top_k": 5}
    now = http.post("/v1/memories/search", headers=auth("a"), json=query)
    assert now.status_code == 200, now.text
    assert [r["id"] for r in now.json()["results"]] == [ids[1]]
    assert now.json()["older_versions"] == [ids[0]]
    never = http.post("/v1/memories/search", headers=auth("a"),
                      json={**query, "hide_older_versions": "never"})
    assert sorted(r["id"] for r in never.json()["results"]) == sorted(ids)
    assert never.json()["older_versions"] == []
    bad = http.post("/v1/memories/search", headers=auth("a"),
                    json={**query, "hide_older_versions": "sometimes"})
    assert bad.status_code == 400 and "hide_older_versions" in _message(bad), bad.text


def test_search_mode_reaches_memory_search_on_both_search_routes(http, user_a):
    added = http.post("/v1/memories", headers=auth("a"), json={
        "user_id": user_a, "texts": ["Ana keeps the zorblax invoice in a drawer."]})
    assert added.status_code == 200, added.text
    routes = [("/v1/memories/search", {"user_id": user_a}),
              ("/v3/memories/search/", {"filters": {"user_id": user_a}})]
    for path, who in routes:
        for mode in ("vector", "hybrid", None):
            found = http.post(path, headers=auth("a"),
                              json={"query": "zorblax", "search_mode": mode, **who})
            assert found.status_code == 200, (path, mode, found.text)
            assert [r["memory"] for r in found.json()["results"]] == [
                "Ana keeps the zorblax invoice in a drawer."]
            signal = found.json()["results"][0].get("found_by")  # the mem0 route keeps mem0's
            assert signal == ("embedding" if mode == "vector" else "both") or path.startswith(
                "/v3")
        bad = http.post(path, headers=auth("a"),
                        json={"query": "zorblax", "search_mode": "bm25", **who})
        assert bad.status_code == 400 and "search_mode" in _message(bad), bad.text
