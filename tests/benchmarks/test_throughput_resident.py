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
                              "--vllm-arg", "block_size=32", "--profile-client"])
    result = record["results"]
    kv, resident = (result[m][4]["cached_tokens_median"] for m in ("kv", "resident"))
    assert kv > 400  # preamble + 20 facts, injected exactly
    assert kv - 32 < resident <= kv
    assert len(record["paired_ratios"][4]["kv_over_resident"]) == 1
    # vLLM's engine-core timestamps of every timed request: queued <= scheduled <= first token
    for mode in ("text", "kv", "resident"):
        (batch,) = result[mode][4]["raw_engine_ms"]
        assert len(batch) == 4
        assert all(0 <= q <= s <= f <= last for q, s, f, last in batch), batch
        assert result[mode][4]["last_token_ms_median"] <= result[mode][4]["batch_wall_s"] * 1e3
        assert 1 <= result[mode][4]["first_steps_median"] <= 4
        # the client's CPU per timed batch, and its profile (the engine runs in this process
        # here, MP=0, so the batch's engine step is in it)
        (cpu,) = result[mode][4]["raw_client_cpu_s"]
        assert 0 < cpu and result[mode][4]["client_cpu_ms_median"] == cpu * 1e3
        profile = result[mode][4]["client_profile"]
        assert any("generate_many" in line for line in profile["cumulative"])


def test_aligned_fact_sets_make_resident_compute_what_kv_computes(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERSCALE_RESULTS", str(tmp_path))
    record = throughput.main(["--model", "tiny", "--concurrency", "3", "--k", "20",
                              "--repeats", "1", "--pool", "60", "--max-model-len", "4096",
                              "--slab-mib", "64", "--question-tokens", "80", "--modes",
                              "kv,resident", "--vllm-arg", "block_size=32", "--align-blocks"])
    assert record["config"]["aligned_to"] == 32
    result = record["results"]
    kv, resident = (result[m][3]["cached_tokens_median"] for m in ("kv", "resident"))
    assert kv % 32 == 0 and kv > 400
    assert resident == kv  # the chat template's tokens after the facts start a new block


def test_batch_shape_counts_schedule_calls():
    batches = [[[0.5, 2.0, 9.0, 30.0], [0.7, 2.0, 9.0, 31.0], [3.0, 11.0, 20.0, 40.0]],
               [[0.4, 1.0, 8.0, 20.0], [0.6, 1.0, 8.0, 22.0], [0.9, 1.0, 8.0, 24.0]], []]
    shape = throughput.batch_shape(batches)
    assert shape == {"last_queued_ms_median": 1.95, "first_steps_median": 1.5,
                     "last_scheduled_ms_median": 6.0, "last_first_token_ms_median": 14.0,
                     "last_token_ms_median": 32.0}
    assert throughput.batch_shape([[]])["first_steps_median"] is None
