"""The `client` extra: a bare virtual environment with `pip install ".[client]"` runs the remote
KVMemory and the openai SDK examples against `inferscale serve`, and never imports torch, vLLM or
transformers (they are not even installed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.server.conftest import MAX_TOKENS
from tests.server.process import KEYS

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "vllm", "transformers")


def test_the_client_extra_serves_remote_memory_without_the_engine(server, tmp_path, user_a):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    install = subprocess.run([python, "-m", "pip", "install", "-q", f"{ROOT}[client]"],
                             capture_output=True, text=True, env=env, timeout=1000)
    assert install.returncode == 0, install.stderr[-3000:]
    code = textwrap.dedent(f"""
        import importlib.util, json, sys
        sys.path.insert(0, {str(ROOT / "examples")!r})
        installed = {{name: importlib.util.find_spec(name) is not None for name in {HEAVY!r}}}
        import inferscale_engine, server_langchain, server_openai
        results = [module.main({server.base_url!r}, {KEYS["a"]!r}, {user_a!r},
                               max_tokens={MAX_TOKENS})
                   for module in (server_langchain, server_openai)]
        print(json.dumps({{
            "installed": installed, "package": inferscale_engine.__file__,
            "injected": [r["injected_tokens"] for r in results],
            "heavy": sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})}}))
    """)
    run = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert str(venv) in report["package"]  # the installed wheel, not the source tree
    assert report["installed"] == dict.fromkeys(HEAVY, False)
    assert report["heavy"] == []
    assert all(n > 0 for answers in report["injected"] for n in answers), report
