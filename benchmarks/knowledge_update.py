"""Knowledge updates: does the memory answer what is true now, or a value that was superseded?

The synthetic, seeded dev set of ku_data.py (users whose city, employer, dog, car, sport and
language change one to three times, among stable facts and chatter). Each arm builds its own
Memory over one shared Engine, adds every user's facts in the order they were said, then asks
every question through Memory.generate (k facts retrieved, greedy) in kv and in text mode.

Arms (how facts are added; each answered in kv and text mode):
  plain      Memory.add(texts=[...]) one session at a time: every version is kept, the model
             has to work out which is current
  dated      the same with timestamp= the session's day; "as of" questions pass as_of= that
             date (the facts true then)
  supersede  an app that keeps its facts as slots (a profile field per attribute): a new value
             goes through Memory.supersede, the old one is kept as history; dated, as_of
  tau0.4, tau0.5  dated, with Memory(supersede_threshold=0.4 / 0.5): a new fact supersedes
             the user's facts whose embeddings are at least that similar
  infer      Memory.add(infer=True) with the session's facts as the user's messages: the served
             model extracts facts and adds, supersedes or ends stored ones (mem0's
             consolidation); dated, as_of

Per arm and mode: the share of answers naming the value true now (or at the date asked), the
share naming a superseded value, for "now" and "as of" questions apart (--date-facts: every
fact served with its date; --no-as-of: the "as of" questions asked without as_of=, so that only
the dates in the facts tell the model which was true then); the time each add took
per fact (p50 / p99) and the ingest total. This is the set the memory semantics are tuned on;
they are judged on public knowledge-update data this repository does not hold.

  python benchmarks/knowledge_update.py --model small --arms plain,infer
  python benchmarks/knowledge_update.py --model tiny --users 2 --arms plain   # a smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (  # noqa: E402
    RESULTS_DIR,
    environment,
    resolve_model,
    summarize,
    write_tagged,
)
from benchmarks.ku_data import KUFact, Scenario, scenarios, score  # noqa: E402
from inferscale_engine.prompting.layout import QUALITY_LAYOUT  # noqa: E402

MODES = ("kv", "text")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small")
    parser.add_argument("--users", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--k", type=int, default=10, help="facts retrieved per question")
    parser.add_argument("--arms", default="plain,infer")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--slab-mib", type=int, default=512)
    parser.add_argument("--embedder", default=None, help="default: the offline all-MiniLM-L6-v2")
    parser.add_argument("--workdir", default=None, help="where each arm's store and answers "
                        "are kept, so that a rerun resumes (default: under benchmarks/out)")
    parser.add_argument("--layout", default="rank", choices=sorted(LAYOUTS),
                        help="rank: facts by relevance; chrono: the memory block in the "
                        "order the facts were added, the repaired ones by relevance; time: "
                        "every fact in the order it was added, the newest nearest the question "
                        "(answers kept apart per layout; the stores are shared)")
    parser.add_argument("--hide-older-versions", default="now",
                        choices=("now", "always", "never"),
                        help="Memory's hide_older_versions (search/versions.py): answers kept "
                        "apart per value, the stores shared")
    parser.add_argument("--date-facts", action="store_true",
                        help="Memory(date_facts=True): each fact served as '[8 May 2023] ...' "
                        "(answers kept apart; the stores shared, their token ids recomputed)")
    parser.add_argument("--no-as-of", dest="as_of", action="store_false",
                        help="ask the dated arms' 'as of' questions without as_of= (the date "
                        "only in the question's words)")
    parser.add_argument("--neighbor-share", type=float, default=0.0,
                        help="Memory(neighbor_share=...): part of k given to the facts added "
                             "beside the best ones (search/neighbors.py)")
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    if unknown := set(args.arms.split(",")) - set(INGEST):
        parser.error(f"unknown arms {sorted(unknown)}; choose from {', '.join(INGEST)}")
    return args


def sessions_of(scenario: Scenario) -> list[list[KUFact]]:
    """The user's facts grouped by the day they were said, in order."""
    out: list[list[KUFact]] = []
    for fact in scenario.facts:
        if out and out[-1][0].date == fact.date:
            out[-1].append(fact)
        else:
            out.append([fact])
    return out


def add_plain(memory: Any, user_id: str, session: list[KUFact]) -> None:
    memory.add(user_id=user_id, texts=[f.text for f in session])


def add_dated(memory: Any, user_id: str, session: list[KUFact]) -> None:
    memory.add(user_id=user_id, texts=[f.text for f in session], timestamp=session[0].date)


def add_infer(memory: Any, user_id: str, session: list[KUFact]) -> None:
    memory.add(user_id=user_id, infer=True, timestamp=session[0].date,
               messages=[{"role": "user", "content": f.text} for f in session])


_SLOTS: dict[tuple[str, str], int] = {}
"""(user, slot) -> the fact that holds it now (the supersede arm's app state)."""


def add_supersede(memory: Any, user_id: str, session: list[KUFact]) -> None:
    """An app that keeps its facts as slots (a profile): a new value supersedes the old one."""
    plain = [f for f in session if f.slot is None or (user_id, f.slot) not in _SLOTS]
    for fact in session:
        if fact.slot is not None and (user_id, fact.slot) in _SLOTS:
            new = memory.supersede(user_id=user_id, fact_id=_SLOTS[user_id, fact.slot],
                                   text=fact.text, timestamp=fact.date)
            _SLOTS[user_id, fact.slot] = new.fact_id
    if plain:
        added = memory.add(user_id=user_id, texts=[f.text for f in plain],
                           timestamp=session[0].date, dedupe=False)
        for fact, result in zip(plain, added, strict=True):
            if fact.slot is not None:
                _SLOTS[user_id, fact.slot] = result.fact_id


LAYOUTS = {"rank": dataclasses.replace(QUALITY_LAYOUT, fact_order="handle",
                                       repair_order="rank"),
           "chrono": dataclasses.replace(QUALITY_LAYOUT, fact_order="added",
                                         repair_order="rank"),
           "time": dataclasses.replace(QUALITY_LAYOUT, fact_order="added",
                                       repair_order="handle")}
"""Prompt layouts the questions can be asked with (--layout)."""


INGEST: dict[str, Callable[[Any, str, list[KUFact]], None]] = {
    "plain": add_plain, "dated": add_dated, "supersede": add_supersede,
    "tau0.4": add_dated, "tau0.5": add_dated, "infer": add_infer}
DATED = {"dated", "supersede", "tau0.4", "tau0.5", "infer"}
"""Arms whose facts carry the day they were said; their "as of" questions pass as_of."""


def run_arm(engine: Any, args: argparse.Namespace, arm: str, users: list[Scenario],
            folder: Path) -> dict[str, Any]:
    """Add every user's facts (unless an earlier run finished that), then ask what is not
    answered yet; answers are appended to <arm>.jsonl as they come."""
    from vllm import SamplingParams

    from inferscale_engine import Memory

    layout = LAYOUTS[args.layout]
    done_marker = folder / f"{arm}.ingested.json"
    variant = "".join([f".{args.layout}" if args.layout != "rank" else "",
                       f".versions-{args.hide_older_versions}"
                       if args.hide_older_versions != "now" else "",
                       ".dates" if args.date_facts else "",
                       ".no-as-of" if not args.as_of else "",
                       f".neighbors-{args.neighbor_share:g}" if args.neighbor_share else ""])
    answers_path = folder / f"{arm}{variant}.jsonl"
    answers = ([json.loads(line) for line in answers_path.read_text().splitlines() if line]
               if answers_path.exists() else [])
    asked = {(a["question_id"], a["mode"]) for a in answers}
    if not done_marker.exists():
        (folder / f"{arm}.db").unlink(missing_ok=True)
    threshold = float(arm[3:]) if arm.startswith("tau") else None
    with Memory(engine, folder / f"{arm}.db", args.embedder, progress_bar=False,
                supersede_threshold=threshold,
                hide_older_versions=args.hide_older_versions,
                date_facts=args.date_facts, neighbor_share=args.neighbor_share) as memory:
        if not done_marker.exists():
            done_marker.write_text(json.dumps(ingest(memory, arm, users)))
        ingested = json.loads(done_marker.read_text())
        greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
        with answers_path.open("a") as out:
            for scenario in users:
                for question in scenario.questions:
                    for mode in MODES:
                        if (question.question_id, mode) in asked:
                            continue
                        as_of = question.as_of if arm in DATED and args.as_of else None
                        reply = memory.generate(user_id=scenario.user_id, query=question.text,
                                                k=args.k, sampling=greedy, mode=mode,
                                                as_of=as_of, layout=layout)
                        row = {"question_id": question.question_id, "mode": mode,
                               "kind": "then" if question.as_of else "now",
                               "answer": reply.text, **score(reply.text, question)}
                        answers.append(row)
                        out.write(json.dumps(row) + "\n")
                        out.flush()
        counters = dict(memory.counters)
    return {**ingested, "answers": answers, "rates": rates(answers), "counters": counters}


def ingest(memory: Any, arm: str, users: list[Scenario]) -> dict[str, Any]:
    """Add every user's facts, a session at a time; how long it took and what was stored."""
    per_fact_ms: list[float] = []
    start = time.perf_counter()
    for scenario in users:
        for session in sessions_of(scenario):
            t0 = time.perf_counter()
            INGEST[arm](memory, scenario.user_id, session)
            per_fact_ms.extend([(time.perf_counter() - t0) * 1e3 / len(session)] * len(session))
    seconds = time.perf_counter() - start
    stored = sum(len(memory.get_all(user_id=s.user_id)) for s in users)
    print(f"[{arm}] {len(per_fact_ms)} facts added in {seconds:.0f} s, {stored} stored",
          flush=True)
    return {"ingest_seconds": seconds, "stored_facts": stored,
            "add_ms_per_fact": summarize(per_fact_ms)}


def rates(answers: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per mode and question kind: the share naming the current value, and a stale one."""
    out: dict[str, dict[str, float]] = {}
    for mode in MODES:
        for kind in ("now", "then", "all"):
            rows = [a for a in answers if a["mode"] == mode and kind in ("all", a["kind"])]
            if rows:
                out[f"{mode}/{kind}"] = {
                    "questions": len(rows),
                    "current": sum(a["current"] for a in rows) / len(rows),
                    "stale": sum(a["stale"] for a in rows) / len(rows)}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from inferscale_engine import Engine, EngineConfig

    args = parse_args(argv)
    users = scenarios(args.users, args.seed)
    model, dtype, load_format = resolve_model(args.model)
    engine = Engine(EngineConfig(model=model, dtype=dtype, load_format=load_format,
                                 slab_capacity_bytes=args.slab_mib * 2**20))
    results: dict[str, Any] = {}
    record = {"benchmark": "knowledge_update", "config": vars(args),
              "environment": environment(), "questions": sum(len(s.questions) for s in users),
              "facts": sum(len(s.facts) for s in users), "results": results}
    path = write_tagged(f"knowledge_update-{args.model}", args.tag, record)
    folder = Path(args.workdir or RESULTS_DIR / "knowledge_update" /
                  f"{args.model}-seed{args.seed}-users{args.users}-k{args.k}")
    folder.mkdir(parents=True, exist_ok=True)
    try:
        for arm in args.arms.split(","):
            results[arm] = run_arm(engine, args, arm, users, folder)
            path.write_text(json.dumps(record, indent=1, default=str))  # each arm as it ends
    finally:
        engine.close()
    print("\n| arm | mode | now: current | now: stale | as of: current | as of: stale | "
          "add ms/fact p50 | p99 |")
    print("|---|---|---|---|---|---|---|---|")
    for arm, entry in results.items():
        for mode in MODES:
            now, then = entry["rates"][f"{mode}/now"], entry["rates"].get(f"{mode}/then", {})
            print(f"| {arm} | {mode} | {now['current']:.0%} | {now['stale']:.0%} | "
                  f"{then.get('current', 0):.0%} | {then.get('stale', 0):.0%} | "
                  f"{entry['add_ms_per_fact']['median_ms']:.0f} | "
                  f"{entry['add_ms_per_fact']['p99_ms']:.0f} |")
    print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
