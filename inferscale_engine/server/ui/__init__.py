"""The memory inspector: a page at /ui (page.py) over JSON routes at /ui/api (api.py).

panel.py: the server panel, a JSON view of the server's own Prometheus metrics.

The page and its script and style are static and hold no data, so they load without a key;
every /ui/api route needs the same API key as the rest of the server and goes through the same
identity checks (a tenant key reaches its own users only). See docs/inspector.md.
"""

from inferscale_engine.server.ui.page import public, secured

__all__ = ["public", "secured"]
