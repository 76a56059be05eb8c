"""LangGraph's store as long-term memory: create_agent(store=KVMemoryStore(...)).

The user's memories live in the store namespace ("memories", user_id): the app (or an agent's
tool, through runtime.store.put) writes them, and KVMemoryMiddleware(namespace=...) gives every
model call the namespace's top-k facts as KV.
Run: python examples/langgraph_store.py --model small
"""

from __future__ import annotations

from dataclasses import dataclass

from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from serving import USER_ID, parse_args, serving

from inferscale_engine.cli import DEMO_FACTS
from inferscale_integrations import ChatInferScale, KVMemoryMiddleware, KVMemoryStore


@dataclass
class Context:
    user_id: str


def main(user_id: str = USER_ID, max_tokens: int = 48, mode: str = "kv") -> dict:
    store = KVMemoryStore()  # over the registered Memory
    namespace = ("memories", user_id)
    if not store.search(namespace, limit=1):
        for i, fact in enumerate(DEMO_FACTS):
            store.put(namespace, f"demo-{i}", {"text": fact})
    llm = ChatInferScale(max_tokens=max_tokens, mode=mode)
    memory = KVMemoryMiddleware(namespace=("memories", "{user_id}"), k=4, save_turns=False)
    agent = create_agent(llm, tools=[], middleware=[memory], context_schema=Context,
                         store=store, system_prompt="You are a helpful assistant.")
    answers = []
    for question in ("What is my dog's name?", "Where do I live?"):
        state = agent.invoke({"messages": [HumanMessage(question)]},
                             context=Context(user_id=user_id))
        answers.append(state["messages"][-1].text)
    return {"user_id": user_id, "answers": answers, "counters": llm.counters,
            "middleware": memory.counters}


if __name__ == "__main__":
    args = parse_args(__doc__)
    with serving(args.model):
        result = main(max_tokens=args.max_tokens, mode=args.mode)
    for answer in result["answers"]:
        print("AI:", answer.strip())
    print("served:", result["counters"], result["middleware"])
