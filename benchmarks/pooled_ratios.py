"""A TTFT ratio pooled over ttft.py records: is a target met beyond the noise?

One start of a GPU machine gives ~30 rounds per k, and the per-round ratios of kv to its
ceiling spread by ~0.1, so one record's median moves by a few hundredths between starts. This
reads ttft.py records (several starts, the same settings), takes each round's ratio of two modes
(the numerator's wall time over the denominator's in the same round), and prints per k the
median with a bootstrap 95% interval, per record and pooled over the records of one model and
round order, with a verdict against --target: `met` (the interval lies at or below it, or at or
above it with --at-least), `not met` (wholly on the other side) or `undecided` (it spans the
target). Writes one JSON record; asserts nothing.

  python benchmarks/pooled_ratios.py benchmarks/results/h200-20261204*/ttft-*-h200-*.json \\
      --target 1.05 --tag issue13
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import environment, write_tagged  # noqa: E402
from benchmarks.ttft import paired_ratio  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", nargs="+", type=Path, help="ttft.py JSON records")
    parser.add_argument("--numerator", default="kv")
    parser.add_argument("--denominator", default="resident")
    parser.add_argument("--target", type=float, default=1.05,
                        help="the ratio must be at most this (--at-least: at least this)")
    parser.add_argument("--at-least", action="store_true",
                        help="the target is a floor (e.g. text/kv >= 3), not a ceiling")
    parser.add_argument("--tag", default="")
    parser.add_argument("--no-record", action="store_true", help="print only, write no JSON")
    return parser.parse_args(argv)


def rounds(record: dict[str, Any], numerator: str, denominator: str
           ) -> dict[str, tuple[list[float], list[float]]]:
    """Per k (as the record spells it), the timed rounds' numerator and denominator times."""
    raw = record["raw_ms"]
    for mode in (numerator, denominator):
        if mode not in raw:
            raise SystemExit(f"a record has no {mode!r} samples (modes: {sorted(raw)})")
    return {k: (raw[numerator][k], raw[denominator][k])
            for k in raw[numerator] if raw[numerator][k] and k in raw[denominator]}


def verdict(low: float, high: float, target: float, at_least: bool = False) -> str:
    """met / not met / undecided for the interval [low, high] against the target."""
    if at_least:
        return "met" if low >= target else "not met" if high < target else "undecided"
    return "met" if high <= target else "not met" if low > target else "undecided"


def summary(numerators: list[float], denominators: list[float], target: float,
            at_least: bool) -> dict[str, Any]:
    """ttft.py's paired ratio (median, quartiles, 95% interval) and its verdict."""
    paired = paired_ratio(numerators, denominators)
    return {**paired, "verdict": verdict(paired["ci95_low"], paired["ci95_high"], target,
                                         at_least)}


def pool(paths: list[Path], numerator: str, denominator: str, target: float,
         at_least: bool = False) -> dict[str, dict[str, Any]]:
    """Groups of records (one model, round order and workload each): per k, each record, pool."""
    groups: dict[str, dict[str, Any]] = {}
    for path in paths:
        record = json.loads(path.read_text())
        if record.get("benchmark", "ttft") != "ttft" or "raw_ms" not in record:
            raise SystemExit(f"{path} is not a ttft.py record")
        config = record["config"]
        # records pool only with records of the same workload: facts, block size, alignment
        block = record.get("engine_config", {}).get("block_size")
        name = (f"{config['model']} --predecessor {config.get('predecessor', 'mixed')}"
                + (f" --facts {config['facts']}" if config.get("facts", "synthetic")
                   != "synthetic" else "")
                + (f" --block-size {block}" if block else "")
                + (" --align-blocks" if config.get("align_blocks") else ""))
        group = groups.setdefault(name, {"records": [], "k": {}})
        group["records"].append(path.name)
        for k, (nums, dens) in rounds(record, numerator, denominator).items():
            entry = group["k"].setdefault(k, {"per_record": [], "nums": [], "dens": []})
            entry["per_record"].append(summary(nums, dens, target, at_least))
            entry["nums"].extend(nums)
            entry["dens"].extend(dens)
    for group in groups.values():
        for entry in group["k"].values():
            entry["pooled"] = summary(entry.pop("nums"), entry.pop("dens"), target, at_least)
        group["k"] = dict(sorted(group["k"].items(), key=lambda item: int(item[0])))
    return groups


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    groups = pool(args.records, args.numerator, args.denominator, args.target, args.at_least)
    ratio = f"{args.numerator}/{args.denominator}"
    for name, group in groups.items():
        print(f"\n{name}: {ratio} over {len(group['records'])} records (target "
              f"{'>=' if args.at_least else '<='} {args.target})")
        print("| k | pooled median [95% interval] | rounds | verdict | per record |")
        print("|---|---|---|---|---|")
        for k, entry in group["k"].items():
            pooled = entry["pooled"]
            each = ", ".join(f"{e['median']:.3f} [{e['ci95_low']:.3f}-{e['ci95_high']:.3f}]"
                             for e in entry["per_record"])
            print(f"| {k} | {pooled['median']:.3f} [{pooled['ci95_low']:.3f}-"
                  f"{pooled['ci95_high']:.3f}] | {pooled['n']} | {pooled['verdict']} | {each} |")
    record = {"benchmark": "pooled_ratios", "config": {**vars(args), "records": [
        str(p) for p in args.records]}, "environment": environment(), "groups": groups}
    if not args.no_record:
        write_tagged("pooled_ratios", args.tag, record)
    return record


if __name__ == "__main__":
    main()
