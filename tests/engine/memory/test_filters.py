"""Metadata filters: bounded before they are evaluated, evaluated where no one else waits.

A filter is checked against its limits (depth, list lengths, values, characters) before any
fact is looked at, with an error that names the limit. It is then evaluated outside the
Memory's lock, and on the server outside the thread pool that serves every chat's retrieval:
another user's search and chat go on while one user's filter is evaluated, however long that
takes. The "long" is made structural here: a filter value whose comparison blocks until the
test releases it.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from starlette.requests import Request

from inferscale_engine.errors import InvalidRequestError
from inferscale_engine.memory.search.filters import (
    MAX_FILTER_CHARS,
    MAX_FILTER_DEPTH,
    MAX_FILTER_LIST,
    MAX_FILTER_NODES,
    check_filter,
)
from tests.conftest import FACTS, QUESTIONS

WAIT_S = 120.0
"""How long a step may take before the test calls it stuck (a failure, not a measurement)."""
POOL_MAX = 32
"""The most threads asyncio's default pool has (min(32, CPUs + 4))."""


def _nested(depth: int) -> dict:
    value: dict = {"kind": "pet"}
    for _ in range(depth):
        value = {"AND": [value]}
    return value


def _list_in_list(depth: int) -> list:
    value: list = [1]
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("bad,words", [
    (_nested(350), f"deeper than {MAX_FILTER_DEPTH}"),
    ({"kind": {"$in": list(range(MAX_FILTER_LIST + 1))}}, f"at most {MAX_FILTER_LIST}"),
    ({"OR": [{"k": {"$in": list(range(900))}}] * 3}, f"more than {MAX_FILTER_NODES} values"),
    ({"kind": "x" * (MAX_FILTER_CHARS + 1)}, f"{MAX_FILTER_CHARS} characters"),
    ({"kind": {"nested": _list_in_list(MAX_FILTER_DEPTH)}}, "deeper than"),  # a literal too
    ({"AND": {"kind": "pet"}}, "AND takes a list of filters"),
    ({"OR": {"kind": "pet"}}, "OR takes a list of filters"),
    ({"NOT": [{"kind": "pet"}]}, "NOT takes a filter"),
    ({"kind": {"$in": "pet"}}, "$in takes a list"),
])
def test_filters_are_bounded_and_of_the_grammar_before_evaluation(bad, words):
    with pytest.raises(InvalidRequestError, match=words.replace("$", r"\$")):
        check_filter(bad)


def test_filters_within_the_limits_are_accepted():
    deepest = _nested((MAX_FILTER_DEPTH - 2) // 2)
    largest = {"kind": {"$in": [f"v{i}" for i in range(MAX_FILTER_LIST)]},
               "NOT": {"year": {"$lt": 2000}}}
    for good in (deepest, largest, {"OR": [{"kind": "pet"}, {"kind": "trip"}]}):
        assert check_filter(good) == good


class Blocking:
    """A filter value whose comparison waits until released: an evaluation as long as needed."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()
        self.threads: set[str] = set()

    def __eq__(self, other: object) -> bool:
        self.threads.add(threading.current_thread().name)
        self.entered.release()
        assert self.release.wait(WAIT_S), "never released"
        return False

    __hash__ = None  # type: ignore[assignment]


@pytest.mark.vllm
def test_a_filter_is_evaluated_outside_the_memory_lock(fresh_memory):
    memory = fresh_memory
    memory.add(user_id="ann", texts=FACTS[:3], metadata={"kind": "trip"})
    memory.add(user_id="bob", texts=FACTS[3:])
    blocking = Blocking()
    done: dict[str, object] = {}

    def filtered() -> None:
        done["ann"] = memory.search(user_id="ann", query=QUESTIONS[0], k=2,
                                    filter={"kind": blocking})

    ann = threading.Thread(target=filtered)
    ann.start()
    try:
        assert blocking.entered.acquire(timeout=WAIT_S)  # ann's filter is being evaluated
        # meanwhile another user is searched and answered: neither waits for ann's filter
        bob = threading.Thread(target=lambda: done.update(
            bob=memory.search(user_id="bob", query=QUESTIONS[2], k=2),
            answer=memory.generate(user_id="bob", query=QUESTIONS[2], k=2)))
        bob.start()
        bob.join(WAIT_S)
        assert not bob.is_alive() and "answer" in done, "bob waited for ann's filter"
        assert ann.is_alive()  # still in its evaluation
    finally:
        blocking.release.set()
        ann.join(WAIT_S)
    assert done["ann"].facts == []  # type: ignore[attr-defined]  # nothing equals Blocking


async def _entered(blocking: Blocking) -> None:
    """Wait (without a thread: the pool may be full) until a filter is being evaluated."""
    for _ in range(int(WAIT_S / 0.05)):
        if blocking.entered.acquire(blocking=False):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("no filter was evaluated")


@pytest.mark.vllm
async def test_filtered_routes_leave_the_chats_pool_free(fresh_memory):
    """More filtered requests than asyncio's pool has threads, each stuck in its filter: a
    chat's retrieval (the seam's asyncio.to_thread) is still served."""
    from inferscale_engine.server import mem0_api
    from inferscale_engine.server.seam import SeamState

    memory = fresh_memory
    memory.add(user_id="ann", texts=FACTS[:3], metadata={"kind": "trip"})
    memory.add(user_id="bob", texts=FACTS[3:])
    shared = SeamState(memory)

    class App:
        class state:  # noqa: N801 - Starlette's app.state
            inferscale = shared

    request = Request({"type": "http", "method": "POST", "path": "/v3/memories/search/",
                       "headers": [], "app": App()})
    blocking = Blocking()
    searches = [asyncio.ensure_future(mem0_api.search(request, mem0_api.SearchBody(
        query=QUESTIONS[0], filters={"user_id": "ann", "kind": blocking})))
        for _ in range(POOL_MAX + 1)]
    try:
        await _entered(blocking)
        prepared = await asyncio.wait_for(asyncio.to_thread(
            memory.prepare, user_id="bob", query=QUESTIONS[2], k=2,
            messages=[{"role": "user", "content": QUESTIONS[2]}]), WAIT_S)
        assert prepared.num_facts == 2
        assert not any(s.done() for s in searches)  # all of ann's are still waiting
        assert all(name.startswith("inferscale-filters") for name in blocking.threads)
    finally:
        blocking.release.set()
        results = await asyncio.gather(*searches, return_exceptions=True)
        shared.close()
    assert all(r == {"results": []} for r in results), results[:2]
