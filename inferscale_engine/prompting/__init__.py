"""Prompts from token ids: the memory block, layouts, encoding contexts, tool calls.

prompt.py      PromptBuilder, MemoryPrompt
layout.py      Layout: which facts are injected and which repaired as text
contexts.py    what a fact is encoded after (Context-Window Encoding)
tool_calls.py  tool calls in prompts and answers
"""
