"""inferscale_integrations' public surface is pinned, imports no framework until a name is
used, and each framework works without the other; a missing one names the extra to install."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import inferscale_integrations


def test_exports():
    assert inferscale_integrations.__all__ == [
        "ChatInferScale", "InferScaleLLM", "KVMemory", "KVMemoryBlock", "KVMemoryMiddleware",
        "KVMemoryStore", "MemoryClient", "kv_context", "register_memory"]
    for name in inferscale_integrations.__all__:
        assert getattr(inferscale_integrations, name) is not None
    from inferscale_integrations import langchain, llamaindex

    assert langchain.__all__ == ["ChatInferScale", "KVMemoryMiddleware", "KVMemoryStore",
                                 "KVSearchItem", "LangChainKVMemory", "chat_openai",
                                 "kv_context"]
    assert llamaindex.__all__ == ["InferScaleLLM", "KVMemoryBlock", "KVStaticBlock",
                                  "LlamaIndexKVMemory", "openai_like"]


def test_importing_the_package_imports_no_framework():
    code = ("import sys, inferscale_integrations; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('langchain', 'langchain_core', 'langchain_classic', 'llama_index')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# In a fresh interpreter with some frameworks made unimportable: each statement's error (or
# None when it works).
_PROBE = """
import json, sys
for name in {blocked!r}:
    sys.modules[name] = None
results = {{}}
for statement in {statements!r}:
    try:
        exec(statement, {{}})
        results[statement] = None
    except ImportError as exc:
        results[statement] = str(exc)
print(json.dumps(results))
"""

WITHOUT_LLAMAINDEX = {
    "from inferscale_integrations.langchain import ChatInferScale, LangChainKVMemory\n"
    "assert LangChainKVMemory(user_id='u').memory_variables == ['history']": None,
    "import inferscale_integrations.llamaindex": "pip install 'inferscale-kv[llamaindex]'",
    "from inferscale_integrations import KVMemory":
        "pip install 'inferscale-kv[langchain,llamaindex]'",
}
WITHOUT_LANGCHAIN = {
    "from inferscale_integrations.llamaindex import InferScaleLLM, LlamaIndexKVMemory\n"
    "m = LlamaIndexKVMemory(user_id='u')\n"
    "assert LlamaIndexKVMemory.from_json(m.to_json()).user_id == 'u'": None,
    "import inferscale_integrations.langchain": "pip install 'inferscale-kv[langchain]'",
    "from inferscale_integrations import ChatInferScale": "pip install 'inferscale-kv[langchain]'",
}


# The server helpers need their client packages only when called; a remote KVMemory needs none.
WITHOUT_SERVE_CLIENTS = {
    "from inferscale_integrations.langchain import chat_openai\n"
    "chat_openai(base_url='http://127.0.0.1:9', user_id='u', model='m')":
        "pip install 'inferscale-kv[client]'",
    "from inferscale_integrations.llamaindex import openai_like\n"
    "openai_like(base_url='http://127.0.0.1:9', user_id='u', model='m')":
        "pip install 'inferscale-kv[client]'",
    "from inferscale_integrations import KVMemory\n"
    "KVMemory(base_url='http://127.0.0.1:9', user_id='u').load_memory_variables({})": None,
}


@pytest.mark.parametrize(("blocked", "expected"), [
    (("llama_index",), WITHOUT_LLAMAINDEX),
    (("langchain", "langchain_core", "langchain_classic"), WITHOUT_LANGCHAIN),
    (("langchain_openai", "llama_index.llms.openai_like"), WITHOUT_SERVE_CLIENTS),
], ids=["without-llamaindex", "without-langchain", "without-serve-clients"])
def test_each_framework_works_alone_and_a_missing_one_names_its_extra(blocked, expected):
    code = _PROBE.format(blocked=list(blocked), statements=list(expected))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    for statement, hint in expected.items():
        if hint is None:
            assert results[statement] is None, results[statement]
        else:
            assert results[statement] and hint in results[statement], results[statement]
