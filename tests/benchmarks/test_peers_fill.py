"""peers.py's mem0 fills: a store per episode, side by side, and going on after a stop.

The worker here stands in for mem0's worker process (peers_mem0_worker.py, which needs mem0's
own venv): these tests check the harness's bookkeeping (which sessions are added, under which
attempt and user, what the records say), not mem0. The real worker runs in peers.py's tiny-model
runs (docs/benchmarks.md#side-by-side-with-mem0).
"""

from __future__ import annotations

import argparse
import io
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from benchmarks.locomo_data import MemoryFact, Question
from benchmarks.peers import read_records
from benchmarks.peers_arms import InferScaleArm, Mem0Arm
from benchmarks.peers_data import Episode, Session
from benchmarks.peers_run import fill_side_by_side, fill_store, resumable


class RecordingWorker:
    """Answers 'add' as mem0's worker does (one stored memory per message), logging each."""

    def __init__(self, log: list[tuple[str, str, str]], episode_id: str,
                 fail_on: str | None = None, hold: threading.Event | None = None,
                 held: threading.Event | None = None) -> None:
        """fail_on: the add text it dies on (once `held` is set); hold: its adds wait until
        it is killed (setting `held` as they start)."""
        self.log, self.episode_id, self.fail_on = log, episode_id, fail_on
        self.hold, self.held = hold, held
        self.closed = self.killed = False

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        text = fields["messages"][0]["content"] if op == "add" else ""
        if op == "add" and self.hold is not None:
            assert self.held is not None
            self.held.set()
            if not self.hold.wait(10):
                raise RuntimeError("never killed")
        if self.killed:
            raise RuntimeError("mem0's worker died")
        if op == "add" and text == self.fail_on:
            assert self.held is None or self.held.wait(10)
            raise RuntimeError("mem0's worker died during 'add'")
        self.log.append((self.episode_id, fields.get("user_id", ""), text))
        return {"ok": True, "seconds": 0.01, "logged": [], "llm_calls": [],
                "results": [{"event": "ADD"} for _ in fields.get("messages", ())]}

    def kill(self) -> None:
        self.killed = True
        if self.hold is not None:
            self.hold.set()

    def close(self) -> None:
        self.closed = True


def episode(episode_id: str, sessions: int) -> Episode:
    facts = [MemoryFact(f"{episode_id} session {s}", f"session {s}", (f"D{s}:1",))
             for s in range(sessions)]
    return Episode(episode_id, tuple(Session(f"{s} May 2023", (f,), (f,)) for s, f in
                                     enumerate(facts)),
                   (Question(0, 4, "What happened?", "things", ("D0:1",)),))


def settings(workers: int = 1) -> argparse.Namespace:
    return argparse.Namespace(fill_workers=workers, turns_per_add=0, facts_per_add=0)


def mem0_arm(root: Path, log: list, **worker: Any) -> Mem0Arm:
    return Mem0Arm("mem0-raw", lambda e: RecordingWorker(log, e, **worker), False, 0, 0, root)


def records_of(path: Path) -> dict[str, Any]:
    return read_records(path, argparse.Namespace(data="locomo", model="tiny", dtype="float32",
                                                 k=20, max_tokens=20, turns_per_add=0,
                                                 facts_per_add=0, mem0_max_tokens=None,
                                                 hints=True, paste_layout="server",
                                                 max_sessions=0))


def write(path: Path, lines: list[dict]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_stopped_fill_goes_on_with_its_attempt_and_user(tmp_path):
    log: list = []
    arm, ep, out = mem0_arm(tmp_path / "mem0-raw", log), episode("conv-1", 3), tmp_path / "r.jsonl"
    arm.use(ep.episode_id)
    with open(out, "w") as f:
        user = fill_store(settings(), arm, ep, "A", records_of(out), f)
    assert user == "conv-1:A" and arm.filling("conv-1") == "A"
    # the run stopped during session 2: its add and the episode's end never reached the record
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    write(out, [x for x in lines if x["type"] != "ingested" and x.get("session") != 2])
    assert resumable(settings(), arm, "conv-1", records_of(out)) == ("A", frozenset({0, 1}))
    log.clear()
    with open(out, "a") as f:
        again = fill_store(settings(), arm, ep, "B", records_of(out), f)
    assert again == "conv-1:A"
    assert log == [("conv-1", "conv-1:A", "conv-1 session 2")]
    records = records_of(out)
    assert records["ingested"][("mem0-raw", "conv-1")]["attempt"] == "A"
    assert sorted(c["session"] for c in records["calls"][("mem0-raw", "conv-1", "A")]) == [0, 1, 2]


def test_a_fill_starts_over_where_nothing_of_it_is_recorded(tmp_path):
    log: list = []
    arm, ep = mem0_arm(tmp_path / "mem0-raw", log), episode("conv-1", 2)
    arm.begin("conv-1", "A")  # a store on disk whose adds this results file never saw
    empty = records_of(tmp_path / "none.jsonl")
    assert resumable(settings(), arm, "conv-1", empty) == (None, frozenset())
    arm.use("conv-1")
    user = fill_store(settings(), arm, ep, "B", empty, io.StringIO())
    assert user == "conv-1:B" and arm.filling("conv-1") == "B" and len(log) == 2
    chunked = argparse.Namespace(fill_workers=1, turns_per_add=4, facts_per_add=0)
    assert resumable(chunked, arm, "conv-1", empty) == (None, frozenset())
    server = InferScaleArm("inferscale-kv", None, "kv", 0)  # type: ignore[arg-type]
    assert resumable(settings(), server, "conv-1", empty) == (None, frozenset())


def test_side_by_side_fills_each_store_once_with_its_own_worker(tmp_path):
    log: list = []
    arm, out = mem0_arm(tmp_path / "mem0-raw", log), tmp_path / "r.jsonl"
    episodes = [episode(f"conv-{i}", 3) for i in range(3)]
    pending = {(e.episode_id, 0): ["mem0-raw"] for e in episodes}
    records = records_of(out)
    records["ingested"][("mem0-raw", "conv-2")] = {"attempt": "old", "user_id": "conv-2:old"}
    with open(out, "w") as f:
        fill_side_by_side(settings(2), episodes, {"mem0-raw": arm}, records, pending, "A", f)
    assert sorted(log) == sorted((f"conv-{i}", f"conv-{i}:A", f"conv-{i} session {s}")
                                 for i in (0, 1) for s in range(3))
    assert records["ingested"][("mem0-raw", "conv-0")] == {"attempt": "A", "user_id": "conv-0:A"}
    written = records_of(out)
    assert set(written["ingested"]) == {("mem0-raw", "conv-0"), ("mem0-raw", "conv-1")}
    adds = [json.loads(x) for x in out.read_text().splitlines() if '"add"' in x]
    assert len(adds) == 6 and {a["side_by_side"] for a in adds} == {2}
    assert [p.name for p in sorted((tmp_path / "mem0-raw").iterdir())] == ["conv-0", "conv-1"]


def test_a_failed_fill_ends_the_adds_in_flight(tmp_path):
    log: list = []
    held = threading.Event()
    workers: list[RecordingWorker] = []

    def open_worker(episode_id: str) -> RecordingWorker:
        if episode_id == "conv-0":  # dies on its first add, once conv-1's add is under way
            workers.append(RecordingWorker(log, episode_id, fail_on="conv-0 session 0",
                                           held=held))
        else:  # its add waits until the fill kills it
            workers.append(RecordingWorker(log, episode_id, hold=threading.Event(), held=held))
        return workers[-1]

    arm = Mem0Arm("mem0-raw", open_worker, False, 0, 0, tmp_path / "mem0-raw")
    episodes = [episode("conv-0", 2), episode("conv-1", 2)]
    pending = {(e.episode_id, 0): ["mem0-raw"] for e in episodes}
    with pytest.raises(RuntimeError, match="died"):
        fill_side_by_side(settings(2), episodes, {"mem0-raw": arm}, records_of(
            tmp_path / "r.jsonl"), pending, "A", io.StringIO())
    assert [w.killed for w in workers if w.episode_id == "conv-1"] == [True]
    assert not any(entry[0] == "conv-1" for entry in log)
