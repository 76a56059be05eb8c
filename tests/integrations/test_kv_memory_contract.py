"""KVMemory's contract: ConversationBufferMemory's fields, errors and views (LangChain), the
BaseMemory verbs (LlamaIndex), and the read path (one handle: top-k facts + recent turns)."""

from __future__ import annotations

import pytest
from langchain_classic.memory import ConversationBufferMemory
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from llama_index.core.base.llms.types import ChatMessage

from inferscale_engine.facts import MemoryHandle
from inferscale_integrations import KVMemory
from inferscale_integrations.handles import HANDLES_KEY, MARKER_RE, RECENT_HANDLES
from inferscale_integrations.registry import MemoryNotRegisteredError
from tests.conftest import FACTS

pytestmark = pytest.mark.vllm

BUFFER_FIELDS = [
    {},
    {"memory_key": "chat_history", "return_messages": True},
    {"input_key": "question", "output_key": "answer"},
    {"human_prefix": "User", "ai_prefix": "Bot"},
]
SAVES = [
    ({"input": "hi, I am Ann"}, {"output": "hello Ann"}),
    ({"question": "q", "input": "x"}, {"answer": "a"}),  # two inputs: needs input_key
    ({"input": "one", "stop": ["\n"]}, {"response": "two"}),  # 'stop' is not an input
    ({"input": "z"}, {"answer": "a", "other": "b"}),  # two outputs, no 'output': error
    ({"input": "y"}, {"output": "o", "extra": "e"}),  # two outputs incl. 'output': warns
]


def _outcome(memory, inputs, outputs):
    try:
        memory.save_context(inputs, outputs)
    except Exception as exc:  # noqa: BLE001 - the very same errors are the contract
        return (type(exc).__name__, str(exc))
    return ("ok", None)


@pytest.mark.parametrize("fields", BUFFER_FIELDS, ids=lambda f: ",".join(f) or "defaults")
def test_same_fields_errors_and_views_as_conversation_buffer_memory(memory, user_id, fields):
    buffer = ConversationBufferMemory(**fields)
    kv = KVMemory(user_id=user_id, **fields)
    assert kv.memory_variables == buffer.memory_variables
    for inputs, outputs in SAVES:
        assert _outcome(kv, inputs, outputs) == _outcome(buffer, inputs, outputs)
    assert kv.buffer_as_str == buffer.buffer_as_str
    assert kv.buffer_as_messages == buffer.buffer_as_messages
    assert kv.buffer == buffer.buffer
    assert len(memory.turns(user_id=user_id)) == len(kv.turns)


def test_reads_return_one_handle_message(memory, user_id):
    facts = [r.fact_id for r in memory.add(user_id=user_id, texts=FACTS)]
    kv = KVMemory(user_id=user_id, k=2, recent_turns=2)
    kv.save_context({"input": "first"}, {"output": "one"})
    kv.save_context({"input": "second"}, {"output": "two"})
    marker = kv.load_memory_variables({"input": FACTS[3]})["history"]
    handle = RECENT_HANDLES.resolve(MARKER_RE.fullmatch(marker).group(1))
    turn_facts = [f for t in kv.turns for f in t["fact_ids"]]
    assert handle.user_id == user_id and len(handle.fact_ids) == 4
    assert handle.fact_ids[0] == facts[3] and set(handle.fact_ids[:2]) <= set(facts)
    assert list(handle.fact_ids[2:]) == turn_facts[2:]  # the last 2 turns, in order

    for role, cls in [("user", HumanMessage), ("system", SystemMessage),
                      ("assistant", AIMessage)]:
        as_messages = KVMemory(user_id=user_id, return_messages=True, handle_role=role)
        (message,) = as_messages.load_memory_variables({"input": "x"})["history"]
        assert type(message) is cls and MARKER_RE.fullmatch(message.content)
        assert MemoryHandle.from_dict(message.additional_kwargs[HANDLES_KEY][0]).user_id == \
            user_id


def test_chat_memory_writes_through_and_clear_keeps_facts(memory, user_id):
    kv = KVMemory(user_id=user_id)
    kv.chat_memory.add_user_message("I adopted a turtle.")
    kv.chat_memory.add_ai_message("What is its name?")
    assert [m.content for m in kv.chat_memory.messages] == ["I adopted a turtle.",
                                                           "What is its name?"]
    assert all(len(t["fact_ids"]) == 1 for t in kv.turns)
    kv.clear()
    assert kv.turns == [] and kv.buffer_as_str == ""
    assert len(memory.get_all(user_id=user_id)) == 2  # long-term facts stay


def test_a_turn_longer_than_one_fact_becomes_several(memory, engine, user_id):
    limit = engine.config.max_fact_tokens
    long_input = " ".join(f"word{i}" for i in range(2 * limit))  # ~2-3 facts' worth
    kv = KVMemory(user_id=user_id, recent_turns=2)
    kv.save_context({"input": long_input}, {"output": "noted"})
    (user_turn, ai_turn) = kv.turns
    assert user_turn["content"] == long_input and len(user_turn["fact_ids"]) >= 2
    texts = [memory.get(user_id=user_id, fact_id=f).text for f in user_turn["fact_ids"]]
    assert all(len(engine.prompts.fact_ids(t)) <= limit for t in texts)
    assert "".join(texts).replace(" ", "") == long_input.replace(" ", "")
    # The window keeps whole turns: every piece of the long turn, then the answer.
    assert kv.handle_for(None).fact_ids == (*user_turn["fact_ids"], *ai_turn["fact_ids"])


def test_llamaindex_verbs(memory, user_id):
    kv = KVMemory.from_defaults(user_id=user_id, k=1, chat_history=[
        ChatMessage(role="user", content="My cat is Tom."),
        ChatMessage(role="assistant", content="Nice cat.")])
    assert [m.content for m in kv.get_all()] == ["My cat is Tom.", "Nice cat."]
    kv.put(ChatMessage(role="user", content="What is my cat's name?"))
    handle_message, pending = kv.get()  # without input: the pending question
    assert MARKER_RE.fullmatch(handle_message.content) and handle_message.role == "user"
    assert pending.content == "What is my cat's name?"
    handle = MemoryHandle.from_dict(handle_message.additional_kwargs[HANDLES_KEY][0])
    assert kv.turns[2]["fact_ids"][0] not in handle.fact_ids  # sent as text, not as a fact
    assert handle.fact_ids[-2:] == (*kv.turns[0]["fact_ids"], *kv.turns[1]["fact_ids"])
    kv.put(handle_message)  # a handle message is never stored
    assert len(kv.turns) == 3
    kv.set([ChatMessage(role="user", content="Start over.")])
    assert [m.content for m in kv.get_all()] == ["Start over."]
    kv.reset()
    assert kv.get_all() == [] and len(kv.get()) == 1
    assert KVMemory.class_name() == "InferScaleKVMemory"


async def test_llamaindex_async_verbs(memory, user_id):
    kv = KVMemory(user_id=user_id)
    await kv.aput(ChatMessage(role="user", content="async hello"))
    messages = await kv.aget()
    assert [m.content for m in messages][1:] == ["async hello"]
    assert [m.content for m in await kv.aget_all()] == ["async hello"]


def test_unregistered_memory_fails_with_what_to_do(user_id):
    kv = KVMemory(user_id=user_id, memory_name="nowhere")
    with pytest.raises(MemoryNotRegisteredError, match="register_memory"):
        kv.save_context({"input": "a"}, {"output": "b"})


def test_a_memory_passed_in_is_used_and_claims_its_name(memory, user_id):
    kv = KVMemory(memory, user_id=user_id, memory_name="default")
    assert kv.memory is memory
    with pytest.raises(ValueError, match="already names another Memory"):
        KVMemory(object.__new__(type(memory)), user_id=user_id)


def test_invalid_fields_are_rejected(user_id):
    with pytest.raises(ValueError):
        KVMemory(user_id=user_id, k=-1)
    with pytest.raises(ValueError):
        KVMemory(user_id="")
    with pytest.raises(ValueError, match="Extra inputs"):
        KVMemory(user_id=user_id, chat_memory=None)
