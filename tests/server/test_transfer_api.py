"""Export and import over REST and the command line (issue 57), tenant-checked.

The server's own app (server/main.py install: routes, API keys, tenants) on a Memory over
FakeRunner, served by uvicorn on a loopback port: the routes, MemoryClient and `inferscale
export | import --base-url` run for real; no vLLM starts (the model does not matter here).
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from inferscale_engine.cli import main as cli
from tests.conftest import engine_config
from tests.engine.memory.memory_support import HashEmbedder
from tests.fake_runner import FakeRunner
from tests.server.process import KEYS, free_port, keys_file


@pytest.fixture(scope="module")
def served(tiny_models, tmp_path_factory):
    """(base URL, the Memory, its database) of an in-process server with the test keys."""
    import uvicorn
    from fastapi import FastAPI

    from inferscale_engine.memory import Memory
    from inferscale_engine.runtime.engine import Engine
    from inferscale_engine.server.auth import ApiKeys
    from inferscale_engine.server.main import install

    folder = tmp_path_factory.mktemp("transfer-server")
    db = str(folder / "memory.db")
    with Engine(engine_config(tiny_models["qwen2"]), runner=FakeRunner) as engine, \
            Memory(engine, db, HashEmbedder(), progress_bar=False) as memory:
        app = FastAPI()
        metrics = install(app, memory, ApiKeys.load(keys_file(folder / "keys.json")),
                          default_k=5)
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                               log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
            time.sleep(0.05)
        try:
            yield f"http://127.0.0.1:{port}", memory, db
        finally:
            server.should_exit = True
            thread.join(timeout=30)
            metrics.stop()


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


def test_export_and_import_routes_check_the_tenant(served):
    url, memory, _ = served
    memory.add(user_id="a:ann", texts=["Ann sails on Sundays.", "Ann's boat is blue."],
               metadata={"topic": "boat"})
    with httpx.Client(base_url=url, timeout=60) as http:
        exported = http.get("/v1/memories/export", params={"user_id": "a:ann"},
                            headers=auth("a"))
        assert exported.status_code == 200
        assert exported.headers["content-type"].startswith("application/x-ndjson")
        header, *facts = [json.loads(line) for line in exported.text.splitlines()]
        assert header["user_id"] == "a:ann" and [f["metadata"] for f in facts] == [
            {"topic": "boat"}] * 2
        for refused in (
                http.get("/v1/memories/export", params={"user_id": "a:ann"},
                         headers=auth("b")),
                http.get("/v1/memories/export", headers={**auth("b"), "X-User-Id": "a:ann"}),
                http.post("/v1/memories/import", params={"user_id": "a:bob"},
                          content=exported.text, headers=auth("b"))):
            assert refused.status_code == 403, refused.text
        assert http.get("/v1/memories/export", params={"user_id": "a:ann"}).status_code == 401

        imported = http.post("/v1/memories/import", params={"user_id": "a:bob"},
                             content=exported.text, headers=auth("a"))
        assert imported.status_code == 200, imported.text
        assert (imported.json()["imported"], imported.json()["skipped"]) == (2, 0)
        again = http.post("/v1/memories/import", params={"user_id": "a:bob"},
                          content=exported.text, headers=auth("a")).json()
        assert (again["imported"], again["skipped"]) == (0, 2)
        bad = http.post("/v1/memories/import", params={"user_id": "a:cy"},
                        content=exported.text + "{not json\n", headers=auth("a"))
        assert bad.status_code == 400 and "line 4" in bad.text
        assert http.get("/v1/memories/42", headers=auth("a")).status_code == 404  # still routed
    assert sorted(f.text for f in memory.get_all(user_id="a:bob")) == [
        "Ann sails on Sundays.", "Ann's boat is blue."]
    assert memory.get_all(user_id="a:cy") == []


def test_the_cli_exports_and_imports_through_a_server_and_a_store(served, tmp_path, capsys):
    url, memory, db = served
    memory.add(user_id="a:dee", texts=["Dee grows tomatoes."])
    remote, local = tmp_path / "remote.jsonl", tmp_path / "local.jsonl"
    assert cli(["export", "--user", "a:dee", "--base-url", url, "--api-key", KEYS["a"],
                "-o", str(remote)]) == 0
    assert cli(["export", "--user", "a:dee", "--db", db, "-o", str(local)]) == 0
    assert remote.stat().st_mode & 0o777 == 0o600
    strip = [{k: v for k, v in json.loads(line).items() if k != "exported_at"}
             for line in remote.read_text().splitlines()]
    assert strip == [{k: v for k, v in json.loads(line).items() if k != "exported_at"}
                     for line in local.read_text().splitlines()]
    capsys.readouterr()
    assert cli(["import", str(remote), "--user", "a:eve", "--base-url", url,
                "--api-key", KEYS["a"]]) == 0
    assert "imported 1 facts" in capsys.readouterr().out
    assert [f.text for f in memory.get_all(user_id="a:eve")] == ["Dee grows tomatoes."]
    assert cli(["import", str(remote), "--user", "b:eve", "--base-url", url,
                "--api-key", KEYS["a"]]) == 1
    assert "403" in capsys.readouterr().err
