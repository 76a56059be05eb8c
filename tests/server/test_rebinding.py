"""A server without API keys is reachable by loopback names only (DNS rebinding).

A page on rebind.attacker.example, its name re-pointed at 127.0.0.1, is same-origin with the
server to the browser: it sends `Host` and `Origin` naming itself and `Sec-Fetch-Site:
same-origin`. Every such request is refused, reads and writes alike, while the same requests
by a loopback name (or a name --allowed-hosts lists) are answered.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from starlette.requests import Request

from inferscale_engine.server.auth import HttpError
from inferscale_engine.server.hosts import AllowedHosts
from inferscale_engine.server.ui.page import check_same_origin
from tests.conftest import FACTS
from tests.server.process import ServerProcess

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

ALLOWED = "devbox.internal"
USER = "dev:rebinding"


@pytest.fixture(scope="module")
def keyless(tiny_models, tmp_path_factory) -> Iterator[ServerProcess]:
    """A server with no keys (loopback, as a developer runs it) that also answers ALLOWED."""
    folder = tmp_path_factory.mktemp("keyless")
    server = ServerProcess(folder / "memory.db", folder / "server.log",
                           extra_args=["--allowed-hosts", ALLOWED, "--max-add-facts", "20"])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _as(host: str, port: int, write: bool) -> dict[str, str]:
    """The headers of a browser's request on a page served from `host`:PORT."""
    headers = {"Host": f"{host}:{port}"}
    if write:
        headers.update({"Origin": f"http://{host}:{port}", "Sec-Fetch-Site": "same-origin"})
    return headers


def test_a_rebinding_page_is_refused_and_loopback_names_are_served(keyless):
    port = keyless.port
    with httpx.Client(base_url=keyless.base_url, timeout=120) as http:
        added = http.post("/v1/memories", json={"user_id": USER, "texts": FACTS[:2]})
        assert added.status_code == 200, added.text
        fact_id = added.json()["results"][0]["id"]
        requests = [("POST", f"/ui/api/memories/{fact_id}", {"text": "Rewritten by a page."}),
                    ("GET", "/ui/api/users", None),
                    ("GET", f"/v1/memories?user_id={USER}", None),
                    ("DELETE", f"/v1/memories?user_id={USER}", None)]
        for method, path, body in requests:
            response = http.request(method, path, json=body,
                                    headers=_as("rebind.attacker.example", port, True))
            assert response.status_code == 403, (method, path, response.text)
            assert "--allowed-hosts" in response.json()["error"]["message"]
        for host in ("evil.localhost.example", "127.0.0.1.attacker.example"):
            assert http.get("/ui/api/users", headers=_as(host, port, False)).status_code == 403
        # nothing was changed, and the memories are read by every loopback name
        for host in ("127.0.0.1", "localhost", "[::1]"):
            listed = http.get("/v1/memories", params={"user_id": USER},
                              headers=_as(host, port, False))
            assert listed.status_code == 200, listed.text
            assert [m["memory"] for m in listed.json()["results"]] == FACTS[:2]
        # the inspector from loopback and from the listed name may write
        for host in ("127.0.0.1", ALLOWED):
            edited = http.post(f"/ui/api/memories/{fact_id}", json={"text": f"Set via {host}."},
                               headers=_as(host, port, True))
            assert edited.status_code == 200, edited.text
        deleted = http.delete("/v1/memories", params={"user_id": USER},
                              headers=_as("localhost", port, False))
        assert deleted.status_code == 200, deleted.text


def _request(headers: dict[str, str], hosts: AllowedHosts) -> Request:
    class App:
        class state:  # noqa: N801 - Starlette's app.state
            allowed_hosts = hosts

    return Request({"type": "http", "method": "POST", "path": "/ui/api/memories/1",
                    "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
                    "app": App()})


def test_the_inspectors_cross_site_check_does_not_trust_host_alone():
    loopback_only = AllowedHosts.for_server(None, has_keys=False)
    rebinding = _as("rebind.attacker.example", 8000, True)
    with pytest.raises(HttpError, match="cross-site write refused"):
        check_same_origin(_request(rebinding, loopback_only))
    check_same_origin(_request(_as("127.0.0.1", 8000, True), loopback_only))
    check_same_origin(_request(rebinding, AllowedHosts.for_server(None, has_keys=True)))
    with pytest.raises(HttpError, match="cross-site write refused"):  # another site
        check_same_origin(_request({**_as("127.0.0.1", 8000, True),
                                    "Origin": "http://localhost:8000"}, loopback_only))
