"""The MCP tools over streamable HTTP at /mcp on `inferscale serve` (the SDK's session manager).

Every request to /mcp first passes the server's gate, as every route does (main.install: Host
names, the API key, tenant routes): the key's Principal is on the request. Here the user is
resolved as the REST routes resolve it, from the `X-User-Id` header, normalized and checked
against the key (identity.resolve_user: 400, 403 before any MCP message is read). The tools act
for that user only (mcp_tools.py: no tool takes a user id). The SDK binds each MCP session to
the credential that opened it: a request that names another tenant or user on the same session
id is answered 404, as an unknown session.

Without API keys the gate answers loopback Host names only (hosts.py); a cross-site `Origin`
is refused here too, as the MCP transport rules ask of local servers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from inferscale_engine.server.auth import HttpError, Principal
from inferscale_engine.server.hosts import AllowedHosts
from inferscale_engine.server.identity import header_user, resolve_user
from inferscale_engine.server.mcp_backends import LocalMemory, Opening
from inferscale_engine.server.mcp_tools import build_server
from inferscale_engine.server.routes import http_error_response

PATH = "/mcp"
_NO_USER = ("this MCP session names no user: send the X-User-Id header (a user your API key "
            "may reach) with every request to /mcp; see docs/mcp.md")


def mount(app: FastAPI, memory: Any, hosts: AllowedHosts, max_add_facts: int) -> None:
    """Serve the MCP tools over `memory` at /mcp; the session manager runs with the app."""
    server = build_server(Opening.ready(LocalMemory(memory, max_add_facts=max_add_facts)),
                          session_user)
    # The gate checks Host names for every route (hosts.py); the SDK's own check would
    # refuse names the server is told to answer (--allowed-hosts) and 127.0.0.2 and the like.
    server.streamable_http_app(transport_security=TransportSecuritySettings(
        enable_dns_rebinding_protection=False))
    manager = server.session_manager
    app.router.routes.append(Route(PATH, McpEndpoint(manager, hosts), include_in_schema=False,
                                   methods=["GET", "POST", "DELETE"]))  # the transport's
    serving = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        async with manager.run(), serving(app_) as state:
            yield state

    app.router.lifespan_context = lifespan


class McpEndpoint:
    """The ASGI app at /mcp: binds the request to its user, then hands it to the SDK."""

    def __init__(self, manager: StreamableHTTPSessionManager, hosts: AllowedHosts) -> None:
        self.manager, self.hosts = manager, hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        principal: Principal | None = scope.get("state", {}).get("principal")
        try:
            origin = headers.get("origin")
            if origin is not None and not self.hosts.allows(urlsplit(origin).netloc or origin):
                raise HttpError(403, f"Origin {origin!r:.80} is another site's; the MCP "
                                     "endpoint answers pages of this server's own names only",
                                "permission_error")
            user_id = resolve_user([("X-User-Id", header_user(headers))], principal)
        except HttpError as exc:
            await http_error_response(exc)(scope, receive, send)
            return
        if principal is not None or user_id is not None:
            scope["user"] = AuthenticatedUser(AccessToken(
                token="inferscale", scopes=[], subject=user_id,
                client_id=principal.tenant if principal is not None else "local"))
        await self.manager.handle_request(scope, receive, send)


def session_user(ctx: Context) -> str:
    """The user McpEndpoint bound the tool call's HTTP request to.

    Raises:
        ToolError: the request named no user.
    """
    request = ctx.request_context.request
    user = request.scope.get("user") if request is not None else None
    subject = user.access_token.subject if isinstance(user, AuthenticatedUser) else None
    if subject is None:
        raise ToolError(_NO_USER)
    return str(subject)
