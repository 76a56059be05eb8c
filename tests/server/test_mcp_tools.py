"""The MCP tools over a Memory on FakeRunner: in process, and over HTTP through the server's app.

The HTTP half serves the same app `inferscale serve` builds around vLLM's (main.install: the
gate, the keys, the routes, /mcp) with uvicorn in a thread, and drives it with the SDK's own
streamable HTTP client. test_mcp.py runs the real `inferscale serve` and `inferscale mcp`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI
from mcp import Client

from inferscale_engine.server.auth import ApiKeys
from inferscale_engine.server.hosts import AllowedHosts
from inferscale_engine.server.mcp_backends import LocalMemory, Opening
from inferscale_engine.server.mcp_tools import build_server
from tests.conftest import engine_config
from tests.engine.memory.memory_support import HashEmbedder
from tests.fake_runner import FakeRunner
from tests.server import mcp_support
from tests.server.process import KEYS, free_port, keys_file

pytestmark = pytest.mark.timeout(300)

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "test", "version": "0"}}}
"""An MCP client's first message (a handshake-era protocol version: sessions)."""
ACCEPT = {"Accept": "application/json, text/event-stream"}


@pytest.fixture()
def memory(tiny_models, tmp_path):
    from inferscale_engine.memory import Memory
    from inferscale_engine.runtime.engine import Engine

    with Engine(engine_config(tiny_models["qwen2"], context_window_tokens=32),
                runner=FakeRunner) as engine, \
            Memory(engine, tmp_path / "m.db", HashEmbedder(), progress_bar=False) as mem:
        yield mem


class AppServer:
    """main.install's app over `memory`, served by uvicorn in a thread on 127.0.0.1."""

    def __init__(self, memory, keys: ApiKeys | None) -> None:
        import uvicorn

        from inferscale_engine.server.main import install

        app = FastAPI()
        self.metrics = install(app, memory, keys, 5, 20, hosts=AllowedHosts.for_server(
            None, keys is not None))
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.url = self.base_url + "/mcp"
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                     log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> AppServer:
        self._thread.start()
        while not self._server.started:  # bounded by the test's timeout
            assert self._thread.is_alive(), "uvicorn stopped while starting"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join()
        self.metrics.stop()


@pytest.fixture()
def keyed(memory, tmp_path) -> Iterator[AppServer]:
    with AppServer(memory, ApiKeys.load(keys_file(tmp_path / "keys.json"))) as server:
        yield server


def _as(tenant: str, user_id: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}",
            **({"X-User-Id": user_id} if user_id is not None else {})}


async def test_every_tool_and_bad_arguments_in_process(memory):
    server = build_server(Opening.ready(LocalMemory(memory)), lambda _ctx: "ann")
    async with Client(server) as client:
        (kept,) = await mcp_support.every_tool(client)
        await mcp_support.bad_arguments(client, kept)
    assert [f.text for f in memory.get_all(user_id="ann")] == ["Ann lives in Lisbon."]


async def test_a_memory_that_cannot_open_is_each_tools_answer():
    def broken():
        raise OSError("no such model folder: /nowhere")

    server = build_server(Opening(broken), lambda _ctx: "ann")
    async with Client(server) as client:
        text = await mcp_support.refused(client, "list_memories")
        assert "could not be opened" in text and "/nowhere" in text
        assert "could not be opened" in await mcp_support.refused(client, "get_memory",
                                                                   memory_id=1)


async def test_http_tools_act_for_the_user_the_key_and_header_name(keyed, memory):
    async with mcp_support.http_client(keyed.url, _as("a", "a:ann")) as client:
        (kept,) = await mcp_support.every_tool(client)
        await mcp_support.bad_arguments(client, kept)
        too_many = await mcp_support.refused(client, "add_memory",
                                             texts=[f"Fact {n}." for n in range(21)])
        assert "at most 20" in too_many  # the server's --max-add-facts
    assert [f.text for f in memory.get_all(user_id="a:ann")] == ["Ann lives in Lisbon."]


async def test_http_a_tenant_reaches_no_other_tenants_user(keyed, memory):
    (secret,) = memory.add(user_id="a:ann", texts=["Ann's PIN is 4321."])
    async with mcp_support.http_client(keyed.url, _as("b", "b:bob")) as client:
        await mcp_support.cannot_reach(client, secret.fact_id, "4321", "a:ann")
    for headers in (_as("b", "a:ann"), _as("a", "b:bob")):  # a user the key may not reach
        async with httpx.AsyncClient(timeout=60) as http:
            refused = await http.post(keyed.url, json=INITIALIZE, headers={**ACCEPT, **headers})
        assert refused.status_code == 403 and "may not reach" in refused.text, refused.text
        with pytest.raises(Exception):  # noqa: B017 - the SDK reports it as it reports any 4xx
            async with mcp_support.http_client(keyed.url, headers) as client:
                await client.list_tools()
    assert [f.text for f in memory.get_all(user_id="a:ann")] == ["Ann's PIN is 4321."]
    assert memory.get_all(user_id="b:bob") == []


async def test_http_without_a_user_the_tools_say_how_to_name_one(keyed):
    async with mcp_support.http_client(keyed.url, _as("a", None)) as client:
        text = await mcp_support.refused(client, "list_memories")
        assert "X-User-Id" in text


def test_http_a_session_serves_only_the_credential_that_opened_it(keyed):
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    with httpx.Client(timeout=60) as http:
        assert http.post(keyed.url, json=INITIALIZE).status_code == 401  # no key
        opened = http.post(keyed.url, json=INITIALIZE, headers={**ACCEPT, **_as("a", "a:ann")})
        assert opened.status_code == 200, opened.text
        session = {"mcp-session-id": opened.headers["mcp-session-id"],
                   "mcp-protocol-version": "2025-06-18", **ACCEPT}
        done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert http.post(keyed.url, json=done,
                         headers={**session, **_as("a", "a:ann")}).status_code == 202
        for other in (_as("b", "b:bob"), _as("a", "a:eve"), _as("admin", "a:ann")):
            stolen = http.post(keyed.url, json=listing, headers={**session, **other})
            assert stolen.status_code == 404, stolen.text
        own = http.post(keyed.url, json=listing, headers={**session, **_as("a", "a:ann")})
        assert own.status_code == 200 and "add_memory" in own.text


def test_http_without_keys_answers_loopback_names_and_same_site_pages_only(memory):
    headers = {**ACCEPT, "Content-Type": "application/json", "X-User-Id": "dev"}
    body = json.dumps(INITIALIZE)
    with AppServer(memory, None) as server, httpx.Client(timeout=60) as http:
        port = server.port
        refusals = [{"Host": f"rebind.attacker.example:{port}"},
                    {"Origin": "http://attacker.example"},
                    {"Host": f"rebind.attacker.example:{port}",
                     "Origin": f"http://rebind.attacker.example:{port}"}]
        for extra in refusals:
            refused = http.post(server.url, content=body, headers={**headers, **extra})
            assert refused.status_code == 403, (extra, refused.text)
        for extra in ({}, {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}):
            served = http.post(server.url, content=body, headers={**headers, **extra})
            assert served.status_code == 200, (extra, served.text)


@pytest.mark.parametrize(("argv", "says"), [
    (["--user-id", "a\nb"], "--user-id"),
    (["--user-id", "ann", "--base-url", "http://127.0.0.1:1", "--model", "small"], "--model"),
    (["--user-id", "ann", "--api-key", "sk-x"], "--base-url"),
    ([], "--user-id")])
def test_inferscale_mcp_refuses_options_that_do_not_go_together(argv, says, capsys):
    from inferscale_engine.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["mcp", *argv])
    assert exited.value.code == 2 and says in capsys.readouterr().err
