"""API keys: who may call the server and for which users.

The keys file (JSON) maps each key to a tenant, the user ids it may reach (exact ids, or a
prefix ending in '*') and an admin flag; only admin keys may reset or delete a whole user:

    {"keys": {"sk-app-1": {"tenant": "acme", "users": ["acme:*"]},
              "sk-ops":   {"tenant": "acme", "users": ["acme:*"], "admin": true}}}

With keys, every route needs `Authorization: Bearer <key>` (or `X-API-Key`) but the liveness
probes (PUBLIC_PATHS) and the inspector's page and files (server/ui: they hold no data); a tenant
key reaches the chat, completion, model and memory routes (the MCP endpoint /mcp included) only
(tenant_route), an admin key every route.
Without keys the server refuses to listen on anything but the loopback interface.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferscale_engine.checks import check_user_id
from inferscale_engine.errors import (
    AddQueueFullError,
    ConfigError,
    EngineClosedError,
    FactNotFoundError,
    HandleError,
    InferScaleError,
    StoreError,
)

LOOPBACK = ("127.0.0.1", "::1", "localhost")
TENANT_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models", "/health",
                          "/ping", "/version", "/tokenize", "/detokenize", "/v1/ping/"})
"""Routes a tenant key reaches, besides the memory API; every other route of vLLM's app
(control routes such as /scale_elastic_ep, server-wide /metrics, other generation APIs that
bypass the memory seam) needs an admin key."""
PUBLIC_PATHS = frozenset({"/health", "/ping"})
"""Liveness probes, answered without a key: load balancers and routers (vllm-router's health
checker) poll them with no credentials, and they tell nothing but 'up'."""
TENANT_PREFIXES = ("/v1/memories", "/v3/memories", "/v1/event", "/ui/api", "/mcp")
"""The memory APIs (ours, the routes mem0's client calls: server/mem0_api.py, its events of
asynchronous adds, the inspector's: server/ui/api.py, and the MCP tools: server/mcp_http.py)."""


def tenant_route(path: str) -> bool:
    """True if a tenant (non-admin) key may call `path`."""
    return path in TENANT_PATHS or any(path == prefix or path.startswith(prefix + "/")
                                       for prefix in TENANT_PREFIXES)


class HttpError(Exception):
    """A request the server answers with a 4xx status and a message saying what to do."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind

    def body(self) -> dict[str, Any]:
        """The JSON error body (OpenAI's shape)."""
        return {"error": {"message": self.message, "type": self.kind, "code": self.status}}


def http_error(exc: InferScaleError, what: str = "") -> HttpError:
    """The HTTP answer to a memory error: the caller's fault (4xx) or the server's, for now (503).

    A store that cannot be reached (a database restart, a lost connection) or a closed engine is
    503: retryable, on this replica or (behind a router) another; bad input is 400, a foreign
    handle 403, an unknown fact 404, a full queue of asynchronous adds 429 (retry later).
    """
    message = f"{what}{exc}"
    if isinstance(exc, FactNotFoundError):
        return HttpError(404, message, "not_found_error")
    if isinstance(exc, HandleError):
        return HttpError(403, message, "permission_error")
    if isinstance(exc, (StoreError, EngineClosedError)):
        return HttpError(503, message, "service_unavailable")
    if isinstance(exc, AddQueueFullError):
        return HttpError(429, message, "rate_limit_error")
    return HttpError(400, message)


@dataclass(frozen=True, slots=True)
class Principal:
    """What one API key may do."""

    tenant: str
    users: tuple[str, ...]
    """Exact user ids, or prefixes ending in '*'."""
    admin: bool = False

    def allows(self, user_id: str) -> bool:
        """True if this key may reach `user_id` (normalized: checks.check_user_id)."""
        return any(user_id.startswith(p[:-1]) if p.endswith("*") else user_id == p
                   for p in self.users)

    def check_user(self, user_id: str) -> None:
        """Raise 403 unless this key may reach `user_id`."""
        if not self.allows(user_id):
            raise HttpError(403, f"this API key (tenant {self.tenant!r}) may not reach user "
                                 f"{user_id!r:.60}", "permission_error")

    def check_admin(self, what: str) -> None:
        """Raise 403 unless this is an admin key."""
        if not self.admin:
            raise HttpError(403, f"{what} needs an admin API key", "permission_error")


class ApiKeys:
    """Keys (by their sha256) -> Principal, from the keys file."""

    def __init__(self, principals: dict[str, Principal]) -> None:
        self._by_digest = {_digest(key): p for key, p in principals.items()}

    @classmethod
    def load(cls, path: str | Path) -> ApiKeys:
        """Read the keys file.

        Raises:
            ConfigError: the file is missing, not JSON or not of the documented shape.
        """
        try:
            raw = json.loads(Path(path).read_text())
            entries = raw["keys"]
            principals = {
                str(key): Principal(str(v["tenant"]),
                                    tuple(_user_pattern(u) for u in v.get("users", [])),
                                    bool(v.get("admin", False)))
                for key, v in entries.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"--api-keys {str(path)!r}: {exc!r}; expected JSON "
                              '{"keys": {"<key>": {"tenant": "...", "users": ["id", "prefix*"], '
                              '"admin": false}}}') from None
        if not principals or any(len(k) < 16 for k in principals):
            raise ConfigError(f"--api-keys {str(path)!r}: give at least one key, each of at "
                              "least 16 characters")
        return cls(principals)

    def principal(self, headers: Any) -> Principal:
        """The Principal of a request's key.

        Raises:
            HttpError: 401 if the key is missing or unknown.
        """
        key = headers.get("x-api-key") or ""
        bearer = headers.get("authorization") or ""
        scheme, _, token = bearer.partition(" ")
        if scheme.lower() in ("bearer", "token"):  # Token: mem0's client
            key = token.strip()
        found = self._by_digest.get(_digest(key)) if key else None
        if found is None:
            raise HttpError(401, "missing or unknown API key; send Authorization: Bearer <key>",
                            "authentication_error")
        return found


def check_bind(host: str | None, keys: ApiKeys | None) -> None:
    """Refuse to listen beyond loopback without API keys.

    Raises:
        ConfigError: host is not loopback and there are no keys.
    """
    if keys is None and (host or "") not in LOOPBACK:
        raise ConfigError(f"--host {host or '0.0.0.0'!r} exposes every user's memory; give "
                          "--api-keys FILE, or listen on 127.0.0.1")


def _digest(key: str) -> str:
    return hmac.new(b"inferscale-api-key", key.encode("utf-8", "surrogatepass"),
                    hashlib.sha256).hexdigest()


def _user_pattern(value: object) -> str:
    """An exact user id or 'prefix*', in NFC: requests are matched after normalization."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"users entries are user ids or 'prefix*', got {value!r}")
    if value.endswith("*"):
        return unicodedata.normalize("NFC", value[:-1]) + "*"
    return check_user_id(value)
