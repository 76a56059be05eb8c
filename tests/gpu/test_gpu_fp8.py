"""fp8 KV caches on a GPU (vLLM 0.26's FlashAttention 3 with kv_cache_dtype="fp8", H200).

The slab keeps bf16; injection rotates keys in fp32, rounds them to bf16 (as the model's own
keys are) and writes them through vLLM's own CUDA cache write, which quantizes with the layer's
scales exactly as a prefill does:
* a fact injected where it was encoded reproduces text mode bit for bit (|dlogprob| = 0);
* a moved fact's layer-0 keys are within a few fp8 ulps (of their rotation pair's magnitude)
  of a fresh prefill's keys at the new positions as vLLM writes them.
Run by benchmarks/gpu/run_h200.sh; skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch

from inferscale_engine.facts import MemoryHandle
from tests.conftest import FACTS, QUESTIONS, greedy, max_abs_diff, running_engine
from tests.gpu.test_gpu_engine import GPU, _layout
from tests.gpu.test_gpu_tiers import _model
from tests.invariants.test_fp8_cache import _pair_ulp
from tests.invariants.test_moved_facts import hf_keys

pytestmark = [pytest.mark.gpu, pytest.mark.vllm,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _as_vllm_writes(keys: torch.Tensor) -> torch.Tensor:
    """[T, H, D] keys, rounded to bf16 (the model's dtype), written by vLLM's CUDA fp8 cache
    write with scale 1 (dummy and tiny models carry no calibrated scales) and read back."""
    from vllm import _custom_ops as ops

    tokens, heads, dim = keys.shape
    cache = torch.zeros(2, -(-tokens // 16), 16, heads, dim, dtype=torch.uint8, device="cuda")
    one = torch.ones((), dtype=torch.float32, device="cuda")
    bf16 = keys.to("cuda", torch.bfloat16)
    ops.reshape_and_cache_flash(bf16, bf16, cache[0], cache[1],
                                torch.arange(tokens, dtype=torch.int64, device="cuda"),
                                "fp8", one, one)
    flat = cache[0].reshape(-1, heads, dim)[:tokens]
    return flat.view(torch.float8_e4m3fn).float().cpu()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "llama-3.1-8b"])
def test_fp8_cache_same_position_exact_and_moved_keys(tiny_models, name):
    model, extra = _model(tiny_models, name)
    with running_engine(model, dtype="bfloat16", kv_cache_dtype="fp8", **GPU,
                        **extra) as engine:
        layout = engine.llm.collective_rpc(_layout)[0]
        (fact_id,) = engine.add_facts("u1", [FACTS[0]])
        handle = MemoryHandle("u1", (fact_id,))
        kv = engine.generate(handle, QUESTIONS[0], greedy(8), mode="kv")
        text = engine.generate(handle, QUESTIONS[0], greedy(8), mode="text")
        assert kv.plan_status == "inject" and kv.num_injected_tokens > 0
        same = max_abs_diff(kv.logprobs, text.logprobs)
        report = f"\n[gpu {name} fp8 {layout}] same-position max |dlogprob| {same:.2e}"
        if name.startswith("tiny"):  # real weights: a transformers prefill is the reference
            first, second = engine.add_facts("u2", FACTS[:2])
            preamble = list(engine.prompts.preamble())
            fact_ids = list(engine.prompts.fact_ids(FACTS[1]))
            shift = len(engine.prompts.fact_ids(FACTS[0]))
            (reference,) = hf_keys(str(model), preamble + fact_ids, [shift],
                                   engine.config.max_model_len)
            fresh = _as_vllm_writes(reference[0, len(preamble):])
            out = engine.generate(MemoryHandle("u2", (first, second)), QUESTIONS[0], greedy(1))
            assert out.plan_status == "inject"
            _, slots = engine.llm.collective_rpc("inferscale_recent_loads")[0][-1]
            start = len(preamble) + shift
            paged_keys, _ = engine.llm.collective_rpc(
                "inferscale_read_slots", args=(slots[start:start + len(fact_ids)],))[0]
            style = "neox" if engine.rope[0].style.value == "rotate_half" else "gptj"
            error = (paged_keys[0].float() - fresh).abs()
            ulps = error / _pair_ulp(reference[:1, len(preamble):], style, 3,
                                     torch.float8_e4m3fn)[0]
            report += (f"; layer 0 moved +{shift}: {(error == 0).float().mean():.1%} equal a "
                       f"fresh prefill's as vLLM writes them, max {ulps.max():.2f} fp8 ulps")
            assert ulps.max() <= 3.5
        print(report)
        assert same == 0.0
        assert "triton=False" in layout  # vLLM's own cache write quantizes
