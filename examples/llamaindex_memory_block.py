"""LlamaIndex's block-based Memory with KVMemoryBlock: the user's facts as KV in a FunctionAgent.

Run: python examples/llamaindex_memory_block.py --model small
"""

from __future__ import annotations

import asyncio

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.memory import Memory
from llama_index.core.tools import FunctionTool
from serving import USER_ID, parse_args, serving

from inferscale_integrations import InferScaleLLM, KVMemoryBlock


def days_until(date: str) -> str:
    """Days from today until a date written like '14 March'."""
    return f"{date} is 107 days away."


async def run(user_id: str = USER_ID, max_tokens: int = 48, mode: str = "kv") -> dict:
    llm = InferScaleLLM(max_tokens=max_tokens, mode=mode)
    memory = Memory.from_defaults(session_id=user_id,
                                  memory_blocks=[KVMemoryBlock(user_id=user_id, k=4)])
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(days_until)], llm=llm,
                          system_prompt="You are a helpful assistant. Use tools when needed.")
    result = await agent.run(user_msg="How many days until my birthday?", memory=memory)
    return {"user_id": user_id, "answers": [str(result.response.content)],
            "tool_calls": [(c.tool_name, c.tool_kwargs) for c in result.tool_calls],
            "counters": llm.counters}


def main(user_id: str = USER_ID, max_tokens: int = 48, mode: str = "kv") -> dict:
    return asyncio.run(run(user_id, max_tokens, mode))


if __name__ == "__main__":
    args = parse_args(__doc__)
    with serving(args.model):
        result = main(max_tokens=args.max_tokens, mode=args.mode)
    print("tools called:", result["tool_calls"])
    print("AI:", result["answers"][0].strip())
    print("served:", result["counters"])
