"""Chunked RoPE kernels: KV moved between the slab and vLLM's paged cache, keys re-rotated.

Imports only torch and triton (every vLLM worker loads these).

  rope_tables.py   RopeTables: the one record of a model's RoPE every mover takes
  reference.py     the operations in plain torch: the test oracle and the CPU path
  chunked_rope.py  the same operations as Triton kernels, one launch per call
  mover.py         BoundMover: the kernels bound once to a cache, slab and tables (hot path)
"""
