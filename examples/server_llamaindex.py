"""LlamaIndex against `inferscale serve`: OpenAILike and a remote KVMemory in SimpleChatEngine.

Start the server first, in another terminal (`small` is the real 0.5B model, or a model folder):
    inferscale serve --model small --port 8000
then:
    python examples/server_llamaindex.py --base-url http://127.0.0.1:8000
openai_like() is LlamaIndex's own OpenAILike with the user and memory options set; the remote
KVMemory writes each exchange to the server and returns only the pending question: the server
injects the user's top-k facts and, with recent_facts, the session's last facts as KV.
"""

from __future__ import annotations

from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent
from server_setup import USER_ID, parse_args, remember_demo_facts

from inferscale_integrations import KVMemory
from inferscale_integrations.llamaindex import openai_like


class InjectedTokens(BaseEventHandler):
    """Collects the server's `memory.injected_tokens` of every whole (not streamed) answer;
    a streamed answer says it in its X-InferScale-* response headers only."""

    per_answer: list[int] = []

    def handle(self, event, **kwargs) -> None:
        if isinstance(event, LLMChatEndEvent) and event.response is not None:
            memory = (getattr(event.response.raw, "model_extra", None) or {}).get("memory")
            if memory is not None:
                self.per_answer.append(memory["injected_tokens"])


def main(base_url: str, api_key: str | None = None, user_id: str = USER_ID,
         max_tokens: int = 48, session_id: str = "llamaindex-demo") -> dict:
    remember_demo_facts(base_url, api_key, user_id)
    llm = openai_like(base_url=base_url, user_id=user_id, api_key=api_key,
                      session_id=session_id, k=4, recent_facts=4, max_tokens=max_tokens,
                      temperature=0)
    memory = KVMemory(base_url=base_url, api_key=api_key, user_id=user_id,
                      session_id=session_id)
    chat_engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
    injected = InjectedTokens(per_answer=[])
    get_dispatcher().add_event_handler(injected)
    first = chat_engine.chat("What is the name of my dog?").response
    streamed = chat_engine.stream_chat("Which instrument am I learning?")
    second = "".join(streamed.response_gen)
    get_dispatcher().event_handlers.remove(injected)
    return {"answers": [first, second], "injected_tokens": injected.per_answer,
            "turns": memory.turns}


if __name__ == "__main__":
    args = parse_args(__doc__)
    result = main(args.base_url, args.api_key, args.user, args.max_tokens)
    for answer in result["answers"]:
        print("AI:", answer.strip())
    print("injected tokens per answer:", result["injected_tokens"])
