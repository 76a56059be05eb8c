"""GPU diagnostics for same-position injection: Triton vs reference path, prefix caching on/off.

Prints, per variant, the KV-mode and text-mode tokens/logprobs and how the paged slots written
by the injection compare with the slab entries they came from.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from inferscale_engine.facts import MemoryHandle  # noqa: E402
from tests.conftest import FACTS, QUESTIONS, greedy, running_engine  # noqa: E402
from tests.tiny_model import TinyModelSpec, tiny_model_path  # noqa: E402


def use_reference(worker) -> None:
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    get_kv_transfer_group().worker.paged._pointers = None


def main() -> None:
    base = dict(kv_cache_memory_bytes=None, gpu_memory_utilization=0.15, enforce_eager=True,
                max_model_len=2048, slab_capacity_bytes=64 * 2**20)
    for arch, dtype, variant in [("llama", "float32", "triton"), ("llama", "float32", "reference"),
                                 ("llama", "float32", "noprefix"), ("llama", "bfloat16", "triton")]:
        kw = dict(base, dtype=dtype)
        if variant == "noprefix":
            kw["enable_prefix_caching"] = False
        with running_engine(tiny_model_path(TinyModelSpec(arch)), **kw) as eng:
            if variant == "reference":
                eng.llm.collective_rpc(use_reference)
            (f1,) = eng.add_facts("u1", [FACTS[1]])
            handle = MemoryHandle("u1", (f1,))
            kv = eng.generate(handle, QUESTIONS[0], greedy(6), mode="kv")
            text = eng.generate(handle, QUESTIONS[0], greedy(6), mode="text")
            _, slots = eng.llm.collective_rpc("inferscale_recent_loads")[0][-1]
            k_paged, v_paged = eng.llm.collective_rpc("inferscale_read_slots", args=(slots,))[0]
            pre_key = next(iter(eng._preambles.values()))
            kp, vp, _ = eng.llm.collective_rpc("inferscale_read_entry", args=(pre_key,))[0]
            kf, vf, _ = eng.llm.collective_rpc("inferscale_read_entry",
                                               args=(eng._facts[f1].slab_key,))[0]
            k_slab, v_slab = torch.cat([kp, kf], 1), torch.cat([vp, vf], 1)
            print(f"== {arch} {dtype} {variant}: kv tokens {kv.token_ids} text {text.token_ids}")
            print(f"   logprobs kv {[round(x, 4) for x in kv.logprobs]}")
            print(f"   logprobs tx {[round(x, 4) for x in text.logprobs]}")
            print(f"   injected {kv.num_injected_tokens} cached(kv) {kv.num_cached_tokens} "
                  f"cached(text) {text.num_cached_tokens} slots {len(slots)} "
                  f"first slots {slots[:4]}...{slots[-2:]}")
            print(f"   paged vs slab: K {(k_paged - k_slab).abs().max().item():.3e} "
                  f"V {(v_paged - v_slab).abs().max().item():.3e} shapes {tuple(k_paged.shape)} "
                  f"{tuple(k_slab.shape)}; |K| {k_slab.abs().max().item():.2f}")
            print(f"   stats {eng.stats().workers[0]}")


if __name__ == "__main__":
    main()
