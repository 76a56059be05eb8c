"""What the engine checks about a model before it starts vLLM (fail early, with a reason)."""

from __future__ import annotations

from typing import Any

from inferscale_engine.config import ConnectorConfig, EngineConfig
from inferscale_engine.errors import UnsupportedModelError
from inferscale_engine.rope import RopeSpec


def check_model(config: EngineConfig) -> tuple[Any, RopeSpec]:
    """The model's Hugging Face config and RoPE spec; refuses what cannot be served.

    Raises:
        UnsupportedModelError: a RoPE variant or attention layout stored KV cannot follow.
    """
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(config.model)
    rope = RopeSpec.from_hf_config(hf_config)
    text_config = getattr(hf_config, "get_text_config", lambda: hf_config)()
    if getattr(text_config, "sliding_window", None) and getattr(
            text_config, "use_sliding_window", True):
        raise UnsupportedModelError(
            f"model {config.model!r} uses sliding-window attention; injected facts would fall "
            "out of the window. Use a full-attention model.")
    return hf_config, rope


def connector_config(config: EngineConfig, hf_config: Any) -> ConnectorConfig:
    """What the connector is told: the slab's size in pages (from slab_capacity_bytes).

    Raises:
        UnsupportedModelError: the slab cannot hold one page.
    """
    bytes_per_token = kv_bytes_per_token(hf_config, config)
    num_pages = config.slab_capacity_bytes // (config.slab_page_tokens * bytes_per_token)
    if num_pages < 1:
        raise UnsupportedModelError(
            f"slab_capacity_bytes={config.slab_capacity_bytes} cannot hold one page of "
            f"{config.slab_page_tokens} tokens ({bytes_per_token} bytes each); raise it")
    return ConnectorConfig(num_pages, config.slab_page_tokens, config.max_model_len,
                           config.key_origin)


def load_tokenizer(config: EngineConfig) -> Any:
    """The tokenizer of `config` (its own folder, else the model's)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(config.tokenizer or config.model)


def kv_bytes_per_token(hf_config: Any, config: EngineConfig) -> int:
    """Bytes one token takes in one worker's slab (keys + values, all layers)."""
    heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or (
        hf_config.hidden_size // hf_config.num_attention_heads)
    dtype = config.dtype
    if dtype == "auto":
        dtype = str(getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
                    or "bfloat16").replace("torch.", "")
    heads_per_rank = max(1, heads // config.tensor_parallel_size)
    return 2 * hf_config.num_hidden_layers * heads_per_rank * head_dim * (
        4 if dtype == "float32" else 2)
