"""Crash: a child process ingesting 10,000 facts through Memory (real engine) is killed with
SIGKILL mid-way. After a restart on the same database every fact whose add() had returned is
present, no add() is half applied, and every fact's KV is rebuilt (startup='encode').

INFERSCALE_CRASH_KILL_AFTER sets how many acknowledged facts the kill waits for (default 3,000:
it lands inside the add() call that follows, at a random moment of it).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferscale_engine.facts import MemoryHandle
from inferscale_engine.memory import Memory
from inferscale_engine.runtime.engine import Engine
from tests.conftest import greedy, max_abs_diff
from tests.engine.memory.memory_support import HashEmbedder, crash_engine_config

pytestmark = pytest.mark.vllm

REPO_ROOT = Path(__file__).resolve().parents[3]
NUM_FACTS = 10_000
BATCH = 200
KILL_AFTER = int(os.environ.get("INFERSCALE_CRASH_KILL_AFTER", "3000"))


def run_child_until_killed(db: Path, model: Path, log: Path) -> dict[int, str]:
    """Start the child, SIGKILL it after KILL_AFTER acknowledged facts (plus a random delay);
    returns the acknowledged facts, id -> text."""
    with open(log, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.engine.memory.memory_crash_child", str(db), str(model),
             str(NUM_FACTS), str(BATCH)], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=stderr,
            text=True)
        lines: list[str] = []  # the child's stdout (vLLM logs to it too)
        num_acknowledged = 0
        try:
            while num_acknowledged < KILL_AFTER:
                line = proc.stdout.readline()
                assert line and line != "DONE\n", f"child ended early: {log.read_text()[-3000:]}"
                lines.append(line)
                num_acknowledged += line.startswith("ACK ")
            time.sleep(random.Random(KILL_AFTER).uniform(0.0, 2.0))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            lines += proc.stdout.read().split("\n")[:-1]  # what it printed before dying
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    return {int(fact_id): text for fact_id, text in
            (line.rstrip("\n").split(" ", 2)[1:] for line in lines if line.startswith("ACK "))}


def test_acknowledged_facts_survive_sigkill_and_their_kv_is_rebuilt(tiny_models, tmp_path):
    model, db = tiny_models["qwen2"], tmp_path / "crash.db"
    start = time.perf_counter()
    acknowledged = run_child_until_killed(db, model, tmp_path / "child.log")
    ingest_s = time.perf_counter() - start
    assert len(acknowledged) >= KILL_AFTER

    start = time.perf_counter()
    engine = Engine(crash_engine_config(model, NUM_FACTS))
    try:
        memory = Memory(engine, db, HashEmbedder(), startup="encode", dedupe_threshold=None,
                        progress_bar=False)
        restart_s = time.perf_counter() - start
        stored = {f.fact_id: f for user in ("user-0", "user-1", "user-2", "user-3")
                  for f in memory.get_all(user_id=user)}
        # Every acknowledged fact is there, unchanged; at most the add() in flight when the
        # child died was committed too, and then entirely (one transaction per call).
        assert {i: stored[i].text for i in acknowledged} == acknowledged
        unacknowledged = sorted(set(stored) - set(acknowledged))
        assert len(unacknowledged) in (0, BATCH)
        assert all(i > max(acknowledged) for i in unacknowledged)
        # Every stored fact's KV was rebuilt.
        stats = memory.stats()
        assert stats.counters["startup_facts"] == len(stored) == stats.num_resident
        assert all(engine.is_resident(i) for i in stored)
        assert stats.engine.counters["encoded_facts"] == len(stored) + 1  # + the preamble
        # The rebuilt KV serves: a fact injected where it was encoded reproduces text mode.
        sample = random.Random(0).sample(sorted(acknowledged), 12)
        worst = 0.0
        for fact_id in sample:
            handle = MemoryHandle(stored[fact_id].user_id, (fact_id,))
            kv, text = (memory.generate(user_id=handle.user_id, query="Tell me.", handle=handle,
                                        sampling=greedy(4), mode=mode) for mode in ("kv", "text"))
            assert kv.plan_status == "inject" and kv.num_injected_tokens > 0
            assert kv.token_ids == text.token_ids
            worst = max(worst, max_abs_diff(kv.logprobs, text.logprobs))
        assert worst <= 1e-5
        memory.close()
    finally:
        engine.close()
    print(f"\n[crash] killed after {len(acknowledged)} acknowledged facts of {NUM_FACTS} "
          f"({ingest_s:.0f} s incl. start-up); store held {len(stored)} "
          f"({len(unacknowledged)} committed by the add() in flight); restart rebuilt KV of "
          f"{len(stored)} facts in {restart_s:.0f} s ({len(stored) / restart_s:.0f} facts/s incl. "
          f"engine start); kv vs text on {len(sample)} facts: max |dlogprob| {worst:.1e}")
