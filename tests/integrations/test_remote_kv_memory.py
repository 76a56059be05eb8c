"""KVMemory in remote mode, without a server: the API key never leaves the process in any dump,
reads return no handle, and a question is written to the server with its answer.

(tests/server/ runs the remote KVMemory against a real `inferscale serve`.)
"""

from __future__ import annotations

import pickle

import pytest
from langchain_core.load import dumpd, dumps, load
from llama_index.core.base.llms.types import ChatMessage

from inferscale_integrations import KVMemory
from inferscale_integrations.client import API_KEY_ENV, api_url

SECRET = "sk-secret-never-serialized-31337"
URL = "http://127.0.0.1:9"


class FakeServer:
    """Stands in for MemoryClient: records add_messages calls, gives each fact an id."""

    base_url = api_url(URL)

    def __init__(self) -> None:
        self.calls: list[list[dict[str, str]]] = []
        self.next_id = 1

    def add_messages(self, *, user_id, session_id, messages):
        self.calls.append([dict(m) for m in messages])
        out = []
        for message in messages:
            visible = message["role"] in ("user", "assistant") and message["content"].strip()
            out.append([self.next_id] if visible else [])
            self.next_id += bool(visible)
        return out


@pytest.fixture()
def remote(monkeypatch) -> tuple[KVMemory, FakeServer]:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    kv = KVMemory(base_url=URL, api_key=SECRET, user_id="u1", session_id="s1", k=3)
    server = FakeServer()
    kv._client = server
    return kv, server


def test_the_api_key_is_never_serialized(remote, monkeypatch):
    kv, _ = remote
    kv.save_context({"input": "I live in Oslo."}, {"output": "Nice city."})
    fresh = KVMemory(base_url=URL, api_key=SECRET, user_id="u1")
    assert fresh.client._http.headers["authorization"] == f"Bearer {SECRET}"
    dumped = {
        "model_dump": str(kv.model_dump()), "model_dump_json": kv.model_dump_json(),
        "dumpd": str(dumpd(kv)), "dumps": dumps(kv), "json": kv.json(),
        "to_json": str(kv.to_json()), "to_dict": str(kv.to_dict()),
        "pickle": pickle.dumps(kv).decode("latin-1"),
        "pickle_fresh": pickle.dumps(fresh).decode("latin-1"), "repr": repr(kv), "str": str(kv)}
    leaked = [name for name, text in dumped.items() if SECRET in text]
    assert leaked == []
    assert all(URL in dumped[n] for n in ("model_dump_json", "dumps", "json"))

    # Restored copies keep the conversation and read the key from the environment.
    monkeypatch.setenv(API_KEY_ENV, "sk-from-the-environment-0000")
    for restored in (pickle.loads(pickle.dumps(fresh)), KVMemory.from_json(fresh.json()),
                     load(dumpd(fresh), valid_namespaces=["inferscale_integrations"],
                          allowed_objects=[KVMemory])):
        assert restored.base_url == URL and restored.model_dump() == fresh.model_dump()
        assert restored.client._http.headers["authorization"] == \
            "Bearer sk-from-the-environment-0000"
    restored = pickle.loads(pickle.dumps(kv))
    assert restored.turns == kv.turns and restored.num_sent_turns == 2


def test_reads_return_no_handle(remote):
    kv, _ = remote
    kv.save_context({"input": "My dog is Rex."}, {"output": "Good dog."})
    assert kv.load_memory_variables({"input": "dog?"}) == {"history": ""}
    as_messages = KVMemory(base_url=URL, user_id="u1", return_messages=True)
    assert as_messages.load_memory_variables({"input": "dog?"}) == {"history": []}
    assert kv.buffer_as_str == "Human: My dog is Rex.\nAI: Good dog."
    with pytest.raises(ValueError, match="server retrieves"):
        kv.handle_for("dog?")
    with pytest.raises(ValueError, match="no local Memory"):
        _ = kv.memory


def test_a_question_is_written_with_its_answer(remote):
    kv, server = remote
    kv.put(ChatMessage(role="system", content="Be brief."))
    kv.put(ChatMessage(role="user", content="My cat is Tom."))
    assert server.calls == []  # not answered yet: nothing sent
    assert [m.content for m in kv.get()] == ["Be brief.", "My cat is Tom."]  # pending, no handle
    kv.put(ChatMessage(role="assistant", content="Nice cat."))
    assert server.calls == [[{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "My cat is Tom."},
                             {"role": "assistant", "content": "Nice cat."}]]
    assert [t["fact_ids"] for t in kv.turns] == [[], [1], [2]] and kv.get() == []
    kv.put(ChatMessage(role="user", content="And my dog?"))
    kv.put(ChatMessage(role="assistant", content="Unknown."))
    assert len(server.calls) == 2 and [t["fact_ids"] for t in kv.turns][3:] == [[3], [4]]
    kv.reset()
    assert kv.turns == [] and kv.num_sent_turns == 0
    kv.set([ChatMessage(role="user", content="Start over."),
            ChatMessage(role="assistant", content="Sure.")])
    assert server.calls[-1] == [{"role": "user", "content": "Start over."},
                                {"role": "assistant", "content": "Sure."}]


def test_invalid_remote_settings_are_rejected():
    with pytest.raises(ValueError, match="http"):
        KVMemory(base_url="127.0.0.1:8000", user_id="u")
    with pytest.raises(ValueError, match="base_url"):
        KVMemory(api_key=SECRET, user_id="u")
    assert api_url("http://h:1/") == api_url("http://h:1/v1") == "http://h:1/v1"
