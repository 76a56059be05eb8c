"""The knowledge-update dev set (ku_data.py) as a data source of peers.py.

An episode is one user: a session per day the user spoke, its facts stored as they are by the
raw arms (and given as the user's messages to mem0's extraction), then the user's questions:
category 1 asks for a value now ("Which city do I live in now?"), category 2 for the value at
a date, named in the question's words only (no arm is given as_of). Metrics: `current` (the
answer names the value true then) and `stale` (it names a value that was not true then). A
question's evidence is the facts of its attribute that name the value true then.

  python benchmarks/peers.py --data benchmarks.peers_ku:six_users --model small --no-hints
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from benchmarks.ku_data import KUQuestion, Scenario, names, scenarios, score
from benchmarks.locomo_data import MemoryFact, Question
from benchmarks.peers_data import Episode, Picked, Session


class KnowledgeUpdates:
    """The first `users` users of the seeded dev set (seed 0, as knowledge_update.py)."""

    name = "knowledge_update"
    metrics = ("current", "stale")

    def __init__(self, users: int) -> None:
        self.users = users
        self._questions: dict[tuple[str, int], KUQuestion] = {}

    def pick(self, args: argparse.Namespace) -> Picked:
        episodes = []
        for scenario in scenarios(self.users, 0):
            questions = []
            for index, question in enumerate(scenario.questions):
                self._questions[(scenario.user_id, index)] = question
                questions.append(Question(index, 1 if question.as_of is None else 2,
                                          question.text, question.current,
                                          evidence(scenario, question)))
            questions = questions[:args.max_questions or None]  # smoke runs: the first N
            episodes.append(Episode(scenario.user_id, sessions_of(scenario), tuple(questions)))
        return Picked("dev", tuple(episodes))

    def score(self, prediction: str, question: Mapping[str, Any]) -> dict[str, float]:
        found = score(prediction, self._questions[(question["episode"], question["index"])])
        return {k: float(v) for k, v in found.items()}


def fact_id(scenario: Scenario, index: int) -> str:
    return f"{scenario.user_id}/{index}"


def sessions_of(scenario: Scenario) -> tuple[Session, ...]:
    """A session per day, its facts in the order they were said (each citing its own id)."""
    days: dict[str, list[MemoryFact]] = {}
    for i, fact in enumerate(scenario.facts):
        days.setdefault(fact.date.isoformat(), []).append(
            MemoryFact(fact.text, fact.text, (fact_id(scenario, i),)))
    return tuple(Session(day, tuple(facts), tuple(facts)) for day, facts in days.items())


def evidence(scenario: Scenario, question: KUQuestion) -> tuple[str, ...]:
    """The facts of the question's attribute that name the value true then."""
    return tuple(fact_id(scenario, i) for i, f in enumerate(scenario.facts)
                 if f.slot == question.slot and names(f.text, question.current))


six_users = KnowledgeUpdates(6)
"""The 6 users (72 questions) of docs/benchmarks.md's knowledge-update tables."""
