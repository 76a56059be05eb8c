"""Replicas behind vllm-router over one Postgres store: user affinity, failover, nothing lost.

On loopback, started here: a throwaway PostgreSQL (tests/pgserver.py), two `inferscale serve`
replicas of the tiny model sharing its database, and vllm-router (PyPI `vllm-router`) in front
with `--policy consistent_hash`, which hashes the X-User-Id header. Clients of 20 users (two
tenants) add facts (chat-borne `memory.add`, which the router forwards with the client's
headers) and chat through the router. One replica is then SIGKILLed while the clients keep
going: its users move to the other replica, every acknowledged fact is in the store, a failed
add left all of its facts or none, chats report injected tokens again, and no response ever
names another user's fact.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.server.process import KEYS, RouterProcess, ServerProcess, keys_file

pytestmark = pytest.mark.timeout(1500)

USERS = [f"{tenant}:user{i}" for tenant in ("a", "b") for i in range(10)]
WORDS = ("amber", "birch", "cobalt", "dune", "ember", "fjord", "garnet", "harbor", "indigo",
         "juniper", "kestrel", "lagoon", "meadow", "nectar", "onyx", "pepper", "quartz",
         "russet", "saffron", "tundra")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, postgres_server):
    """([router, router without retries], [replica 0, replica 1], database URL)."""
    folder = tmp_path_factory.mktemp("replicas")
    url = postgres_server.url_for(postgres_server.create_database())
    keys = keys_file(folder / "keys.json")
    # --sync-adds: the chat-borne adds here return once their KV is encoded (the first chat
    # injects them); asynchronous adds have their own tests (test_async_adds.py)
    replicas = [ServerProcess(url, folder / f"replica{i}.log", api_keys=keys,
                              admin_key=KEYS["admin"],
                              extra_args=["--replica-id", f"r{i}", "--sync-adds"])
                for i in range(2)]
    for replica in replicas:  # both start at once (the store migrates once)
        replica.launch()
    for replica in replicas:
        replica.wait_ready(timeout_s=600)
    routers = []
    try:
        if RouterProcess.binary() is None:
            pytest.skip("vllm-router is not installed (pip install 'inferscale-kv[replicas]')")
        for retries in (True, False):  # the same ring: each user has one replica through both
            routers.append(RouterProcess([r.base_url for r in replicas],
                                         folder / f"router-{retries}.log", retries=retries))
        yield routers, replicas, url
    finally:
        for router in routers:
            router.stop()
        for replica in replicas:
            with contextlib.suppress(Exception):
                replica.stop()


def _tenant(user: str) -> str:
    return user.split(":", 1)[0]


class Clients:
    """What the 20 users' clients did, and were told."""

    def __init__(self, routers: list[RouterProcess]) -> None:
        # tenant a through a router that retries a failed request on the other replica,
        # tenant b through one that reports the failure to the client
        self.routes = {"a": httpx.Client(base_url=routers[0].base_url, timeout=120),
                       "b": httpx.Client(base_url=routers[1].base_url, timeout=120)}
        self.http = self.routes["a"]
        self.acked: dict[str, set[int]] = defaultdict(set)
        """Per user, fact ids an add was acknowledged with (HTTP 200)."""
        self.failed_adds: list[tuple[str, list[str]]] = []
        """Adds that got an error: (user, texts); each must be all stored or not at all."""
        self.chats: list[tuple[str, dict]] = []
        self.errors = 0
        self.lock = threading.Lock()
        self.model = self.http.get("/v1/models", headers={
            "Authorization": f"Bearer {KEYS['a']}"}).json()["data"][0]["id"]

    def chat(self, user: str, question: str, add: list[str] | None = None) -> dict | None:
        """One chat through the router; its `memory` field, or None on an error."""
        memory: dict = {"k": 3}
        if add:
            memory["add"] = add
        try:
            response = self.routes[_tenant(user)].post("/v1/chat/completions", headers={
                "Authorization": f"Bearer {KEYS[_tenant(user)]}", "X-User-Id": user}, json={
                "model": self.model, "max_tokens": 1, "temperature": 0, "memory": memory,
                "messages": [{"role": "user", "content": question}]})
        except httpx.TransportError:
            response = None
        if response is None or response.status_code != 200:
            assert response is None or response.status_code >= 500, response.text
            with self.lock:
                self.errors += 1
                if add:
                    self.failed_adds.append((user, add))
            return None
        info = response.json()["memory"]
        assert info["user_id"] == user
        with self.lock:
            if add:
                events = info["added"]
                assert len(events) == len(add)
                self.acked[user].update(e["id"] for e in events)
            self.chats.append((user, info))
        return info


def _add_texts(user: str, round_: int) -> list[str]:
    word = WORDS[USERS.index(user)]
    return [f"{user} round {round_} keeps a {word} notebook number {round_ * 2 + j}"
            for j in range(2)]


def _served_users(replica: ServerProcess) -> int:
    text = httpx.get(f"{replica.base_url}/metrics", timeout=30, headers={
        "Authorization": f"Bearer {KEYS['admin']}"}).text
    found = re.search(r"^inferscale_served_users (\S+)$", text, re.MULTILINE)
    assert found, "inferscale_served_users missing from /metrics"
    return int(float(found.group(1)))


def _held(replicas: list[ServerProcess], total: int) -> list[int]:
    """Each replica's inferscale_served_users once they sum to `total` (the gauge is of the
    metrics snapshot, refreshed every 2 s), or as they are after 20 s."""
    deadline = time.monotonic() + 20
    while sum(counts := [_served_users(r) for r in replicas]) != total and (
            time.monotonic() < deadline):
        time.sleep(0.5)
    return counts


def _stored(url: str) -> dict[str, dict[int, str]]:
    from inferscale_engine.memory.store.fact_store import FactStore

    with FactStore(url) as store:
        return {user: {f.fact_id: f.text for f in store.get_all(user_id=user)}
                for user in USERS}


def test_users_stay_on_one_replica_and_survive_a_replica_dying(cluster):
    routers, replicas, url = cluster
    clients = Clients(routers)

    def first_round(user: str) -> None:
        added = clients.chat(user, "hello", add=_add_texts(user, 0))
        info = clients.chat(user, f"Which notebook does {user} keep?")
        assert added is not None and info is not None and info["fact_ids"]
        # the first chat injects the new facts; the second may find their KV in vLLM's prefix
        # cache (same salted prefix), which is served without injecting again
        assert added["injected_tokens"] > 0, added

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(first_round, USERS))
    assert clients.errors == 0
    counts = _held(replicas, len(USERS))
    assert sum(counts) == len(USERS) and min(counts) > 0, counts  # each user on one replica
    replica_of = {user: info["replica"] for user, info in clients.chats}
    assert all(info["replica"] == replica_of[user] for user, info in clients.chats)
    victim = 0 if sum(r == "r0" for r in replica_of.values()) >= len(USERS) / 2 else 1
    moved = [user for user, replica in replica_of.items() if replica == f"r{victim}"]

    # load: every user adds and asks, round after round; the victim dies in the middle, while
    # one of its users' large add is in flight (sent without retries: the client sees it fail)
    started = threading.Event()

    def load(user: str) -> None:
        for round_ in range(1, 7):
            deadline = time.monotonic() + 90
            while clients.chat(user, "Which notebook?", add=_add_texts(user, round_)) is None:
                assert time.monotonic() < deadline, f"{user}: no replica answered for 90 s"
                time.sleep(0.5)
            started.set()

    big_user = next(u for u in moved if _tenant(u) == "b")
    big = [f"{big_user} keeps ledger {n} in a {WORDS[n % 20]} box" for n in range(600)]
    with ThreadPoolExecutor(7) as pool:
        loads = [pool.submit(load, user) for user in USERS]
        assert started.wait(120)
        in_flight = pool.submit(clients.chat, big_user, "Remember these.", big)
        time.sleep(0.5)  # the add is stored (one transaction) early, then encoded in chunks
        replicas[victim].kill()
        for done in loads:
            done.result()
        big_info = in_flight.result()

    # after the move, the victim's users are served (with injected KV) by the survivor
    survivor = replicas[1 - victim]
    for user in moved:
        info = clients.chat(user, f"Which notebook does {user} keep?")
        assert info is not None and info["replica"] == f"r{1 - victim}", info
        assert any(i["replica"] == f"r{1 - victim}" and i["injected_tokens"] > 0
                   for u, i in clients.chats if u == user), f"{user}: nothing injected after"
    assert _held([survivor], len(USERS)) == [len(USERS)]

    stored = _stored(url)
    for user in USERS:
        missing = clients.acked[user] - set(stored[user])
        assert not missing, f"{user}: acknowledged facts {missing} are not in the store"
        assert all(text.startswith(f"{user} ") for text in stored[user].values())
        texts = list(stored[user].values())  # a retried add is a DUPLICATE, never stored twice
        assert len(texts) == len(set(texts)), f"{user}: a fact was stored twice"
    for user, texts in clients.failed_adds:  # all or nothing
        present = [t in stored[user].values() for t in texts]
        assert all(present) or not any(present), (user, texts, present)
    present = sum(t in stored[big_user].values() for t in big)
    assert present in (0, len(big)), f"the add in flight left {present} of {len(big)} facts"
    if big_info is not None:  # answered before the kill: acknowledged, so stored
        assert present == len(big)
    owner_of = {fact: user for user, facts in stored.items() for fact in facts}
    foreign = [(user, f) for user, info in clients.chats for f in info["fact_ids"]
               if owner_of.get(f, user) != user]
    assert not foreign, f"responses named other users' facts: {foreign[:5]}"
    print(f"\nreplicas: {len(moved)} users moved off replica {victim}; "
          f"{sum(map(len, clients.acked.values()))} facts acknowledged; the add in flight "
          f"{_answer(big_info)}, {present} of its {len(big)} facts stored; "
          f"{len(clients.failed_adds)} adds failed (each all-or-nothing), "
          f"{clients.errors} errors in all, {len(clients.chats)} chats answered")



def _answer(info: dict | None) -> str:
    """How the add in flight ended: who answered it, and with which events."""
    if info is None:
        return "failed"
    events = sorted({e["event"] for e in info["added"]})
    return f"answered by {info['replica']} ({'/'.join(events)})"
