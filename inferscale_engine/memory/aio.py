"""Memory's verbs made of others: forwarded to a part, and the async twins (main.py).

forward() makes the verbs of Memory that its parts (Editing, Listing, Answering) implement. The
async verbs (aadd, asearch, agenerate, astream and the rest) are each typed as its synchronous
twin and run it in a worker thread, so an event loop never blocks on the embedder, SQLite or
vLLM; astream hands each step's Generation to the loop as the engine
produces it (over `inferscale serve`'s AsyncLLM the engine side is vLLM's own async engine).
Closing an async stream early (break, cancellation) aborts the request.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar

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


S = TypeVar("S")
P = ParamSpec("P")
R = TypeVar("R")


def forward(part: str, verb: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[Any, P], R]:
    """A verb of the facade (Memory) that runs `verb` on its part `part` (its attribute).

    The same name, signature, docstring and types as `verb`, as the connector's facade forwards
    vLLM's hooks to its scheduler and worker halves.
    """
    @functools.wraps(verb)
    def call(facade: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        method: Callable[P, R] = getattr(getattr(facade, part), verb.__name__)
        return method(*args, **kwargs)
    return call


def in_thread(verb: Callable[Concatenate[S, P], R]
              ) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """The async twin of a verb: the same arguments, its result, run in a worker thread.

    Typed as the verb (asearch returns a SearchResult to the type checker). The verb is looked
    up by name on the object at call time, so a subclass's override is the one run.
    """
    name = verb.__name__

    async def twin(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        verb_of_self: Callable[P, R] = getattr(self, name)
        return await asyncio.to_thread(verb_of_self, *args, **kwargs)

    return _named(twin, name, f"{name}() without blocking the event loop (the same keyword "
                              "arguments).")


def streamed(verb: Callable[Concatenate[S, P], Iterator[T]]
             ) -> Callable[Concatenate[S, P], AsyncIterator[T]]:
    """The async twin of a stream verb: its items as an async iterator (iterate_in_thread)."""
    name = verb.__name__

    async def twin(self: S, /, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[T]:
        async for item in iterate_in_thread(lambda: getattr(self, name)(*args, **kwargs)):
            yield item

    return _named(twin, name, f"{name}() as an async iterator: each step's Generation as it "
                              "is produced.")


F = TypeVar("F", bound=Callable[..., Any])


def _named(twin: F, name: str, doc: str) -> F:
    twin.__name__ = twin.__qualname__ = f"a{name}"
    twin.__doc__ = doc
    return twin
