"""The plain-torch Chunked RoPE equals vLLM's own rotary embedding applied at positions."""

from __future__ import annotations

import pytest
import torch

from inferscale_engine.kernels import reference
from inferscale_engine.model.rope import RopeSpec, RopeStyle


def vllm_rotate(keys: torch.Tensor, positions: torch.Tensor, spec: RopeSpec) -> torch.Tensor:
    """Keys rotated by vLLM's RotaryEmbedding.forward_native (fp32) at `positions`."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    params = dict(spec.param_dict, rope_type=spec.rope_type, rope_theta=spec.theta,
                  partial_rotary_factor=spec.rotary_dim / spec.head_dim)
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(head_size=spec.head_dim, max_position=4096,
                        is_neox_style=spec.style is RopeStyle.ROTATE_HALF,
                        rope_parameters=params, dtype=torch.float32)
        num_tokens, heads, dim = keys.shape
        query = torch.zeros(num_tokens, heads * dim)
        _, rotated = rope.forward_native(positions, query, keys.reshape(num_tokens, -1).clone())
    return rotated.view(num_tokens, heads, dim)


@pytest.mark.parametrize("style", list(RopeStyle))
@pytest.mark.parametrize("rope_type,params", [
    ("default", ()), ("linear", (("factor", 2.0),)),
    ("llama3", (("factor", 8.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
                ("original_max_position_embeddings", 256))),
])
@pytest.mark.parametrize("rotary_dim", [64, 32])
def test_rotation_from_zero_equals_vllm_rope(style, rope_type, params, rotary_dim):
    torch.manual_seed(0)
    spec = RopeSpec(style, 64, rotary_dim, rope_type, 10000.0, params)
    cos, sin = spec.cos_sin(4096)
    keys = torch.randn(50, 2, 64)
    positions = torch.randint(1, 3000, (50,))
    ours = reference.rerotate_keys(keys, torch.zeros_like(positions), positions, cos, sin,
                                   style.value)
    theirs = vllm_rotate(keys, positions, spec)
    assert (ours - theirs).abs().max() < 2e-6


def test_move_composes_and_round_trips_exactly_enough():
    torch.manual_seed(1)
    spec = RopeSpec(RopeStyle.ROTATE_HALF, 64, 64, "default", 10000.0)
    cos, sin = spec.cos_sin(4096)
    keys = torch.randn(40, 2, 64)
    a, b = torch.randint(0, 4000, (40,)), torch.randint(0, 4000, (40,))
    moved = reference.rerotate_keys(keys, a, b, cos, sin, "rotate_half")
    back = reference.rerotate_keys(moved, b, a, cos, sin, "rotate_half")
    assert (back - keys).abs().max() < 1e-5
    # Moving keys rotated at a to b equals rotating the unrotated keys at b directly.
    at_a = reference.rerotate_keys(keys, torch.zeros_like(a), a, cos, sin, "rotate_half")
    at_b = reference.rerotate_keys(keys, torch.zeros_like(b), b, cos, sin, "rotate_half")
    assert (reference.rerotate_keys(at_a, a, b, cos, sin, "rotate_half") - at_b).abs().max() < 1e-5


def test_same_position_is_bit_exact_and_one_rounding_for_bf16():
    spec = RopeSpec(RopeStyle.ROTATE_HALF, 64, 64, "default", 10000.0)
    cos, sin = spec.cos_sin(512)
    keys = torch.randn(30, 2, 64).bfloat16()
    same = torch.arange(30)
    assert torch.equal(reference.rerotate_keys(keys, same, same, cos, sin, "rotate_half"), keys)
    moved = reference.rerotate_keys(keys, same, same + 7, cos, sin, "rotate_half")
    exact = reference.rerotate_keys(keys.float(), same, same + 7, cos, sin, "rotate_half")
    assert moved.dtype == torch.bfloat16
    assert torch.equal(moved, exact.bfloat16())  # fp32 math, a single cast


def test_partial_rotary_leaves_tail_dims_untouched():
    spec = RopeSpec(RopeStyle.INTERLEAVED, 64, 32, "default", 10000.0)
    cos, sin = spec.cos_sin(100)
    keys = torch.randn(10, 2, 64)
    moved = reference.rerotate_keys(keys, torch.zeros(10, dtype=torch.long),
                                    torch.arange(10) + 5, cos, sin, "interleaved")
    assert torch.equal(moved[..., 32:], keys[..., 32:])
    assert not torch.equal(moved[..., :32], keys[..., :32])
