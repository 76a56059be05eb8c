"""The runtime that drives vLLM: the Engine and its write and read paths (app side).

engine.py        Engine: add_facts, generate, prepare_request, delete (the facade)
fact_table.py    the facts the engine knows: ids (one author), token ids, contexts checked
write_path.py    save requests that encode facts into the slab; tier moves back into it
read_path.py     prompts and plans of kv-mode requests; running and collecting a batch
residency.py     which facts have slab pages, LRU; preambles.py the preambles' KV
pins.py          the users' pinned facts: never evicted, first in prompts; their caps
tier_manager.py  the app side of the lower KV tiers: host-RAM pages, disk entry names
shards.py        one shard per data-parallel engine; generation.py results and stats
runner.py        VllmRunner (co-located vllm.LLM), AsyncRunner (the server's AsyncLLM),
                 WorkerClient (the typed calls to every worker)
"""
