"""Drives the MCP tools with the SDK's own client: every tool, bad arguments, foreign ids.

Shared by the in-process tests (test_mcp_tools.py) and the transport tests (test_mcp.py), so
every transport answers the same calls the same way.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

TOOLS = {"add_memory", "search_memories", "list_memories", "get_memory", "update_memory",
         "supersede_memory", "delete_memory", "memory_history"}


@asynccontextmanager
async def http_client(url: str, headers: dict[str, str]) -> Any:
    """The SDK's client over streamable HTTP, sending `headers` (key, X-User-Id) on every call."""
    async with httpx2.AsyncClient(headers=headers, timeout=120) as http, \
            Client(streamable_http_client(url, http_client=http)) as client:
        yield client


async def call(client: Any, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured result; fails the test on an error result."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, f"{tool}: {result.content}"
    return dict(result.structured_content)


async def refused(client: Any, tool: str, **arguments: Any) -> str:
    """The text of a tool's error result (the call must fail as a tool error)."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, f"{tool}({arguments}) succeeded: {result.structured_content}"
    return " ".join(block.text for block in result.content)


async def every_tool(client: Any) -> list[int]:
    """Call each of the eight tools and check what they answer; the ids of the memories left.

    The tools act for the session's user, whose memories are expected to be empty at first.
    """
    listed = await client.list_tools()
    assert {t.name for t in listed.tools} == TOOLS
    assert all(t.description and t.input_schema.get("additionalProperties") is False
               for t in listed.tools)
    added = await call(client, "add_memory", timestamp="2020-03-01",
                       texts=["Ann lives in Boston.", "Ann's dog is called Pepper."],
                       metadata={"topic": "home"})
    assert [r["event"] for r in added["results"]] == ["ADD", "ADD"]
    boston, pepper = (r["id"] for r in added["results"])
    again = await call(client, "add_memory", texts=["Ann lives in Boston."])
    assert again["results"] == [{"id": boston, "memory": "Ann lives in Boston.",
                                 "event": "DUPLICATE"}]

    one = await call(client, "get_memory", memory_id=pepper)
    assert (one["memory"], one["metadata"]) == ("Ann's dog is called Pepper.", {"topic": "home"})
    assert one["valid_from"].startswith("2020-03-01") and one["valid_to"] is None

    found = await call(client, "search_memories", query="Ann lives in Boston", limit=1)
    assert [r["id"] for r in found["results"]] == [boston]
    assert found["results"][0]["score"] > 0

    updated = await call(client, "update_memory", memory_id=pepper,
                         text="Ann's beagle is called Pepper.")
    assert (updated["id"], updated["memory"]) == (pepper, "Ann's beagle is called Pepper.")
    assert updated["metadata"] == {"topic": "home"}  # metadata omitted: kept

    moved = await call(client, "supersede_memory", memory_id=boston,
                       text="Ann lives in Lisbon.", timestamp="2023-05-01")
    lisbon = moved["replaced_by"]["id"]
    assert moved["superseded"] == boston and moved["replaced_by"]["memory"] == \
        "Ann lives in Lisbon."
    current = await call(client, "list_memories")
    assert sorted(r["id"] for r in current["results"]) == sorted([pepper, lisbon])
    assert current["total"] == 2
    then = await call(client, "list_memories", as_of="2021-01-01")
    assert sorted(r["id"] for r in then["results"]) == sorted([boston, pepper])
    every = await call(client, "list_memories", include_superseded=True)
    old = next(r for r in every["results"] if r["id"] == boston)
    assert old["superseded_by"] == lisbon and old["valid_to"].startswith("2023-05-01")
    past = await call(client, "search_memories", query="Where does Ann live?", limit=5,
                      as_of="2021-01-01")
    assert boston in [r["id"] for r in past["results"]]
    assert lisbon not in [r["id"] for r in past["results"]]
    latest = await call(client, "list_memories", limit=1)
    assert [r["id"] for r in latest["results"]] == [lisbon] and latest["total"] == 2

    history = await call(client, "memory_history", memory_id=boston)
    assert [e["event"] for e in history["events"]] == ["ADD", "SUPERSEDE"]
    assert history["events"][1]["new_memory"] == "Ann lives in Lisbon."
    assert [e["event"] for e in (await call(client, "memory_history", memory_id=pepper))
            ["events"]] == ["ADD", "UPDATE"]

    assert await call(client, "delete_memory", memory_id=pepper) == {"deleted": pepper}
    assert "no memory with id" in await refused(client, "get_memory", memory_id=pepper)
    assert [e["event"] for e in (await call(client, "memory_history", memory_id=pepper))
            ["events"]] == ["ADD", "UPDATE", "DELETE"]
    return [lisbon]


async def bad_arguments(client: Any, memory_id: int) -> None:
    """Arguments a tool refuses come back as tool errors naming the problem; serving goes on."""
    cases = [
        ("get_memory", {}, "memory_id"),  # missing
        ("get_memory", {"memory_id": "twelve"}, "memory_id"),  # not an int
        ("get_memory", {"memory_id": 0}, "memory_id"),  # below 1
        ("add_memory", {"texts": []}, "texts"),
        ("add_memory", {"texts": ["   "]}, "text"),  # blank: the memory's own check
        ("search_memories", {"query": "x", "limit": 0}, "limit"),
        ("search_memories", {"query": "x", "as_of": "last year"}, "as_of"),
        ("list_memories", {"as_of": "2021-01-01", "include_superseded": True}, "not both"),
        ("update_memory", {"memory_id": memory_id}, "text"),
        ("supersede_memory", {"memory_id": memory_id, "timestamp": "soon"}, "timestamp"),
        ("search_memories", {"query": "x", "top_k": 3}, "top_k"),  # undeclared: refused
        ("get_memory", {"memory_id": 10**9}, "no memory with id"),
    ]
    for tool, arguments, says in cases:
        text = await refused(client, tool, **arguments)
        assert says in text, (tool, arguments, text)
    unknown = await client.call_tool("no_such_tool", {})
    assert unknown.is_error
    assert (await call(client, "get_memory", memory_id=memory_id))["id"] == memory_id


async def cannot_reach(client: Any, foreign_id: int, foreign_text: str,
                       foreign_user: str) -> None:
    """No argument of any tool reaches another user's memory or names another user."""
    for tool, arguments in [
            ("get_memory", {"memory_id": foreign_id}),
            ("update_memory", {"memory_id": foreign_id, "text": "Overwritten."}),
            ("supersede_memory", {"memory_id": foreign_id, "text": "Replaced."}),
            ("delete_memory", {"memory_id": foreign_id}),
            ("memory_history", {"memory_id": foreign_id})]:
        text = await refused(client, tool, **arguments)
        assert "no memory with id" in text and foreign_text not in text, (tool, text)
    for tool, arguments in [
            ("get_memory", {"memory_id": foreign_id, "user_id": foreign_user}),
            ("list_memories", {"user_id": foreign_user}),
            ("search_memories", {"query": foreign_text, "filters": {"user_id": foreign_user}}),
            ("add_memory", {"texts": ["Planted."], "user_id": foreign_user})]:
        assert "Extra inputs are not permitted" in await refused(client, tool, **arguments)
    found = await call(client, "search_memories", query=foreign_text, limit=100)
    listed = await call(client, "list_memories", include_superseded=True)
    assert foreign_id not in [r["id"] for r in found["results"] + listed["results"]]
