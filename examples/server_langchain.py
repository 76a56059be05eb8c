"""LangChain against `inferscale serve`: ChatOpenAI and a remote KVMemory in a ConversationChain.

Start the server first, in another terminal (`small` is the real 0.5B model, or a model folder):
    inferscale serve --model small --port 8000
then:
    python examples/server_langchain.py --base-url http://127.0.0.1:8000
chat_openai() is LangChain's own ChatOpenAI with the user and memory options set; the remote
KVMemory writes each exchange to the server (POST /v1/memories) and returns no history: the
server injects the user's top-k facts and, with recent_facts, the session's last facts as KV.
"""

from __future__ import annotations

from langchain_classic.chains import ConversationChain
from langchain_core.callbacks import BaseCallbackHandler
from server_setup import USER_ID, parse_args, remember_demo_facts

from inferscale_integrations import KVMemory
from inferscale_integrations.langchain import chat_openai


class InjectedTokens(BaseCallbackHandler):
    """Collects X-InferScale-Injected-Tokens of every answer (ChatOpenAI's response headers)."""

    def __init__(self) -> None:
        self.per_answer: list[int] = []

    def on_llm_end(self, response, **kwargs) -> None:
        headers = response.generations[0][0].message.response_metadata["headers"]
        self.per_answer.append(int(headers["x-inferscale-injected-tokens"]))


def main(base_url: str, api_key: str | None = None, user_id: str = USER_ID,
         max_tokens: int = 48, session_id: str = "langchain-demo") -> dict:
    remember_demo_facts(base_url, api_key, user_id)
    llm = chat_openai(base_url=base_url, user_id=user_id, api_key=api_key,
                      session_id=session_id, k=4, recent_facts=4, max_tokens=max_tokens,
                      temperature=0)
    memory = KVMemory(base_url=base_url, api_key=api_key, user_id=user_id,
                      session_id=session_id)
    chain = ConversationChain(llm=llm, memory=memory)
    injected = InjectedTokens()
    answers = [chain.invoke({"input": question}, config={"callbacks": [injected]})["response"]
               for question in ("Hi! Do you remember my dog's name?", "And where do I live?")]
    return {"answers": answers, "injected_tokens": injected.per_answer,
            "transcript": memory.buffer_as_str}


if __name__ == "__main__":
    args = parse_args(__doc__)
    result = main(args.base_url, args.api_key, args.user, args.max_tokens)
    for answer in result["answers"]:
        print("AI:", answer.strip())
    print("injected tokens per answer:", result["injected_tokens"])
