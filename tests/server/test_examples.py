"""The server examples run against `inferscale serve` and answer from injected KV."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from inferscale_engine.cli import DEMO_FACTS
from tests.server.conftest import MAX_TOKENS
from tests.server.process import KEYS

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(("script", "num_whole_answers"), [
    ("server_openai", 2), ("server_langchain", 2), ("server_llamaindex", 1)])
def test_server_example(server, monkeypatch, client_a, user_a, script, num_whole_answers):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    sys.modules.pop(script, None)
    result = importlib.import_module(script).main(server.base_url, KEYS["a"], user_a,
                                                  max_tokens=MAX_TOKENS)
    assert len(result["answers"]) == 2
    assert len(result["injected_tokens"]) == num_whole_answers
    assert all(n > 0 for n in result["injected_tokens"])
    assert [f.text for f in client_a.get_all(user_id=user_a)][:len(DEMO_FACTS)] == DEMO_FACTS
