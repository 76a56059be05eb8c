"""RopeSpec reproduces vLLM's own RoPE tables and refuses what cannot be re-rotated."""

from __future__ import annotations

import pytest
import torch

from inferscale_engine.errors import UnsupportedModelError
from inferscale_engine.rope import RopeSpec, RopeStyle

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


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope", "mrope", "su"])
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
