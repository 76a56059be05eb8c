"""Memory's async verbs: aadd, asearch, agenerate, astream and the rest.

Each runs its synchronous twin in a worker thread, so an event loop never blocks on the
embedder, SQLite or vLLM; astream hands each step's Generation to the loop as the engine
produces it (over `inferscale serve`'s AsyncLLM the engine side is vLLM's own async engine).
Closing an async stream early (break, cancellation) aborts the request.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
_DONE = object()


async def iterate_in_thread(make: Callable[[], Iterator[T]]) -> AsyncIterator[T]:
    """The items of make()'s iterator, produced in a worker thread, as an async iterator."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[Any, BaseException | None]] = asyncio.Queue()
    stop = threading.Event()

    def pump() -> None:
        try:
            items = make()
            try:
                for item in items:
                    loop.call_soon_threadsafe(queue.put_nowait, (item, None))
                    if stop.is_set():
                        break
            finally:
                close = getattr(items, "close", None)
                if close is not None:
                    close()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
            loop.call_soon_threadsafe(queue.put_nowait, (_DONE, exc))
            return
        loop.call_soon_threadsafe(queue.put_nowait, (_DONE, None))

    worker = loop.run_in_executor(None, pump)
    try:
        while True:
            item, error = await queue.get()
            if item is _DONE:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()  # the worker stops after its current step and closes the stream
        await asyncio.shield(worker)


F = TypeVar("F", bound=Callable[..., Any])


def _named(verb: F, name: str, doc: str) -> F:
    verb.__name__ = verb.__qualname__ = f"a{name}"
    verb.__doc__ = doc
    return verb


def _in_thread(name: str) -> Callable[..., Awaitable[Any]]:
    """An async verb that runs the synchronous verb `name` in a worker thread."""
    async def verb(self: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(lambda: getattr(self, name)(**kwargs))

    return _named(verb, name, f"{name}() without blocking the event loop (the same keyword "
                              "arguments).")


def _streamed(name: str) -> Callable[..., AsyncIterator[Any]]:
    """An async iterator verb over the synchronous stream verb `name` (iterate_in_thread)."""
    async def verb(self: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async for generation in iterate_in_thread(lambda: getattr(self, name)(**kwargs)):
            yield generation

    return _named(verb, name, f"{name}() as an async iterator: each step's Generation as it "
                              "is produced.")


class AsyncVerbs:
    """The async verbs of Memory (a base class); arguments as their synchronous twins'."""

    aadd = _in_thread("add")
    aadd_turns = _in_thread("add_turns")
    aupdate = _in_thread("update")
    adelete = _in_thread("delete")
    areset = _in_thread("reset")
    asearch = _in_thread("search")
    aget = _in_thread("get")
    aget_all = _in_thread("get_all")
    arecords = _in_thread("records")
    agenerate = _in_thread("generate")
    aanswer = _in_thread("answer")
    astream = _streamed("stream")
    aanswer_stream = _streamed("answer_stream")
