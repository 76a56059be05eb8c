"""Headless Chromium for the inspector's tests: Debian's `chromium`, driven by Playwright.

Playwright's own browser download is never used (`playwright install` is not run): the tests
launch the system's Chromium (INFERSCALE_CHROMIUM, default /usr/bin/chromium; .ci/setup installs
it). Without it, or without the playwright package, the tests are skipped with the reason,
unless INFERSCALE_REQUIRE_SERVICES is set (CI): then they fail.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("INFERSCALE_CHROMIUM", "/usr/bin/chromium")
VIEWPORT = {"width": 1280, "height": 800}
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "img"
"""Where the tests write the inspector's screenshots (docs/inspector.md shows them)."""


def require_browser() -> None:
    """Skip the calling module (fail it with INFERSCALE_REQUIRE_SERVICES) without a browser.

    Call at module level, so that no server is started for nothing.
    """
    missing = None
    if importlib.util.find_spec("playwright") is None:
        missing = "the playwright package is missing (pip install -e '.[dev]')"
    elif not os.access(CHROMIUM, os.X_OK):
        missing = f"no Chromium at {CHROMIUM} (apt-get install chromium, or set " \
                  "INFERSCALE_CHROMIUM)"
    if missing is None:
        return
    if os.environ.get("INFERSCALE_REQUIRE_SERVICES"):
        pytest.fail(f"INFERSCALE_REQUIRE_SERVICES is set but {missing}", pytrace=False)
    pytest.skip(missing, allow_module_level=True)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium browser for the duration of the block."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=["--no-sandbox", "--disable-gpu"])
        try:
            yield browser
        finally:
            browser.close()


class Page:
    """A page of the inspector in a fresh browser context (its own sessionStorage)."""

    def __init__(self, browser: Any, base_url: str) -> None:
        self.base_url = base_url
        self.context = browser.new_context(viewport=VIEWPORT, base_url=base_url,
                                           device_scale_factor=1)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on("dialog", lambda dialog: (self.errors.append(
            f"unexpected {dialog.type}: {dialog.message}"), dialog.dismiss()))

    def open(self, key: str, route: str = "#/users") -> Any:
        """Sign in with `key`, then go to `route`; the Playwright page."""
        page = self.page
        page.goto("/ui")
        page.fill("#signin-key", key)
        page.click("#signin-submit")
        page.wait_for_selector("#tenant")
        self.go(route)
        return page

    def go(self, route: str) -> None:
        """Go to a route of the page (a fragment: #/user/<id>/<tab>, #/server)."""
        self.page.evaluate("route => { location.hash = route; }", route)

    def fetch(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """fetch() from the page with its key, as its own code would: {status, body}."""
        return self.page.evaluate("""async ([method, path, body]) => {
            const headers = {Authorization: "Bearer " + sessionStorage.getItem("inferscale.key")};
            if (body !== null) headers["Content-Type"] = "application/json";
            const r = await fetch(path, {method, headers,
                                         body: body === null ? undefined : JSON.stringify(body)});
            let json = null;
            try { json = await r.json(); } catch (e) {}
            return {status: r.status, body: json};
        }""", [method, path, body])

    def shot(self, name: str) -> Path:
        """A screenshot of the viewport into docs/img/inspector-<name>.png."""
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"inspector-{name}.png"
        self.page.screenshot(path=str(path))
        return path

    def close(self) -> None:
        self.context.close()
