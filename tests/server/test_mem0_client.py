"""mem0's own Python client (`mem0ai` from PyPI, in a virtual environment of its own: it pins
protobuf below what vLLM uses) against `inferscale serve`: add, search, get_all, get, update,
history, delete and delete_all, scoped by user, agent and run, with metadata filters; one
tenant's key never reaches another tenant's memories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.server.process import KEYS

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

MEM0 = "mem0ai==2.2.1"


def test_mem0s_client_works_against_the_server(server, tmp_path, user_a):
    # the venv the serve_and_clients notebook builds, reused when it already has mem0ai
    venv = Path(tempfile.gettempdir()) / "inferscale-mem0-venv"
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", MEM0_TELEMETRY="false")
    ready = Path(python).exists() and subprocess.run(
        [python, "-c", "import mem0"], capture_output=True, env=env).returncode == 0
    if not ready:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        install = subprocess.run([python, "-m", "pip", "install", "-q", MEM0],
                                 capture_output=True, text=True, env=env, timeout=1000)
        assert install.returncode == 0, install.stderr[-3000:]
    code = textwrap.dedent(f"""
        import json
        from mem0 import MemoryClient
        a = MemoryClient(api_key={KEYS["a"]!r}, host={server.base_url!r})
        b = MemoryClient(api_key={KEYS["b"]!r}, host={server.base_url!r})
        out = {{}}
        added = a.add([{{"role": "user", "content": "I live in Boston."}},
                       {{"role": "user", "content": "My dog is called Pepper."}}],
                      user_id={user_a!r}, agent_id="planner", run_id="r1",
                      metadata={{"topic": "home"}})
        a.add("I am allergic to peanuts.", user_id={user_a!r}, agent_id="doctor")
        out["added"] = added["results"]
        home = next(r["id"] for r in added["results"] if "Boston" in r["memory"])
        out["search"] = a.search("Where do I live?", filters={{"user_id": {user_a!r}}},
                                 top_k=2)["results"]
        out["search_doctor"] = a.search("What am I allergic to?", filters={{
            "AND": [{{"user_id": {user_a!r}}}, {{"agent_id": "doctor"}}]}})["results"]
        out["all"] = a.get_all(filters={{"user_id": {user_a!r}}})
        out["by_topic"] = a.get_all(filters={{"user_id": {user_a!r}, "topic": "home"}})
        out["get"] = a.get(home)
        out["update"] = a.update(home, text="I moved to Lisbon.")
        out["history"] = a.history(home)
        try:
            b.get(home)
            out["b_get"] = "reached"
        except Exception as exc:
            out["b_get"] = type(exc).__name__ + ": " + str(exc)[:200]
        try:
            b.search("Where do I live?", filters={{"user_id": {user_a!r}}})
            out["b_search"] = "reached"
        except Exception as exc:
            out["b_search"] = type(exc).__name__
        out["delete"] = a.delete(home)
        out["history_after_delete"] = a.history(home)
        out["delete_all"] = a.delete_all(user_id={user_a!r}, agent_id="planner")
        out["left"] = a.get_all(filters={{"user_id": {user_a!r}}})["results"]
        print(json.dumps(out))
    """)
    run = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert [r["event"] for r in out["added"]] == ["ADD", "ADD"]
    assert all(isinstance(r["id"], str) for r in out["added"])
    assert "Boston" in out["search"][0]["memory"] and "score" in out["search"][0]
    assert [r["memory"] for r in out["search_doctor"]] == ["I am allergic to peanuts."]
    assert out["all"]["count"] == 3 and len(out["by_topic"]["results"]) == 2
    assert out["get"]["memory"] == "I live in Boston." and out["get"]["agent_id"] == "planner"
    assert out["get"]["run_id"] == "r1" and out["get"]["metadata"] == {"topic": "home"}
    assert out["update"]["memory"] == "I moved to Lisbon."
    assert [(e["event"], e["old_memory"], e["new_memory"]) for e in out["history"]] == [
        ("ADD", None, "I live in Boston."), ("UPDATE", "I live in Boston.", "I moved to Lisbon.")]
    assert out["b_get"] != "reached"  # 404: another tenant's memory id is not visible
    assert out["b_search"] != "reached"
    assert [e["event"] for e in out["history_after_delete"]] == ["ADD", "UPDATE", "DELETE"]
    assert out["delete_all"]["deleted"] == 1  # the planner's other memory; the doctor's stays
    assert [r["memory"] for r in out["left"]] == ["I am allergic to peanuts."]
