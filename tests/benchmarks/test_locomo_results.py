"""The results JSONL of benchmarks/locomo.py: resumable records, old files, settings check."""

from __future__ import annotations

import json

import pytest

from benchmarks.locomo import RESULT_KEYS, parse_args, read_results


def write(path, records, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def test_read_results_merges_both_formats_and_skips_a_cut_line(tmp_path):
    args = parse_args(["--summarize-only"])
    config = {"type": "config", "config": {k: getattr(args, k) for k in RESULT_KEYS}}
    old = {"type": "question", "conversation": "conv-26", "index": 3, "category": 1,
           "gold": "x", "recall": 1.0,
           "modes": {"text": {"answer": "x"}, "kv-w64": {"answer": "y"}}}
    new = {"type": "question", "conversation": "conv-30", "index": 5, "category": 4,
           "gold": "z", "recall": None}
    answers = [{"type": "answer", "conversation": "conv-30", "index": 5, "arm": arm,
                "answer": arm} for arm in ("text", "kv-w0")]
    path = tmp_path / "r.jsonl"
    write(path, [config, old, new, *answers], tail='{"type": "answer", "conv')
    results = read_results(path, args)
    assert set(results.questions) == {("conv-26", 3), ("conv-30", 5)}
    assert "modes" not in results.questions[("conv-26", 3)]
    assert results.answers[("conv-26", 3)]["kv-w64"]["answer"] == "y"
    assert set(results.answers[("conv-30", 5)]) == {"text", "kv-w0"}
    assert results.arm_names == ["text", "kv-w64", "kv-w0"]


def test_read_results_refuses_a_file_of_other_settings(tmp_path):
    args = parse_args(["--summarize-only"])
    config = {k: getattr(args, k) for k in RESULT_KEYS}
    path = tmp_path / "r.jsonl"
    write(path, [{"type": "config", "config": {**config, "k": args.k + 1}}])
    with pytest.raises(SystemExit, match="other settings"):
        read_results(path, args)
    assert read_results(tmp_path / "missing.jsonl", args).questions == {}


def test_arguments():
    assert parse_args([]).split == "dev"
    assert [a.name for a in parse_args(["--arms", "kv-w64,text"]).arm_list] == ["text", "kv-w64"]
    adhoc = parse_args(["--conversations", "conv-26"])
    assert adhoc.split is None
    with pytest.raises(SystemExit):
        parse_args(["--split", "dev", "--conversations", "conv-26"])
    with pytest.raises(SystemExit):
        parse_args(["--arms", "kv-64"])
