"""Acceptance of `inferscale serve` with the real Qwen2.5-Coder-0.5B: the openai SDK, LangChain's
ChatOpenAI and LlamaIndex's OpenAILike (the server examples) answer Caroline's questions from
her facts injected as KV, and a user without those facts does not get them.

Skipped, with the reason, when the smallmodel extra is not installed.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from inferscale_engine.model.small_model import small_model_available

pytestmark = [pytest.mark.vllm, pytest.mark.acceptance, pytest.mark.timeout(1200),
              pytest.mark.skipif(not small_model_available(),
                                 reason="needs the smallmodel extra (the 0.5B GGUF from PyPI)")]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.server.process import running_server

    folder = tmp_path_factory.mktemp("server-small")
    with running_server(folder / "memory.db", folder / "server.log", model="small") as process:
        yield process


def example(name: str):
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def test_openai_sdk_answers_from_injected_kv(server):
    # The streamed question is "Where do I live?": asked as "Where does Caroline live?" it
    # retrieves "Caroline's sister Melanie lives in Boston." first, and the 0.5B answers Boston
    # with the facts pasted as text too (every layout; 2026-12-02), a model limit.
    result = example("server_openai").main(server.base_url, None, "caroline")
    dog, city = result["answers"]
    print(f"\n[acceptance] server_openai answers {result['answers']} injected "
          f"{result['injected_tokens']} memory {result['memory']}")
    assert "pepper" in dog.lower(), result
    assert "lisbon" in city.lower(), result
    assert all(n > 0 for n in result["injected_tokens"]), result
    assert result["memory"]["plan_status"] == "inject"


@pytest.mark.parametrize("script", ["server_langchain", "server_llamaindex"])
def test_framework_clients_answer_from_injected_kv(server, script):
    result = example(script).main(server.base_url, None, "caroline")
    assert any("pepper" in a.lower() for a in result["answers"]), result
    assert result["injected_tokens"] and all(n > 0 for n in result["injected_tokens"]), result


def test_another_user_does_not_get_carolines_facts(server):
    from openai import OpenAI

    example("server_openai").main(server.base_url, None, "caroline")  # her facts are there
    client = OpenAI(base_url=f"{server.base_url}/v1", api_key="no-key")
    model = client.models.list().data[0].id
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "What is the name of my dog?"}],
        user="dave", max_tokens=32, temperature=0)
    completion = raw.parse()
    answer = completion.choices[0].message.content
    assert completion.model_extra["memory"]["fact_ids"] == []  # only the preamble's KV
    assert "pepper" not in answer.lower(), answer
