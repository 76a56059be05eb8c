"""A LangChain app: a ConversationChain and an AgentExecutor sharing one conversation memory.

langchain_buffer_memory.py and langchain_kv_memory.py are the same app; they differ ONLY in the
memory line (and its import). With ConversationBufferMemory the transcript is pasted into every
prompt as text; with KVMemory the user's top-k long-term facts and the recent turns reach the
model as KV that was prefilled once and is injected into vLLM's paged cache.
Run either: python examples/langchain_kv_memory.py --model small   (or a model folder)
"""

from __future__ import annotations

from langchain_classic.agents import AgentExecutor, create_tool_calling_agent
from langchain_classic.chains import ConversationChain
from langchain_classic.memory import ConversationBufferMemory
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.tools import tool
from serving import USER_ID, parse_args, serving

from inferscale_integrations.langchain import ChatInferScale


@tool
def days_until(date: str) -> str:
    """Days from today until a date written like '14 March'."""
    return f"{date} is 107 days away."


def main(user_id: str = USER_ID, max_tokens: int = 48, mode: str = "kv") -> dict:
    llm = ChatInferScale(max_tokens=max_tokens, mode=mode)
    memory = ConversationBufferMemory(return_messages=True)

    chat_prompt = ChatPromptTemplate.from_messages([
        ("system", "You are a helpful assistant."), MessagesPlaceholder("history"),
        ("human", "{input}")])
    chain = ConversationChain(llm=llm, memory=memory, prompt=chat_prompt)
    first = chain.invoke({"input": "Hi! Do you remember my dog's name?"})["response"]
    second = chain.invoke({"input": "And where do I live?"})["response"]

    agent_prompt = ChatPromptTemplate.from_messages([
        *chat_prompt.messages, MessagesPlaceholder("agent_scratchpad")])
    agent = create_tool_calling_agent(llm, [days_until], agent_prompt)
    executor = AgentExecutor(agent=agent, tools=[days_until], memory=memory,
                             max_iterations=3, handle_parsing_errors=True,
                             return_intermediate_steps=True)
    run = executor.invoke({"input": "How many days until my birthday?"})
    return {"user_id": user_id, "answers": [first, second, run["output"]],
            "tool_calls": [(step.tool, step.tool_input) for step, _ in run["intermediate_steps"]],
            "counters": llm.counters, "transcript": memory.buffer_as_str}


if __name__ == "__main__":
    args = parse_args(__doc__)
    with serving(args.model):
        result = main(max_tokens=args.max_tokens, mode=args.mode)
    print(result["transcript"])
    print("served:", result["counters"])
