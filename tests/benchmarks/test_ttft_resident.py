"""benchmarks/ttft.py's `resident` ceiling really is resident (the real engine, tiny model).

Its warm-up request must put the very prefix the timed request reads into vLLM's prefix
cache. Until 2026-12-03 the warm-up used the engine's default layout (2 facts repaired in the
user turn), so without a text-mode request before it in the same round the timed resident
request found nothing cached and measured a text prefill.
"""

from __future__ import annotations

from benchmarks import ttft


def test_resident_finds_its_facts_in_the_prefix_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERSCALE_RESULTS", str(tmp_path))
    record = ttft.main(["--model", "tiny", "--ks", "20", "--modes", "kv,resident",
                        "--repeats", "2", "--warmup", "1", "--pool", "40", "--embedder", "none",
                        "--max-model-len", "4096", "--slab-mib", "64", "--facts", "synthetic"])
    entry = record["summary"][20]
    memory = entry["num_injected_tokens"]  # preamble + the 20 facts
    found = entry["cached_tokens_median"]["resident"]
    assert memory > 400
    assert memory - 256 <= found <= memory  # all but the last partial cache blocks
    assert entry["kv_over_resident_paired"]["n"] == 2
    assert list(tmp_path.glob("ttft-tiny-*.json"))


def test_resident_finds_no_more_than_kv_injects_after_a_text_request(tmp_path, monkeypatch):
    """Until 2026-12-03 the timed resident request asked the question the round's text request
    had just asked after the same facts, so it also found its question's leading blocks cached
    and computed fewer tokens than kv: a ceiling above the ceiling."""
    monkeypatch.setenv("INFERSCALE_RESULTS", str(tmp_path))
    record = ttft.main(["--model", "tiny", "--ks", "20", "--modes", "text,kv,resident",
                        "--repeats", "2", "--warmup", "1", "--pool", "40", "--embedder", "none",
                        "--max-model-len", "4096", "--slab-mib", "64", "--facts", "synthetic",
                        "--block-size", "32", "--question-tokens", "80"])
    cached = record["summary"][20]["cached_tokens_median"]
    assert cached["kv"] > 400  # preamble + facts, injected exactly
    assert cached["kv"] - 32 < cached["resident"] <= cached["kv"]


def test_uniform_predecessors_leave_each_mode_its_own_cache_state(tmp_path, monkeypatch):
    """--predecessor uniform runs a text and a kv request on other fact sets before every
    timed request: text must still prefill its facts (only the preamble cached), resident must
    still find its own, and kv still injects them."""
    monkeypatch.setenv("INFERSCALE_RESULTS", str(tmp_path))
    record = ttft.main(["--model", "tiny", "--ks", "20", "--modes", "text,kv,resident",
                        "--repeats", "2", "--warmup", "1", "--pool", "60", "--embedder", "none",
                        "--max-model-len", "4096", "--slab-mib", "64", "--facts", "synthetic",
                        "--predecessor", "uniform"])
    entry = record["summary"][20]
    cached, memory = entry["cached_tokens_median"], entry["num_injected_tokens"]
    assert memory > 400
    assert cached["text"] < memory / 4  # the preamble, not the facts
    assert memory - 256 <= cached["resident"] <= memory
    assert record["config"]["predecessor"] == "uniform"


def test_aligned_rounds_make_resident_compute_exactly_what_kv_computes(tmp_path, monkeypatch):
    """--align-blocks: each round's facts end on a block boundary, so resident's prefix cache
    holds exactly the tokens kv injects (unaligned it prefills the last partial block again).
    The record also carries the scheduler's counters: every kv prompt recognized by identity."""
    monkeypatch.setenv("INFERSCALE_RESULTS", str(tmp_path))
    record = ttft.main(["--model", "tiny", "--ks", "0,20", "--modes", "kv,resident",
                        "--repeats", "2", "--warmup", "1", "--pool", "60", "--embedder", "none",
                        "--max-model-len", "4096", "--slab-mib", "64", "--facts", "synthetic",
                        "--block-size", "32", "--align-blocks"])
    assert record["aligned_to"] == 32
    cached = record["summary"][20]["cached_tokens_median"]
    assert cached["kv"] > 400 and cached["kv"] % 32 == 0
    assert cached["resident"] == cached["kv"]
    counters = record["scheduler_counters"]
    assert counters["plans_inject"] > 0
    assert counters["prompts_by_identity"] == counters["plans_inject"]
