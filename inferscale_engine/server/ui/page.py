"""The inspector's static page, its security headers, and the cross-site check of its writes.

The key lives in the page (sessionStorage) and travels as `Authorization: Bearer` on fetch:
there are no cookies, so a foreign site cannot make a browser send it. Writes are refused all
the same when the browser says they come from another site (Origin, Sec-Fetch-Site). The page
runs no inline script and no script from elsewhere (Content-Security-Policy), and renders every
stored text with textContent, never as HTML.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from inferscale_engine.server.auth import HttpError

PREFIX = "/ui"
ASSETS = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8",
          "icon.svg": "image/svg+xml"}
"""The files the page loads (static/), by name; nothing else is served from that folder."""
PUBLIC = frozenset({PREFIX, PREFIX + "/", *(f"{PREFIX}/static/{name}" for name in ASSETS)})
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self'; connect-src 'self'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
"""On every /ui response: the page, its files, the JSON routes and their errors."""

router = APIRouter(include_in_schema=False)


def public(path: str) -> bool:
    """True for the page and its files, which load without a key (they hold no data)."""
    return path in PUBLIC


def secured(path: str, response: Any) -> Any:
    """`response` with the inspector's security headers if it answers a /ui path."""
    if path == PREFIX or path.startswith(PREFIX + "/"):
        for name, value in HEADERS.items():
            response.headers[name] = value
    return response


def check_same_origin(request: Request) -> None:
    """Refuse (403) a POST or DELETE that the browser says comes from another site.

    Requests without these headers (API clients, curl) pass: they carry the key themselves.
    Host alone proves nothing (a DNS-rebinding page sends its own name as Host and Origin, and
    Sec-Fetch-Site: same-origin): the Origin must also name a host the server answers
    (server/hosts.py). Behind a proxy, keep the Host header (nginx: proxy_set_header Host $host).
    """
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return
    origin = request.headers.get("origin")
    site = request.headers.get("sec-fetch-site")
    host = request.headers.get("host", "")
    netloc = urlsplit(origin).netloc if origin is not None else None
    if (netloc is not None and (origin == "null" or netloc != host
                                or not request.app.state.allowed_hosts.allows(netloc))) or (
            site is not None and site not in ("same-origin", "none")):
        raise HttpError(403, f"cross-site write refused (Origin {origin!r:.80}, Sec-Fetch-Site "
                             f"{site!r:.20}); use the inspector served by this server",
                        "permission_error")


@cache
def _asset(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


@router.get(PREFIX)
async def page() -> Response:
    """The inspector's single page."""
    return Response(_asset("index.html"), media_type="text/html; charset=utf-8")


@router.get(PREFIX + "/")
async def page_slash() -> Response:
    """/ui/ -> /ui (one address for the page)."""
    return RedirectResponse(PREFIX)


@router.get(PREFIX + "/static/{name}")
async def asset(name: str) -> Response:
    """The page's script or style."""
    if name not in ASSETS:
        raise HttpError(404, f"no inspector file {name!r:.60}", "not_found_error")
    return Response(_asset(name), media_type=ASSETS[name])
