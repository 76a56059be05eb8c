"""A LlamaIndex chat engine with KVMemory and InferScaleLLM.

SimpleChatEngine keeps working as it does with ChatMemoryBuffer: the memory returns one handle
message (the user's top-k facts and recent turns, served as injected KV) and the question.
Run: python examples/llamaindex_chat_engine.py
"""

from __future__ import annotations

from llama_index.core.chat_engine import SimpleChatEngine
from serving import USER_ID, parse_args, serving

from inferscale_integrations import InferScaleLLM, KVMemory


def main(user_id: str = USER_ID, max_tokens: int = 48, mode: str = "kv") -> dict:
    llm = InferScaleLLM(max_tokens=max_tokens, mode=mode)
    memory = KVMemory(user_id=user_id, k=4)
    chat_engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
    first = chat_engine.chat("What is the name of my dog?").response
    streamed = chat_engine.stream_chat("Which instrument am I learning?")
    second = "".join(streamed.response_gen)  # the answer is replayed token by token
    return {"user_id": user_id, "answers": [first, second], "counters": llm.counters,
            "turns": memory.turns}


if __name__ == "__main__":
    args = parse_args(__doc__)
    with serving(args.model):
        result = main(max_tokens=args.max_tokens, mode=args.mode)
    for answer in result["answers"]:
        print("AI:", answer.strip())
    print("served:", result["counters"])
