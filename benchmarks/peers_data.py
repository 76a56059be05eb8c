"""What the side-by-side (peers.py) feeds every memory and scores: a pluggable data source.

A source yields episodes: one user's history (its sessions, each with the facts a raw add stores
and the dialogue turns an extracting add reads) and the questions asked about it, plus the
scorer of an answer. `--data locomo` (default) is LoCoMo through the repository's own LoCoMo
code: the dev/test folds and samples of locomo_protocol.py, the observation facts and turns of
locomo_data.py ('[date] fact', '[date] Speaker: text'), the F1 / EM / gold-token recall of
locomo_metrics.py. Another source (e.g. a knowledge-update set) is named as `module:attribute`,
an object with the same two methods as LocomoSource.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from benchmarks.locomo_data import DEFAULT_DATA, MemoryFact, Question, load_conversations
from benchmarks.locomo_metrics import exact_match, gold_token_recall, locomo_f1
from benchmarks.locomo_protocol import select


@dataclass(frozen=True, slots=True)
class Session:
    """One session of an episode: what a memory is given after it."""

    date: str
    facts: tuple[MemoryFact, ...]
    """Stored as they are by the raw arms (mem0 infer=False, InferScale, LangGraph)."""
    turns: tuple[MemoryFact, ...]
    """Dialogue turns, each citing its own turn id: the input of mem0 infer=True."""


@dataclass(frozen=True, slots=True)
class Episode:
    """One user's memory and the questions asked about it."""

    episode_id: str
    sessions: tuple[Session, ...]
    questions: tuple[Question, ...]
    """The selected questions only."""

    @property
    def facts(self) -> tuple[MemoryFact, ...]:
        return tuple(f for s in self.sessions for f in s.facts)

    def sources_by_text(self) -> dict[str, tuple[str, ...]]:
        """Fact text -> the turn ids it cites (facts of equal text: the union)."""
        out: dict[str, tuple[str, ...]] = {}
        for fact in self.facts:
            out[fact.text] = tuple(dict.fromkeys((*out.get(fact.text, ()), *fact.source_ids)))
        return out


@dataclass(frozen=True, slots=True)
class Picked:
    """The episodes of a run and the fold they come from."""

    split: str | None
    episodes: tuple[Episode, ...]

    @property
    def num_questions(self) -> int:
        return sum(len(e.questions) for e in self.episodes)


class DataSource(Protocol):
    """What peers.py needs of a data set."""

    name: str
    metrics: tuple[str, ...]
    """Names of score()'s metrics, the headline one first (LoCoMo: f1)."""

    def pick(self, args: argparse.Namespace) -> Picked:
        """The episodes and questions a run answers (deterministic for the same args)."""
        ...

    def score(self, prediction: str, question: Mapping[str, Any]) -> dict[str, float]:
        """Metrics of one answer (a question record: category, gold, ...), keyed by `metrics`."""
        ...


class LocomoSource:
    """LoCoMo (CC BY-NC 4.0, read in place from ../shared/data/locomo, never copied)."""

    name = "locomo"
    metrics = ("f1", "em", "gold_recall")

    def pick(self, args: argparse.Namespace) -> Picked:
        path = args.data_path or DEFAULT_DATA
        facts = {c.sample_id: c for c in load_conversations(path, "observation")}
        turns = {c.sample_id: c for c in load_conversations(path, "turns")}
        names = None if args.conversations is None else args.conversations.split(",")
        selection = select(list(facts.values()), split=args.split, names=names,
                           categories=args.categories, seed=args.seed,
                           max_per_conversation=args.max_questions,
                           test_questions=args.test_questions)
        episodes = tuple(Episode(conv.sample_id, sessions(
            conv.facts, turns[conv.sample_id].facts)[:args.max_sessions or None], qs)
            for conv, qs in selection.groups)
        return Picked(selection.split, episodes)

    def score(self, prediction: str, question: Mapping[str, Any]) -> dict[str, float]:
        gold, category = question["gold"], question["category"]
        return {"f1": locomo_f1(prediction, gold, category),
                "em": exact_match(prediction, gold, category),
                "gold_recall": gold_token_recall(prediction, gold, category)}


def sessions(facts: Sequence[MemoryFact], turns: Sequence[MemoryFact]) -> tuple[Session, ...]:
    """Facts and turns grouped by session: consecutive runs of one '[date]' prefix (both lists
    are in chronological order; two sessions of one date become one)."""
    def runs(items: Sequence[MemoryFact]) -> list[tuple[str, list[MemoryFact]]]:
        out: list[tuple[str, list[MemoryFact]]] = []
        for item in items:
            date = item.text[1:item.text.index("]")] if item.text.startswith("[") else ""
            if not out or out[-1][0] != date:
                out.append((date, []))
            out[-1][1].append(item)
        return out

    by_date: dict[str, list[MemoryFact]] = {}
    for date, group in runs(facts):
        by_date.setdefault(date, []).extend(group)
    return tuple(Session(date, tuple(by_date.pop(date, ())), tuple(group))
                 for date, group in runs(turns))


def load_source(spec: str) -> DataSource:
    """'locomo', or 'package.module:attribute' naming a DataSource (or a class of one)."""
    if spec == "locomo":
        return LocomoSource()
    module, sep, attribute = spec.partition(":")
    if not sep:
        raise SystemExit(f"--data {spec!r}: use 'locomo' or 'package.module:attribute'")
    found = getattr(importlib.import_module(module), attribute)
    return found() if isinstance(found, type) else found
