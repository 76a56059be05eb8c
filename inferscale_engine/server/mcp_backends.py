"""What the MCP tools call: MemoryClient's verbs, over a server or over a Memory in this process.

The tools (mcp_tools.py) speak one interface, `MemoryVerbs`: MemoryClient's own verbs and
shapes (MemoryItem, AddResult, HistoryEvent). A MemoryClient is one (`inferscale mcp
--base-url`); `LocalMemory` adapts a Memory to it (`inferscale mcp` with an embedded model, and
the /mcp route of `inferscale serve`). `Opening` opens either in a worker thread, so that an MCP
client's handshake does not wait for a model to load.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

import anyio

from inferscale_engine.errors import FactNotFoundError, InvalidRequestError
from inferscale_engine.memory.types import AddResult, HistoryEvent, MemoryItem


class MemoryVerbs(Protocol):
    """The verbs the MCP tools call, as MemoryClient spells them (every one user-scoped)."""

    def add(self, *, user_id: str, texts: Sequence[str] | None = None,
            metadata: Mapping[str, Any] | None = None, timestamp: Any = None,
            expiration_date: Any = None) -> list[AddResult]: ...

    def search(self, *, user_id: str, query: str, k: int = 5,
               as_of: Any = None) -> list[MemoryItem]: ...

    def get(self, *, user_id: str, fact_id: int) -> MemoryItem: ...

    def get_all(self, *, user_id: str, as_of: Any = None,
                include_superseded: bool = False) -> list[MemoryItem]: ...

    def update(self, *, user_id: str, fact_id: int, text: str,
               metadata: Mapping[str, Any] | None = None) -> Any: ...

    def delete(self, *, user_id: str, fact_ids: Sequence[int]) -> None: ...

    def history(self, *, user_id: str, fact_id: int) -> list[HistoryEvent]: ...

    def supersede(self, *, user_id: str, fact_id: int, text: str | None = None,
                  timestamp: Any = None, metadata: Mapping[str, Any] | None = None
                  ) -> AddResult | None: ...

    def close(self) -> None: ...


class LocalMemory:
    """A Memory with MemoryClient's verbs (blocking: the tools call them in worker threads)."""

    def __init__(self, memory: Any, *, max_add_facts: int | None = None,
                 owns_memory: bool = False) -> None:
        """Wrap an open Memory.

        Args:
            memory: the Memory.
            max_add_facts: the most texts one add may carry (the server's --max-add-facts).
            owns_memory: close() closes the Memory too.
        """
        self.memory, self._max_add_facts, self._owns = memory, max_add_facts, owns_memory

    def add(self, *, user_id: str, texts: Sequence[str] | None = None,
            metadata: Mapping[str, Any] | None = None, timestamp: Any = None,
            expiration_date: Any = None) -> list[AddResult]:
        if self._max_add_facts is not None and len(texts or ()) > self._max_add_facts:
            raise InvalidRequestError(f"{len(texts or ())} memories in one add; at most "
                                      f"{self._max_add_facts} per call: split the add")
        return list(self.memory.add(user_id=user_id, texts=texts, metadata=metadata,
                                    timestamp=timestamp, expiration_date=expiration_date))

    def search(self, *, user_id: str, query: str, k: int = 5,
               as_of: Any = None) -> list[MemoryItem]:
        found = self.memory.search(user_id=user_id, query=query, k=k, as_of=as_of)
        items = []
        for fact, score in found.hits:
            try:  # the stored record has the metadata and times; one deleted since is left out
                items.append(self.memory.get(user_id=user_id, fact_id=fact.fact_id)
                             .to_item(score))
            except FactNotFoundError:
                continue
        return items

    def get(self, *, user_id: str, fact_id: int) -> MemoryItem:
        return self.memory.get(user_id=user_id, fact_id=fact_id).to_item()

    def get_all(self, *, user_id: str, as_of: Any = None,
                include_superseded: bool = False) -> list[MemoryItem]:
        return [r.to_item() for r in self.memory.records(
            user_id=user_id, as_of=as_of, include_superseded=include_superseded)]

    def update(self, *, user_id: str, fact_id: int, text: str,
               metadata: Mapping[str, Any] | None = None) -> Any:
        return self.memory.update(user_id=user_id, fact_id=fact_id, text=text,
                                  metadata=metadata)

    def delete(self, *, user_id: str, fact_ids: Sequence[int]) -> None:
        self.memory.delete(user_id=user_id, fact_ids=fact_ids)

    def history(self, *, user_id: str, fact_id: int) -> list[HistoryEvent]:
        events = list(self.memory.history(user_id=user_id, fact_id=fact_id))
        if not events:  # every fact the user ever had has its ADD
            raise FactNotFoundError(f"user {user_id!r} never had a fact with id {fact_id}")
        return events

    def supersede(self, *, user_id: str, fact_id: int, text: str | None = None,
                  timestamp: Any = None, metadata: Mapping[str, Any] | None = None
                  ) -> AddResult | None:
        return self.memory.supersede(user_id=user_id, fact_id=fact_id, text=text,
                                     timestamp=timestamp, metadata=metadata)

    def close(self) -> None:
        if self._owns:
            self.memory.close()


class Opening:
    """A MemoryVerbs being opened in a worker thread; `get()` waits for it."""

    def __init__(self, open_backend: Callable[[], MemoryVerbs]) -> None:
        self._open = open_backend
        self._future: Future[MemoryVerbs] = Future()
        self._thread: threading.Thread | None = None

    @classmethod
    def ready(cls, backend: MemoryVerbs) -> Opening:
        """One already open (the server's Memory)."""
        opening = cls(lambda: backend)
        opening._future.set_result(backend)
        return opening

    def start(self) -> None:
        """Start opening (once)."""
        if self._thread is None and not self._future.done():
            self._thread = threading.Thread(target=self._run, name="inferscale-mcp-open",
                                            daemon=True)
            self._thread.start()

    async def get(self) -> MemoryVerbs:
        """The backend, once open; raises what opening raised."""
        self.start()
        return await anyio.to_thread.run_sync(self._future.result)

    def close(self) -> None:
        """Wait for an opening under way, then close the backend (if it opened)."""
        if self._thread is not None:
            self._thread.join()
        if self._future.done() and self._future.exception() is None:
            self._future.result().close()

    def _run(self) -> None:
        try:
            self._future.set_result(self._open())
        except BaseException as exc:  # handed to every tool call, which reports it
            self._future.set_exception(exc)
