"""benchmarks/pooled_ratios.py: round ratios pooled over records, and honest verdicts.

Records are written the way ttft.py writes them (raw_ms per mode and k, JSON string keys), with
round times chosen so that each k's ratios are known: the verdict must follow the interval
(met / not met / undecided), pooling must add the rounds, and records of another round order
must not be pooled with them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from benchmarks import pooled_ratios
from benchmarks.common import median_interval
from benchmarks.ttft import paired_ratio


def write_ttft(path: Path, ratios: dict[int, list[float]], predecessor: str = "uniform",
               **workload) -> Path:
    resident = {str(k): [10.0 + i for i in range(len(r))] for k, r in ratios.items()}
    kv = {str(k): [b * x for b, x in zip(resident[str(k)], r, strict=True)]
          for k, r in ratios.items()}
    block_size = workload.pop("block_size", None)
    record = {"benchmark": "ttft",
              "config": {"model": "tiny", "predecessor": predecessor, **workload},
              "engine_config": {"block_size": block_size},
              "raw_ms": {"kv": kv, "resident": resident, "text": kv}}
    path.write_text(json.dumps(record))
    return path


def test_verdicts_follow_the_interval_and_pooling_adds_rounds(tmp_path):
    rng = random.Random(3)
    spread = [rng.uniform(-0.02, 0.02) for _ in range(30)]
    ratios = {0: [1.00 + s for s in spread], 50: [1.10 + s for s in spread],
              100: [1.05 + s for s in spread]}  # under, over and around the target
    paths = [write_ttft(tmp_path / f"ttft-{i}.json", ratios) for i in range(2)]
    record = pooled_ratios.main([*map(str, paths), "--target", "1.05", "--no-record"])
    (group,) = record["groups"].values()
    k = group["k"]
    assert [k[x]["pooled"]["verdict"] for x in ("0", "50", "100")] == [
        "met", "not met", "undecided"]
    assert k["50"]["pooled"]["n"] == 60 and len(k["50"]["per_record"]) == 2
    pooled = k["50"]["pooled"]
    assert pooled["ci95_low"] <= pooled["median"] <= pooled["ci95_high"]
    assert pooled["median"] == pytest.approx(1.10, abs=0.01)
    floor = pooled_ratios.main([*map(str, paths), "--target", "1.05", "--at-least",
                                "--no-record"])
    (group,) = floor["groups"].values()
    assert [group["k"][x]["pooled"]["verdict"] for x in ("0", "50", "100")] == [
        "not met", "met", "undecided"]


def test_records_of_another_round_order_are_not_pooled(tmp_path):
    ratios = {10: [1.0, 1.1, 1.2]}
    paths = [write_ttft(tmp_path / "a.json", ratios, "uniform"),
             write_ttft(tmp_path / "b.json", ratios, "same")]
    record = pooled_ratios.main([*map(str, paths), "--no-record"])
    assert sorted(record["groups"]) == ["tiny --predecessor same", "tiny --predecessor uniform"]


def test_records_of_another_workload_are_not_pooled(tmp_path):
    ratios = {10: [1.0, 1.1, 1.2]}
    paths = [write_ttft(tmp_path / "a.json", ratios, facts="synthetic"),
             write_ttft(tmp_path / "b.json", ratios, facts="locomo"),
             write_ttft(tmp_path / "c.json", ratios, facts="synthetic", block_size=64,
                        align_blocks=True),
             write_ttft(tmp_path / "d.json", ratios)]
    record = pooled_ratios.main([*map(str, paths), "--no-record"])
    assert {name: group["records"] for name, group in record["groups"].items()} == {
        "tiny --predecessor uniform": ["a.json", "d.json"],
        "tiny --predecessor uniform --facts locomo": ["b.json"],
        "tiny --predecessor uniform --block-size 64 --align-blocks": ["c.json"]}


def test_a_record_without_the_modes_is_refused(tmp_path):
    path = write_ttft(tmp_path / "a.json", {10: [1.0, 1.1]})
    with pytest.raises(SystemExit, match="no 'ceiling' samples"):
        pooled_ratios.main([str(path), "--denominator", "ceiling", "--no-record"])


def test_the_median_interval_narrows_with_rounds_and_is_reproducible():
    rng = random.Random(5)
    few = [1.0 + rng.gauss(0, 0.05) for _ in range(10)]
    many = few + [1.0 + rng.gauss(0, 0.05) for _ in range(190)]
    width = lambda s: median_interval(s)[1] - median_interval(s)[0]  # noqa: E731
    assert width(many) < width(few)
    assert median_interval(many) == median_interval(list(many))  # fixed seed
    assert median_interval([1.2]) == (1.2, 1.2)
    ratio = paired_ratio([11.0, 12.0, 13.0], [10.0, 10.0, 10.0])
    assert ratio["median"] == pytest.approx(1.2)
    assert ratio["ci95_low"] <= ratio["median"] <= ratio["ci95_high"]
