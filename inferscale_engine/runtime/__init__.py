"""The runtime that drives vLLM: the Engine and its write and read paths.

engine.py      Engine: add_facts, generate, prepare_request
runner.py      VllmRunner (co-located vllm.LLM), AsyncRunner (the server's AsyncLLM)
write_path.py  save requests that encode facts into the slab
read_path.py   prompts and plans of kv-mode requests
residency.py   which facts have slab pages; preambles.py the preambles' KV
shards.py      one shard per data-parallel engine; generation.py results and stats
"""
