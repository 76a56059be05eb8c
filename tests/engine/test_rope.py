"""RopeSpec reproduces vLLM's own RoPE tables and refuses what cannot be re-rotated."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from inferscale_engine.errors import UnsupportedModelError
from inferscale_engine.model.rope import RopeSpec, RopeStyle, layer_rope_specs
from tests.tiny_model import FAMILIES, TinyModelSpec, tiny_model_path

CASES = [
    ("default", {}),
    ("linear", {"factor": 4.0}),
    ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256}),
    ("yarn", {"factor": 4.0, "original_max_position_embeddings": 512, "beta_fast": 32,
              "beta_slow": 1}),
]


@pytest.fixture(scope="module")
def vllm_rope():
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    def make(**kwargs):
        with set_current_vllm_config(VllmConfig()):
            return get_rope(**kwargs)

    return make


@pytest.mark.parametrize("rope_type,params", CASES)
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (64, 32), (128, 64)])
def test_tables_equal_vllm_bit_for_bit(vllm_rope, rope_type, params, head_dim, rotary_dim):
    spec = RopeSpec(RopeStyle.ROTATE_HALF, head_dim, rotary_dim, rope_type, 10000.0,
                    tuple(sorted(params.items())))
    rope_parameters = dict(params, rope_type=rope_type, rope_theta=10000.0,
                           partial_rotary_factor=rotary_dim / head_dim)
    theirs = vllm_rope(head_size=head_dim, max_position=2048, is_neox_style=True,
                       rope_parameters=rope_parameters, dtype=torch.float32)
    cache = theirs.cos_sin_cache
    n = min(cache.shape[0], 2048)
    cos, sin = spec.cos_sin(n)
    mscale = getattr(theirs, "mscale", 1.0)  # yarn folds it into vLLM's table, never ours
    assert torch.equal(cache[:n, : rotary_dim // 2], cos * mscale)
    assert torch.equal(cache[:n, rotary_dim // 2:], sin * mscale)


def test_yarn_magnitude_is_not_in_our_tables():
    spec = RopeSpec(RopeStyle.ROTATE_HALF, 64, 64, "yarn", 10000.0,
                    (("factor", 4.0), ("original_max_position_embeddings", 512)))
    cos, sin = spec.cos_sin(100)
    assert torch.allclose(cos**2 + sin**2, torch.ones_like(cos), atol=1e-6)


@pytest.mark.parametrize("rope_type", ["dynamic", "mrope", "su"])
def test_unsupported_rope_types_fail_loudly(rope_type):
    with pytest.raises(UnsupportedModelError, match=rope_type):
        RopeSpec(RopeStyle.ROTATE_HALF, 64, 64, rope_type, 10000.0)


def test_dynamic_message_says_why():
    with pytest.raises(UnsupportedModelError, match="cannot be re-rotated"):
        RopeSpec(RopeStyle.ROTATE_HALF, 64, 64, "dynamic", 10000.0)


def test_from_hf_config_of_the_tiny_models(tiny_models):
    from transformers import AutoConfig

    llama = RopeSpec.from_hf_config(AutoConfig.from_pretrained(tiny_models["llama"]))
    assert (llama.style, llama.rope_type, llama.rotary_dim) == (RopeStyle.ROTATE_HALF, "llama3", 64)
    assert llama.param_dict["factor"] == 8.0
    qwen = RopeSpec.from_hf_config(AutoConfig.from_pretrained(tiny_models["qwen2"]))
    assert (qwen.rope_type, qwen.theta) == ("default", 1_000_000.0)


def test_unknown_architecture_is_refused():
    from transformers import GPT2Config

    with pytest.raises(UnsupportedModelError, match="not supported"):
        RopeSpec.from_hf_config(GPT2Config())


def test_gptj_is_interleaved_with_partial_rotary():
    from transformers import GPTJConfig

    spec = RopeSpec.from_hf_config(GPTJConfig(n_embd=256, n_head=4, rotary_dim=32,
                                              architectures=["GPTJForCausalLM"]))
    assert spec.style is RopeStyle.INTERLEAVED and (spec.head_dim, spec.rotary_dim) == (64, 32)


def _tiny_config(family: str):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(tiny_model_path(TinyModelSpec(family)))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_rotates_half_of_its_rotary_dims(family):
    specs = layer_rope_specs(_tiny_config(family), 1024)
    assert len(specs) == 4 and all(s.style is RopeStyle.ROTATE_HALF for s in specs)
    assert {s.rotary_dim for s in specs} == {48 if family == "phi3" else 64}


@pytest.mark.parametrize("max_model_len,long", [(512, False), (1024, True)])
def test_longrope_uses_the_factor_set_vllm_picks_for_max_model_len(monkeypatch, max_model_len,
                                                                     long):
    """vLLM's Phi3LongRoPEScaledRotaryEmbedding picks short or long factors once, from
    max_model_len; RopeSpec picks the same set and its tables equal vLLM's (without mscale)."""
    from vllm.model_executor.layers.rotary_embedding import phi3_long_rope_scaled_rope as phi3

    monkeypatch.setattr(phi3, "get_current_vllm_config", lambda: SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=max_model_len)))
    config = _tiny_config("phi3")
    (spec,) = set(layer_rope_specs(config, max_model_len))
    rope = config.rope_parameters
    assert spec.param_dict["long"] is long and spec.rotary_dim == 48
    assert spec.param_dict["factors"] == tuple(rope["long_factor" if long else "short_factor"])
    theirs = phi3.Phi3LongRoPEScaledRotaryEmbedding(
        64, 48, config.max_position_embeddings, rope["original_max_position_embeddings"],
        rope["rope_theta"], True, torch.float32, rope["short_factor"], rope["long_factor"])
    assert theirs.use_long_rope is long
    first = rope["original_max_position_embeddings"] if long else 0
    table = theirs.long_short_cos_sin_cache[first:first + max_model_len]
    mscale = theirs.long_mscale if long else theirs.short_mscale
    cos, sin = spec.cos_sin(max_model_len)
    assert torch.equal(table[:, :24], cos * mscale) and torch.equal(table[:, 24:], sin * mscale)


def test_longrope_needs_max_model_len():
    with pytest.raises(ValueError, match="max_model_len"):
        RopeSpec.from_hf_config(_tiny_config("phi3"))


def test_gemma3_local_and_global_layers_rotate_as_vllm_rotates_them(vllm_rope):
    config = _tiny_config("gemma3")
    specs = layer_rope_specs(config, 1024)
    assert specs[0] == specs[1] == specs[2] != specs[3]
    assert (specs[0].rope_type, specs[0].theta) == ("default", 10000.0)
    assert (specs[3].rope_type, specs[3].theta, specs[3].param_dict) == (
        "linear", 1e6, {"factor": 8.0})
    for spec, layer_type in zip(specs, config.layer_types, strict=True):
        theirs = vllm_rope(head_size=64, max_position=1024, is_neox_style=True,
                           rope_parameters=config.rope_parameters[layer_type],
                           dtype=torch.float32).cos_sin_cache[:1024]  # linear: 1024 * factor rows
        cos, sin = spec.cos_sin(1024)
        assert torch.equal(theirs[:, :32], cos) and torch.equal(theirs[:, 32:], sin)
