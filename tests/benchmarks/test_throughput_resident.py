"""benchmarks/throughput.py's `resident` ceiling computes what kv computes (real engine, tiny).

Until 2026-12-03 the timed resident batch repeated the text batch's exact prompts, so it found
whole prompts in vLLM's prefix cache and computed fewer tokens than kv.
"""

from __future__ import annotations

from benchmarks import throughput


def test_resident_batches_find_no_more_than_kv_injects(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERSCALE_RESULTS", str(tmp_path))
    record = throughput.main(["--model", "tiny", "--concurrency", "4", "--k", "20",
                              "--repeats", "1", "--pool", "60", "--max-model-len", "4096",
                              "--slab-mib", "64", "--question-tokens", "80",
                              "--vllm-arg", "block_size=32"])
    result = record["results"]
    kv, resident = (result[m][4]["cached_tokens_median"] for m in ("kv", "resident"))
    assert kv > 400  # preamble + 20 facts, injected exactly
    assert kv - 32 < resident <= kv
    assert len(record["paired_ratios"][4]["kv_over_resident"]) == 1
