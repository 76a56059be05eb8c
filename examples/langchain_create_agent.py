"""LangChain 1.x create_agent with KVMemoryMiddleware: the user's facts as KV on every call.

The middleware reads the user from the run's context, attaches her memory handle to each model
call (model_settings -> ChatInferScale) and saves each finished exchange to the memory.
Run: python examples/langchain_create_agent.py --model small
"""

from __future__ import annotations

from dataclasses import dataclass

from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from serving import USER_ID, parse_args, serving

from inferscale_integrations import ChatInferScale, KVMemoryMiddleware


@dataclass
class Context:
    user_id: str


@tool
def days_until(date: str) -> str:
    """Days from today until a date written like '14 March'."""
    return f"{date} is 107 days away."


def main(user_id: str = USER_ID, max_tokens: int = 48, mode: str = "kv") -> dict:
    llm = ChatInferScale(max_tokens=max_tokens, mode=mode)
    memory = KVMemoryMiddleware(k=4)
    agent = create_agent(llm, tools=[days_until], middleware=[memory], context_schema=Context,
                         system_prompt="You are a helpful assistant.")
    state = agent.invoke({"messages": [HumanMessage("How many days until my birthday?")]},
                         context=Context(user_id=user_id))
    return {"user_id": user_id, "answers": [state["messages"][-1].text],
            "tool_calls": [(c["name"], c["args"]) for m in state["messages"]
                           for c in getattr(m, "tool_calls", None) or []],
            "messages": state["messages"], "counters": llm.counters,
            "middleware": memory.counters}


if __name__ == "__main__":
    args = parse_args(__doc__)
    with serving(args.model):
        result = main(max_tokens=args.max_tokens, mode=args.mode)
    for message in result["messages"]:
        print(f"{message.type}: {message.text.strip() or message.tool_calls}")
    print("served:", result["counters"], result["middleware"])
