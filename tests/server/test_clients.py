"""LangChain's ChatOpenAI and LlamaIndex's OpenAILike against `inferscale serve`, and the remote
KVMemory in a ConversationChain and a SimpleChatEngine: answers served from injected KV."""

from __future__ import annotations

import contextlib

import pytest
from langchain_classic.chains import ConversationChain
from langchain_core.callbacks import BaseCallbackHandler
from langchain_openai import ChatOpenAI
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent

from inferscale_integrations import KVMemory
from inferscale_integrations.langchain import chat_openai
from inferscale_integrations.llamaindex import openai_like
from tests.conftest import FACTS
from tests.server.conftest import MAX_TOKENS, metric, wait_metric
from tests.server.process import KEYS

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

INJECTED = "inferscale_injected_requests_total"


class Headers(BaseCallbackHandler):
    """The response headers of every ChatOpenAI call (include_response_headers=True)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    def on_llm_end(self, response, **kwargs) -> None:
        self.seen.append(response.generations[0][0].message.response_metadata["headers"])


def _injected(headers) -> int:
    assert headers["x-inferscale-plan-status"] == "inject"
    return int(headers["x-inferscale-injected-tokens"])


def test_chat_openai_with_extra_body(server, model, client_a, user_a):
    client_a.add(user_id=user_a, texts=FACTS)
    before = metric(server, INJECTED)
    llm = ChatOpenAI(model=model, base_url=server.base_url + "/v1", api_key=KEYS["a"],
                     max_retries=0, max_tokens=MAX_TOKENS, include_response_headers=True,
                     extra_body={"memory": {"user_id": user_a, "k": 2}})
    message = llm.invoke("Who lives in Paris?")
    assert _injected(message.response_metadata["headers"]) > 0
    assert message.response_metadata["headers"]["x-inferscale-user"] == user_a
    helper = chat_openai(base_url=server.base_url, user_id=user_a, api_key=KEYS["a"], k=1,
                         max_tokens=MAX_TOKENS, max_retries=0)
    assert helper.model_name.startswith("tiny-qwen2-")  # the served name: the model's folder
    message = helper.invoke("Who plays jazz violin?")
    assert _injected(message.response_metadata["headers"]) > 0
    assert message.response_metadata["headers"]["x-inferscale-facts"] == "1"
    assert wait_metric(server, INJECTED, before + 2) >= before + 2


def test_openai_like(server, client_a, user_a):
    facts = [int(r.fact_id) for r in client_a.add(user_id=user_a, texts=FACTS)]
    before = metric(server, INJECTED)
    llm = openai_like(base_url=server.base_url, user_id=user_a, api_key=KEYS["a"], k=2,
                      max_tokens=MAX_TOKENS, max_retries=0)
    response = llm.complete("Where is Bob's trip?")
    memory = response.raw.model_extra["memory"]
    assert memory["plan_status"] == "inject" and memory["injected_tokens"] > 0
    assert memory["user_id"] == user_a and set(memory["fact_ids"]) <= set(facts)
    assert wait_metric(server, INJECTED, before + 1) >= before + 1


def test_remote_kv_memory_in_a_conversation_chain(server, client_a, user_a):
    client_a.add(user_id=user_a, texts=FACTS)
    memory = KVMemory(base_url=server.base_url, api_key=KEYS["a"], user_id=user_a,
                      session_id="chat-1")
    llm = chat_openai(base_url=server.base_url, user_id=user_a, api_key=KEYS["a"],
                      session_id="chat-1", k=1, recent_facts=2, max_tokens=MAX_TOKENS,
                      max_retries=0)
    chain = ConversationChain(llm=llm, memory=memory)
    headers = Headers()
    before = metric(server, INJECTED)
    for question in ("My turtle is called Shelly.", "What is my turtle called?"):
        chain.invoke({"input": question}, config={"callbacks": [headers]})
    assert [_injected(h) > 0 for h in headers.seen] == [True, True]
    # The second request also got the session's last facts: the first exchange.
    assert int(headers.seen[0]["x-inferscale-facts"]) == 1
    assert int(headers.seen[1]["x-inferscale-facts"]) >= 2
    assert [t["content"] for t in memory.turns][0::2] == ["My turtle is called Shelly.",
                                                          "What is my turtle called?"]
    assert memory.load_memory_variables({"input": "x"}) == {"history": ""}  # no handle
    stored = {f.fact_id: f.text for f in client_a.get_all(user_id=user_a)}
    assert stored[memory.turns[0]["fact_ids"][0]] == "My turtle is called Shelly."
    assert wait_metric(server, INJECTED, before + 2) >= before + 2


def test_remote_kv_memory_in_a_simple_chat_engine(server, client_a, user_a):
    client_a.add(user_id=user_a, texts=FACTS)
    memory = KVMemory(base_url=server.base_url, api_key=KEYS["a"], user_id=user_a,
                      session_id="chat-2")
    llm = openai_like(base_url=server.base_url, user_id=user_a, api_key=KEYS["a"],
                      session_id="chat-2", k=1, recent_facts=2, max_tokens=MAX_TOKENS,
                      max_retries=0)
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
    before = metric(server, INJECTED)
    with served_memory() as served:
        for question in ("My cat is called Tom.", "What is my cat called?"):
            engine.chat(question)
    assert [m.content for m in memory.get_all()][0::2] == ["My cat is called Tom.",
                                                           "What is my cat called?"]
    assert memory.get() == []  # nothing pending, and no handle: the server retrieves
    assert [m["plan_status"] for m in served] == ["inject", "inject"]
    assert all(m["injected_tokens"] > 0 and m["user_id"] == user_a for m in served)
    # The second request also got the session's last facts: the first exchange.
    first_exchange = [f for t in memory.turns[:2] for f in t["fact_ids"]]
    assert first_exchange and set(first_exchange) <= set(served[1]["fact_ids"])
    assert wait_metric(server, INJECTED, before + 2) >= before + 2


class _ChatEnds(BaseEventHandler):
    """The server's `memory` field of every LlamaIndex chat response."""

    seen: list = []

    def handle(self, event, **kwargs) -> None:
        if isinstance(event, LLMChatEndEvent) and event.response is not None:
            self.seen.append(event.response.raw.model_extra["memory"])


@contextlib.contextmanager
def served_memory():
    handler = _ChatEnds(seen=[])
    dispatcher = get_dispatcher()
    dispatcher.add_event_handler(handler)
    try:
        yield handler.seen
    finally:
        dispatcher.event_handlers.remove(handler)
