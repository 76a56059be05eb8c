"""What the engine checks about a model before it starts vLLM (fail early, with a reason)."""

from __future__ import annotations

import os
from typing import Any

from inferscale_engine.config import ConnectorConfig, EngineConfig
from inferscale_engine.errors import ConfigError, UnsupportedModelError
from inferscale_engine.model.rope import RopeSpec, layer_rope_specs


def check_model(config: EngineConfig) -> tuple[Any, tuple[RopeSpec, ...]]:
    """The model's Hugging Face config and per-layer RoPE specs; refuses what cannot be served.

    Raises:
        UnsupportedModelError: a RoPE variant or attention layout stored KV cannot follow.
    """
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(config.model)
    specs = layer_rope_specs(hf_config, config.max_model_len)
    text_config = getattr(hf_config, "get_text_config", lambda: hf_config)()
    _check_variant(hf_config, text_config, config.model)
    _check_sliding_windows(text_config, config.model, config.max_model_len)
    return hf_config, specs


def layer_windows(text_config: Any) -> list[int | None]:
    """The sliding window vLLM gives each layer (None: global attention).

    As vLLM 0.32 (engine/arg_utils.py, models/*) and 0.26 do: with `layer_types`, only
    'sliding_attention' layers slide; without it a `sliding_window` applies to every layer
    (CacheConfig.sliding_window), unless use_sliding_window is False (Qwen2).
    """
    window = getattr(text_config, "sliding_window", None) or None
    if not getattr(text_config, "use_sliding_window", True):
        window = None
    num_layers = int(text_config.num_hidden_layers)
    layer_types = getattr(text_config, "layer_types", None)
    if not layer_types:
        return [window] * num_layers
    return [window if t == "sliding_attention" else None for t in layer_types]


def _check_sliding_windows(text_config: Any, model: str, max_model_len: int) -> None:
    """Sliding-window layers next to global ones are fine; all-sliding ones only up to the window.

    Mixed models (Gemma 2 / 3) put every layer in one full-attention KV group because the
    hybrid KV cache manager is off (the connector does not declare SupportsHMA and the runner
    sets disable_hybrid_kv_cache_manager): injected facts keep their blocks in every layer and
    the attention kernel masks what is outside a layer's window, as in a plain prefill. A
    model whose every layer slides keeps a sliding-window KV group that frees the blocks
    outside the window; injection into it is not tested.
    """
    windows = layer_windows(text_config)
    if not windows or any(w is None for w in windows):
        return
    window = min(w for w in windows if w is not None)
    if window >= max_model_len:
        return
    raise UnsupportedModelError(
        f"model {model!r} uses sliding-window attention in every layer (window {window} < "
        f"max_model_len {max_model_len}): vLLM frees the KV blocks outside the window, so "
        f"injected facts would lose theirs. Set max_model_len <= {window}, or serve it in "
        "text mode.")


def _check_variant(hf_config: Any, text_config: Any, model: str) -> None:
    """Refuse attention variants of an enabled architecture that no test covers."""
    architectures = list(getattr(hf_config, "architectures", None) or [])
    granite_extras = [k for k in ("layer_types", "layer_rope_theta", "attention_sinks")
                      if getattr(text_config, k, None) is not None]
    if "GraniteForCausalLM" in architectures and granite_extras:
        raise UnsupportedModelError(
            f"model {model!r} is a GraniteForCausalLM with {granite_extras} (the sliding-window "
            "variant: per-layer RoPE bases, NoPE layers and attention sinks); only plain "
            "Granite is tested. Serve it in text mode.")


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
    page = os.sysconf("SC_PAGE_SIZE")
    host_bytes = config.host_tier_bytes
    if host_bytes is None:  # the default: derived from the RAM available now
        host_bytes = min(os.sysconf("SC_AVPHYS_PAGES") * page // 4, 4 * config.slab_capacity_bytes)
    elif host_bytes * config.tensor_parallel_size > os.sysconf("SC_PHYS_PAGES") * page:
        raise ConfigError(
            f"host_tier_bytes={host_bytes} per worker x {config.tensor_parallel_size} workers "
            f"is more than this machine's RAM ({os.sysconf('SC_PHYS_PAGES') * page} bytes); "
            "lower it, or leave it None for a quarter of the available RAM")
    host_pages = host_bytes // (config.slab_page_tokens * bytes_per_token)
    return ConnectorConfig(num_pages, config.slab_page_tokens, config.max_model_len,
                           config.key_origin, host_pages,
                           os.path.abspath(os.path.expanduser(config.disk_tier_path))
                           if config.disk_tier_path else None)


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
