"""InteractiveGate (memory/gate.py): bulk work yields to other calls' interactive work, and
never to the interactive call it is done for (a chat's own memory.add)."""

from __future__ import annotations

import asyncio
import contextvars
import threading

from inferscale_engine.memory.gate import InteractiveGate

CHUNKS = 6


def gate() -> InteractiveGate:
    """One item per chunk (a turn before each chunk but the first); short waits."""
    return InteractiveGate(max_wait_s=0.02, whole_up_to=0, probe=1, max_chunk=1)


def bulk(g: InteractiveGate) -> list[tuple[int, int]]:
    return list(g.chunks(CHUNKS))


def test_bulk_work_of_the_interactive_call_itself_does_not_wait_for_it():
    g = gate()
    with g.interactive():
        done: list[list[tuple[int, int]]] = []
        worker = threading.Thread(  # as asyncio.to_thread runs it: the caller's context
            target=contextvars.copy_context().run, args=(lambda: done.append(bulk(g)),))
        worker.start()
        worker.join()
    assert done == [[(i, i + 1) for i in range(CHUNKS)]] and g.timeouts == 0


def test_bulk_work_of_another_context_waits_for_interactive_calls():
    g = gate()
    with g.interactive():
        other = threading.Thread(target=bulk, args=(g,))  # a fresh context: not the caller's
        other.start()
        other.join()
    assert g.timeouts == CHUNKS - 1  # every turn waited its max_wait_s out


def test_a_chat_awaiting_its_own_add_in_a_thread_does_not_wait_for_itself():
    g = gate()

    async def chat() -> list[tuple[int, int]]:
        with g.interactive():
            return await asyncio.to_thread(bulk, g)

    assert asyncio.run(chat()) == [(i, i + 1) for i in range(CHUNKS)] and g.timeouts == 0
    with g.interactive():  # that chat's block is over: a new call in flight is waited for
        other = threading.Thread(target=bulk, args=(g,))
        other.start()
        other.join()
    assert g.timeouts == CHUNKS - 1 and g.num_active == 0


def test_a_nested_call_in_the_same_context_is_its_own():
    g = gate()
    with g.interactive(), g.interactive():
        assert bulk(g) == [(i, i + 1) for i in range(CHUNKS)]
    assert g.timeouts == 0 and g.num_active == 0
