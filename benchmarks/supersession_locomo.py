"""What automatic supersession by similarity would hide on real conversations (LoCoMo dev).

Each dev conversation's facts (observations or turns) are added in the order they were said;
with Memory's supersede_threshold T, a fact is superseded as soon as a later fact's embedding
has cosine >= T with its own. Reported per T: the share of facts superseded, and the share of
the gold evidence of the conversation's questions that would no longer be served. Embeddings
only (the default all-MiniLM-L6-v2); no model runs. The dev fold only (locomo_protocol.fold).

  python benchmarks/supersession_locomo.py --facts turns
  python benchmarks/supersession_locomo.py --facts observation

Writes one JSON record (benchmarks/out by default).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import environment, write_tagged  # noqa: E402
from benchmarks.locomo_data import DEFAULT_DATA, load_conversations  # noqa: E402
from benchmarks.locomo_protocol import fold  # noqa: E402


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--facts", default="turns", choices=("turns", "observation"))
    parser.add_argument("--thresholds", default="0.4,0.5,0.6,0.7,0.8,0.9")
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)

    from inferscale_engine.memory.config import DEFAULT_EMBEDDING_MODEL
    from inferscale_engine.memory.search.embedder import Embedder

    embedder = Embedder(DEFAULT_EMBEDDING_MODEL)
    thresholds = [float(t) for t in args.thresholds.split(",")]
    totals = {t: {"facts": 0, "superseded": 0, "evidence": 0, "evidence_hidden": 0}
              for t in thresholds}
    for conversation in fold(load_conversations(Path(args.data), facts=args.facts), "dev"):
        vectors = embedder.encode([f.text for f in conversation.facts])
        similarity = vectors @ vectors.T
        sources = {s for f in conversation.facts for s in f.source_ids}
        evidence = {e for q in conversation.questions for e in q.evidence if e in sources}
        for t in thresholds:
            later = (similarity >= t).triu(diagonal=1).any(dim=1).tolist()
            hidden = {s for f, gone in zip(conversation.facts, later, strict=True) if gone
                      for s in f.source_ids}
            row = totals[t]
            row["facts"] += len(later)
            row["superseded"] += sum(later)
            row["evidence"] += len(evidence)
            row["evidence_hidden"] += len(evidence & hidden)
    results = {str(t): {**row, "superseded_share": row["superseded"] / row["facts"],
                        "evidence_hidden_share": row["evidence_hidden"] / row["evidence"]}
               for t, row in totals.items()}
    record = {"benchmark": "supersession_locomo", "config": vars(args),
              "environment": environment(), "results": results}
    path = write_tagged(f"supersession-locomo-{args.facts}", args.tag, record)
    for t, row in results.items():
        print(f"{args.facts} T={t}: facts superseded {row['superseded_share']:.1%}, gold "
              f"evidence hidden {row['evidence_hidden_share']:.1%} ({row['evidence_hidden']}/"
              f"{row['evidence']})")
    print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
