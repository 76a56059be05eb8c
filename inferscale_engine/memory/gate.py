"""InteractiveGate: bulk work (a large add) yields to interactive calls (search, chat).

A Memory serves many users from one engine, one embedder and one index. A large add runs in
chunks sized to take about `chunk_s` each (the size adapts to what the last chunk cost, so it
holds on a laptop and on a GPU alike; an add of up to `whole_up_to` facts is one chunk, so a
run of facts stays one save request, and a larger one starts with a `probe` chunk); between
chunks it waits until no interactive call is in flight. Another user's search or chat then
waits for at most one chunk of someone's bulk work, never for all of it. Under sustained
interactive load the bulk work still advances: one chunk per `max_wait_s` at least.

Bulk work done ON BEHALF of an interactive call (a chat's own memory.add, run in a worker
thread by asyncio.to_thread, which carries the caller's context) does not wait for that call:
the calls a context holds are counted in a ContextVar and left out of the wait.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

_HELD: ContextVar[int] = ContextVar("inferscale_interactive_held", default=0)
"""Interactive calls the current context (thread or task, and what it hands work to) holds."""


class InteractiveGate:
    """Counts interactive calls in flight; bulk loops wait for none between chunks."""

    def __init__(self, chunk_s: float = 0.1, max_wait_s: float = 1.0, whole_up_to: int = 16,
                 probe: int = 4, max_chunk: int = 256) -> None:
        self._chunk_s, self._max_wait_s = chunk_s, max_wait_s
        self._whole_up_to, self._probe, self._max_chunk = whole_up_to, probe, max_chunk
        self._active = 0
        self._idle = threading.Condition()
        self.timeouts = 0
        """Turns that bulk work took after max_wait_s, interactive calls still in flight."""

    @property
    def chunk_s(self) -> float:
        """The time budget of one chunk of bulk work (how long an interactive call may wait)."""
        return self._chunk_s

    @contextmanager
    def interactive(self) -> Iterator[None]:
        """Mark an interactive call for the duration of the block (nesting is fine)."""
        with self._idle:
            self._active += 1
        _HELD.set(_HELD.get() + 1)
        try:
            yield
        finally:
            # set, not reset: a streamed answer may close the block in another context
            _HELD.set(max(0, _HELD.get() - 1))
            with self._idle:
                self._active -= 1
                if not self._active:
                    self._idle.notify_all()

    def wait_turn(self) -> None:
        """Return once no interactive call but the caller's own is in flight.

        Or after max_wait_s, counted in `timeouts`.
        """
        own = _HELD.get()
        with self._idle:
            if not self._idle.wait_for(lambda: self._active <= own, timeout=self._max_wait_s):
                self.timeouts += 1

    def chunks(self, num_items: int) -> Iterator[tuple[int, int]]:
        """[lo, hi) ranges covering num_items, each sized to take about chunk_s.

        The caller's work on a range is what is timed (the generator resumes after it); before
        every range but the first, the generator waits for its turn (wait_turn).
        """
        lo = 0
        size = num_items if num_items <= self._whole_up_to else self._probe
        while lo < num_items:
            if lo:
                self.wait_turn()
            hi = min(num_items, lo + size)
            start = time.perf_counter()
            yield lo, hi
            per_item = (time.perf_counter() - start) / (hi - lo)
            size = max(1, min(self._max_chunk, int(self._chunk_s / max(per_item, 1e-6))))
            lo = hi

    @property
    def num_active(self) -> int:
        """Interactive calls in flight now."""
        return self._active


def interactive_call(method: Callable[P, R]) -> Callable[P, R]:
    """Decorate a method of an object with a `_gate`: large adds yield to its calls."""
    @functools.wraps(method)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        with args[0]._gate.interactive():  # type: ignore[attr-defined]
            return method(*args, **kwargs)
    return wrapped
