"""The MCP server over its two real transports, driven by the SDK's own client.

- streamable HTTP: /mcp on the package's `inferscale serve` (tiny model, API keys): the user is
  the one the key and X-User-Id name; tenant b reaches none of tenant a's memories;
- stdio: `inferscale mcp` spawned as MCP clients spawn it, with an embedded Memory on the tiny
  model, and with --base-url on the same server (MemoryClient over the REST routes).
Every tool, bad arguments answered as tool errors, and another user out of reach, on each.
"""

from __future__ import annotations

import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.server import mcp_support
from tests.server.process import KEYS, ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


@asynccontextmanager
async def stdio(args: list[str], log: Path) -> Any:
    """`python -m inferscale_engine.cli mcp ARGS` as an MCP client spawns it (its stderr: log)."""
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "inferscale_engine.cli", "mcp", *args], cwd=ROOT,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"})
    with open(log, "w") as errlog:
        try:
            async with Client(stdio_client(params, errlog=errlog)) as client:
                yield client
        except BaseException:
            errlog.flush()
            print(log.read_text()[-4000:], file=sys.stderr)
            raise


def _as(tenant: str, user_id: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}", "X-User-Id": user_id}


async def test_http_every_tool_for_the_keys_user(server, user_a):
    async with mcp_support.http_client(f"{server.base_url}/mcp", _as("a", user_a)) as client:
        (kept,) = await mcp_support.every_tool(client)
        await mcp_support.bad_arguments(client, kept)


async def test_http_a_tenant_reaches_no_other_tenants_user(server, client_a, user_a, user_b):
    (secret,) = client_a.add(user_id=user_a, texts=["Her locker code is 4321."])
    async with mcp_support.http_client(f"{server.base_url}/mcp", _as("b", user_b)) as client:
        await mcp_support.cannot_reach(client, int(secret.fact_id), "4321", user_a)
    assert [f.text for f in client_a.get_all(user_id=user_a)] == ["Her locker code is 4321."]


async def test_stdio_embedded_memory_every_tool(tiny_models, tmp_path):
    args = ["--user-id", "ann", "--model", str(tiny_models["qwen2"]),
            "--db", str(tmp_path / "memory.db"), "--max-model-len", "2048",
            "--kv-cache-mib", "64", "--slab-mib", "16"]
    async with stdio(args, tmp_path / "mcp.log") as client:
        (kept,) = await mcp_support.every_tool(client)
        await mcp_support.bad_arguments(client, kept)
        for tool, arguments in [("list_memories", {"user_id": "bob"}),
                                ("add_memory", {"texts": ["x"], "user_id": "bob"})]:
            assert "Extra inputs" in await mcp_support.refused(client, tool, **arguments)


async def test_stdio_against_a_server_acts_for_its_one_user(server, client_b, user_a, user_b,
                                                            tmp_path):
    (secret,) = client_b.add(user_id=user_b, texts=["His locker code is 8765."])
    args = ["--user-id", user_a, "--base-url", server.base_url, "--api-key", KEYS["a"]]
    async with stdio(args, tmp_path / "mcp.log") as client:
        (kept,) = await mcp_support.every_tool(client)
        await mcp_support.bad_arguments(client, kept)
        await mcp_support.cannot_reach(client, int(secret.fact_id), "8765", user_b)
    assert [f.text for f in client_b.get_all(user_id=user_b)] == ["His locker code is 8765."]


async def test_stdio_for_a_user_the_key_may_not_reach_answers_tool_errors(server, user_b,
                                                                          tmp_path):
    args = ["--user-id", user_b, "--base-url", server.base_url, "--api-key", KEYS["a"]]
    async with stdio(args, tmp_path / "mcp.log") as client:
        for tool, arguments in [("list_memories", {}), ("add_memory", {"texts": ["x"]}),
                                ("search_memories", {"query": "code"})]:
            assert "may not reach" in await mcp_support.refused(client, tool, **arguments)
