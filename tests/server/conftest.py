"""One `inferscale serve` (tiny model, API keys) for the whole tests/server package.

Start-ups are slow on CPU, so every module shares this server; the durability test SIGKILLs it
and starts it again on the same port and database. Tests isolate themselves by user id
(`user_a`, `user_b`: tenants a and b of the keys file). To iterate on the tests, start one
yourself with tests/server/process.py's keys file and set INFERSCALE_TEST_SERVER=http://...:
the tests then use it (and the durability test, which must own its server, is skipped).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
import uuid
import warnings
from collections.abc import Iterator

import httpx
import pytest

from inferscale_integrations.client import MemoryClient, served_model
from tests.server.process import KEYS, TEST_FLAGS, ServerProcess, keys_file

MAX_TOKENS = 3
"""Answer length: the tiny model's answers are gibberish; tests assert on mechanics."""


@pytest.fixture(scope="package")
def server(tiny_models, tmp_path_factory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("server")
    if os.environ.get("INFERSCALE_TEST_SERVER"):
        yield ServerProcess.attach(os.environ["INFERSCALE_TEST_SERVER"])
        return
    process = ServerProcess(folder / "memory.db", folder / "server.log",
                            api_keys=keys_file(folder / "keys.json"), admin_key=KEYS["admin"],
                            extra_args=TEST_FLAGS)
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(autouse=True)
def _quiet_langchain_deprecations():
    """Classic chains are deprecated upstream; that is what users run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _user(request, tenant: str) -> str:
    """A user id of this test only (also across runs against one attached server)."""
    return (f"{tenant}:" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:10]
            + "-" + uuid.uuid4().hex[:6])


@pytest.fixture()
def user_a(request) -> str:
    """A user of tenant a, of this test only."""
    return _user(request, "a")


@pytest.fixture()
def user_b(request) -> str:
    """A user of tenant b, of this test only."""
    return _user(request, "b")


@pytest.fixture()
def model(server) -> str:
    """The served model's name (its folder's name)."""
    return served_model(server.base_url, KEYS["a"])


@pytest.fixture()
def client_a(server) -> Iterator[MemoryClient]:
    with MemoryClient(server.base_url, KEYS["a"], timeout_s=60) as client:
        yield client


@pytest.fixture()
def client_b(server) -> Iterator[MemoryClient]:
    with MemoryClient(server.base_url, KEYS["b"], timeout_s=60) as client:
        yield client


@pytest.fixture()
def http(server) -> Iterator[httpx.Client]:
    """A raw HTTP client of the server with no key."""
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


def auth(tenant: str) -> dict[str, str]:
    """The Authorization header of a test key."""
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


def metric(server: ServerProcess, name: str, timeout_s: float = 60.0) -> float:
    """One InferScale counter or gauge from the server's /metrics (present from the first
    snapshot on, taken right after start-up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = httpx.get(f"{server.base_url}/metrics", headers=auth("admin"), timeout=30).text
        found = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
        if found or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert found, f"{name} not on /metrics"
    return float(found.group(1))


def wait_metric(server: ServerProcess, name: str, at_least: float,
                timeout_s: float = 60.0) -> float:
    """Poll /metrics until `name` reaches `at_least` (the snapshot refreshes every 2 s; the
    bound is on waiting, generous for a loaded machine, and ends once it is reached)."""
    deadline = time.monotonic() + timeout_s
    value = metric(server, name)
    while value < at_least and time.monotonic() < deadline:
        time.sleep(0.5)
        value = metric(server, name)
    return value
