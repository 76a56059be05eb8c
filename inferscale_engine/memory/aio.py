"""Memory's async verbs: aadd, asearch, agenerate, astream and the rest.

Each runs its synchronous twin in a worker thread, so an event loop never blocks on the
embedder, SQLite or vLLM; astream hands each step's Generation to the loop as the engine
produces it (over `inferscale serve`'s AsyncLLM the engine side is vLLM's own async engine).
Closing an async stream early (break, cancellation) aborts the request.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
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


class AsyncVerbs:
    """The async verbs of Memory (a base class); arguments as their synchronous twins'."""

    add: Callable[..., Any]
    add_turns: Callable[..., Any]
    update: Callable[..., Any]
    delete: Callable[..., Any]
    reset: Callable[..., Any]
    search: Callable[..., Any]
    get: Callable[..., Any]
    get_all: Callable[..., Any]
    records: Callable[..., Any]
    generate: Callable[..., Any]
    answer: Callable[..., Any]
    stream: Callable[..., Iterator[Any]]
    answer_stream: Callable[..., Iterator[Any]]

    async def aadd(self, **kwargs: Any) -> Any:
        """add() without blocking the event loop."""
        return await asyncio.to_thread(lambda: self.add(**kwargs))

    async def aadd_turns(self, **kwargs: Any) -> Any:
        """add_turns() without blocking the event loop."""
        return await asyncio.to_thread(lambda: self.add_turns(**kwargs))

    async def aupdate(self, **kwargs: Any) -> Any:
        """update() without blocking the event loop."""
        return await asyncio.to_thread(lambda: self.update(**kwargs))

    async def adelete(self, **kwargs: Any) -> Any:
        """delete() without blocking the event loop."""
        return await asyncio.to_thread(lambda: self.delete(**kwargs))

    async def areset(self, **kwargs: Any) -> Any:
        """reset() without blocking the event loop."""
        return await asyncio.to_thread(lambda: self.reset(**kwargs))

    async def asearch(self, **kwargs: Any) -> Any:
        """search() without blocking the event loop."""
        return await asyncio.to_thread(lambda: self.search(**kwargs))

    async def aget(self, **kwargs: Any) -> Any:
        """get() without blocking the event loop."""
        return await asyncio.to_thread(lambda: self.get(**kwargs))

    async def aget_all(self, **kwargs: Any) -> Any:
        """get_all() without blocking the event loop."""
        return await asyncio.to_thread(lambda: self.get_all(**kwargs))

    async def arecords(self, **kwargs: Any) -> Any:
        """records() without blocking the event loop."""
        return await asyncio.to_thread(lambda: self.records(**kwargs))

    async def agenerate(self, **kwargs: Any) -> Any:
        """generate() without blocking the event loop."""
        return await asyncio.to_thread(lambda: self.generate(**kwargs))

    async def aanswer(self, **kwargs: Any) -> Any:
        """answer() without blocking the event loop."""
        return await asyncio.to_thread(lambda: self.answer(**kwargs))

    async def astream(self, **kwargs: Any) -> AsyncIterator[Any]:
        """stream() as an async iterator: each step's Generation as it is produced."""
        async for generation in iterate_in_thread(lambda: self.stream(**kwargs)):
            yield generation

    async def aanswer_stream(self, **kwargs: Any) -> AsyncIterator[Any]:
        """answer_stream() as an async iterator."""
        async for generation in iterate_in_thread(lambda: self.answer_stream(**kwargs)):
            yield generation
