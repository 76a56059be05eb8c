"""Quality vs speed: every LoCoMo arm's F1 next to its TTFT, one table and one plot.

F1 comes from locomo.py summary records (dev and, once run, test); TTFT from ttft.py records
measured with the matching modes (text, kv, kv-userR, kv-endR, kv-alsoR, text-userR, text-endR)
on the CPU (the 0.5B) and on the H200 (Llama-3.1-8B geometry, dummy weights: TTFT depends only
on token counts). An arm's TTFT mode drops its W and key scale (encoding-time settings).

  python benchmarks/pareto.py --dev results/locomo-...-dev.json --ttft-cpu results/ttft-....json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import RESULTS_DIR  # noqa: E402


def ttft_mode(arm: str) -> str:
    """The ttft.py mode an arm is timed as: kv-w64-a0.9-user4 and kv-w256r512-user4 -> kv-user4."""
    return re.sub(r"^kv-[ws]\d+(?:r\d+)?(?:-a[\d.]+)?", "kv", arm)


def load(path: str | None) -> dict[str, Any] | None:
    return json.loads(Path(path).read_text()) if path else None


def f1s(record: dict[str, Any] | None) -> dict[str, float]:
    if record is None:
        return {}
    overall = record["summary"]["overall"]
    return {key[3:]: value * (100 if value <= 1 else 1) for key, value in overall.items()
            if key.startswith("f1_")}


def ttfts(record: dict[str, Any] | None, k: int) -> dict[str, float]:
    if record is None:
        return {}
    summary = record.get("summary", {})
    entry = summary.get(str(k)) or summary.get(k) or {}
    return {mode: value["median_ms"] for mode, value in entry.items()
            if isinstance(value, dict) and "median_ms" in value}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dev", required=True, action="append",
                        help="locomo.py summary JSON, dev fold (repeatable: later files win)")
    parser.add_argument("--test", action="append", default=[],
                        help="locomo.py summary JSON, test fold (repeatable)")
    parser.add_argument("--ttft-cpu", default=None, help="ttft.py record, CPU")
    parser.add_argument("--ttft-gpu", default=None, help="ttft.py record, H200")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "pareto.png")
    args = parser.parse_args(argv)
    dev = {arm: f1 for path in args.dev for arm, f1 in f1s(load(path)).items()}
    test = {arm: f1 for path in args.test for arm, f1 in f1s(load(path)).items()}
    cpu, gpu = load(args.ttft_cpu), load(args.ttft_gpu)
    rows = []
    for arm in dev:
        mode = ttft_mode(arm)
        rows.append({"arm": arm, "dev_f1": dev[arm], "test_f1": test.get(arm),
                     **{f"{where}_k{k}_ms": ttfts(record, k).get(mode)
                        for where, record in (("cpu", cpu), ("h200", gpu)) for k in (20, 50)}})
    print("| arm | dev F1 | test F1 | CPU TTFT k=20 | CPU k=50 | H200 TTFT k=20 | H200 k=50 |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        cells = [_fmt(row[c]) for c in ("dev_f1", "test_f1", "cpu_k20_ms", "cpu_k50_ms",
                                        "h200_k20_ms", "h200_k50_ms")]
        print(f"| {row['arm']} | " + " | ".join(cells) + " |")
    _plot(rows, args.out)
    return rows


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _plot(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in ((axes[0], "cpu_k20_ms", "CPU (0.5B, 2 cores), k=20"),
                           (axes[1], "h200_k50_ms", "H200 (Llama-3.1-8B geometry), k=50")):
        shown = [r for r in rows if r[key] is not None]
        for row in shown:
            colour = "tab:orange" if row["arm"].startswith("text") else "tab:blue"
            ax.scatter(row[key], row["dev_f1"], color=colour)
            ax.annotate(row["arm"], (row[key], row["dev_f1"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("TTFT (ms, median)")
        ax.set_ylabel("LoCoMo dev F1 (x100)")
        ax.set_title(title if shown else title + " (not measured)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
