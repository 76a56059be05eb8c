"""Request limits of `inferscale serve`: the head (431), the body (413), memories per add (413).

Both are enforced while bytes arrive, so nothing over a limit is buffered: the head by the HTTP
protocol uvicorn runs (h11, with a byte count before the request is parsed), the body by ASGI
middleware (Content-Length first, a chunked body counted as it is read).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

import h11
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from inferscale_engine.server.auth import HttpError

MAX_BODY_BYTES = 8 * 2**20
"""Requests with a larger body are refused (413) before they are read."""
MAX_FILTER_BODY_BYTES = 256 * 2**10
"""Bodies of the routes that take a metadata filter (FILTER_PATHS) are refused (413) beyond
this, before they are read: a filter is evaluated against every fact (memory/search/filters.py
bounds it further once parsed)."""
FILTER_PATHS = frozenset({"/v1/memories/search", "/v3/memories/", "/v3/memories/search/"})
MAX_HEAD_BYTES = 32 * 2**10
"""Requests whose request line and headers together are larger are refused (431)."""
DEFAULT_MAX_ADD_FACTS = 1000
"""Facts (or turns) one POST /v1/memories may add (413 beyond; --max-add-facts). A large add
runs in chunks that yield to other users' chats; this bounds how long one request works."""


class BoundedHeadProtocol(H11Protocol):
    """uvicorn's h11 protocol, answering 431 to a request head over MAX_HEAD_BYTES.

    uvicorn's default protocol (httptools) buffers a header of any size; h11 alone answers an
    over-long head with a bare 400 only past vLLM's 4 MiB h11 limit.
    """

    max_head_bytes = MAX_HEAD_BYTES
    refusals: Counter[int] | None = None
    """Where refusals are counted by status (the server's, see counting())."""

    @classmethod
    def counting(cls, refusals: Counter[int]) -> type[BoundedHeadProtocol]:
        """The protocol class, counting its 431s in `refusals` (one instance per connection)."""
        return type(cls.__name__, (cls,), {"refusals": refusals})

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:  # the request's head is not parsed yet
            pending = self.conn.trailing_data[0] + data
            if (len(pending) > self.max_head_bytes
                    and b"\r\n\r\n" not in pending[:self.max_head_bytes + 4]):
                self._refuse_head(len(pending))
                return
        super().data_received(data)

    def _refuse_head(self, num_bytes: int) -> None:
        if self.refusals is not None:
            self.refusals[431] += 1
        body = json.dumps(HttpError(
            431, f"request headers over {self.max_head_bytes} bytes ({num_bytes}+ received); "
                 "send a shorter user id and fewer or smaller headers",
            "request_header_fields_too_large").body()).encode()
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n%b" % (len(body), body))
        self.transport.close()


class BodyLimit:
    """ASGI middleware: a body over max_bytes (or its path's own limit) gets 413.

    Content-Length is checked first; a chunked body is counted as it is read, so nothing over
    the limit is buffered.
    """

    def __init__(self, app: Any, max_bytes: int, paths: Mapping[str, int] | None = None
                 ) -> None:
        self.app, self.max_bytes, self.paths = app, max_bytes, dict(paths or {})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from inferscale_engine.server.routes import http_error_response

        max_bytes = self.paths.get(scope["path"], self.max_bytes)
        text = f"request body over {max_bytes} bytes on {scope['path']}; send less"
        refusal = http_error_response(HttpError(413, text))
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > max_bytes):
            await refusal(scope, receive, send)
            return
        received, exceeded, started = 0, False, False

        async def limited() -> Any:
            nonlocal received, exceeded
            message = await receive()
            received += len(message.get("body", b""))
            if received > max_bytes:
                exceeded = True
                raise StarletteHTTPException(413, text)
            return message

        async def guarded(message: Any) -> None:
            # Whatever the app makes of the interrupted body (FastAPI: a 400), the answer is
            # our 413.
            nonlocal started
            if message["type"] == "http.response.start":
                if started:
                    return
                started = True
                if exceeded:
                    await refusal(scope, receive, send)
                    return
            if not exceeded:
                await send(message)

        try:
            await self.app(scope, limited, guarded)
        except Exception:
            if not exceeded:
                raise
        if exceeded and not started:
            await refusal(scope, receive, send)


class CountRefusals:
    """ASGI middleware: counts every answer with a 4xx status, by status (for /metrics)."""

    def __init__(self, app: Any, counts: Counter[int]) -> None:
        self.app, self.counts = app, counts

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counted(message: Any) -> None:
            if message["type"] == "http.response.start" and 400 <= message["status"] < 500:
                self.counts[message["status"]] += 1
            await send(message)

        await self.app(scope, receive, counted)
