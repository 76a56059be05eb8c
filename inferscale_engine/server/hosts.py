"""The Host names a server answers: without API keys, loopback names only (DNS rebinding).

A page on rebind.attacker.example whose name the attacker later points at 127.0.0.1 is, to the
browser, same-origin with the server: it may read every answer and send any request, with
`Origin` and `Host` both naming the attacker's host and `Sec-Fetch-Site: same-origin`. Only the
name tells such a request apart. Without keys every request must therefore name the server by a
loopback name (localhost, 127.0.0.0/8, [::1]) or one that `--allowed-hosts` lists, as Jupyter
and other local servers do; with keys any name is answered (the key is what protects), unless
`--allowed-hosts` is given. The inspector's cross-site check (ui/page.py) also requires the
`Origin` of a write to name an allowed host, not merely the same one as `Host`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from inferscale_engine.errors import ConfigError
from inferscale_engine.server.auth import HttpError

ANY = "*"
"""--allowed-hosts '*': every name is answered (behind a proxy that checks names itself)."""


class AllowedHosts:
    """The Host names (ports aside) a server answers."""

    def __init__(self, names: Iterable[str] = (), any_name: bool = False) -> None:
        self.names = frozenset(names)
        self.any_name = any_name

    @classmethod
    def for_server(cls, listed: str | None, has_keys: bool) -> AllowedHosts:
        """--allowed-hosts (comma-separated names, or '*') for a server with or without keys.

        Not given: every name with keys, loopback names only without.

        Raises:
            ConfigError: an entry that is not a host name (a scheme, a path, a port).
        """
        if listed is None:
            return cls(any_name=has_keys)
        names = [n.strip().lower() for n in listed.split(",") if n.strip()]
        if ANY in names:
            return cls(any_name=True)
        for name in names:
            if hostname(name) != name.strip("[]"):
                raise ConfigError(f"--allowed-hosts entry {name!r} is not a host name; give "
                                  "names without scheme, port or path, e.g. devbox.internal")
        return cls(name.strip("[]") for name in names)

    def allows(self, host: str | None) -> bool:
        """True if a request whose Host (or Origin's host) is `host` may be answered.

        A request without a Host header is not a browser's (browsers always send one).
        """
        if self.any_name or host is None:
            return True
        name = hostname(host)
        return name is not None and (name in self.names or is_loopback(name))

    def check(self, host: str | None) -> None:
        """Refuse (403) a request naming this server by a host it does not answer."""
        if not self.allows(host):
            raise HttpError(403, f"Host {host!r:.80} is not a name this server answers: "
                                 "without --api-keys only loopback names (localhost, "
                                 "127.0.0.1, [::1]) reach it, so that no web page can through "
                                 "DNS rebinding; open it by one of those, or add the name with "
                                 "--allowed-hosts (and give --api-keys if it is not your own)",
                            "permission_error")


def hostname(host: str) -> str | None:
    """The name of a Host header value or URL netloc ('name:port', '[v6]:port'), lowercased.

    None for a value that is not one (userinfo, a path, a bad port).
    """
    try:
        parts = urlsplit("//" + host)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        return None
    if parts.username is not None or parts.path or parts.query or parts.fragment:
        return None
    return parts.hostname or None


def is_loopback(name: str) -> bool:
    """localhost, or an address on the loopback interface (127.0.0.0/8, ::1)."""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
