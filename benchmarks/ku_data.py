"""A synthetic, seeded knowledge-update set: facts about a user that change over time.

Each scenario is one user's memory written over dated sessions: a handful of attributes
(where they live, where they work, their dog, car, sport, the language they learn, ...) that
change one to three times, mixed with stable facts and day-to-day chatter that never matter.
Some updates name the old value ("I sold my Corolla and bought a Civic"), some do not ("My new
apartment is in Lisbon"), as people write. Questions ask for the current value of each attribute
("Which city do I live in now?") and, for a changed attribute, what was true at a date between
two changes ("As of 2023-06-14, which city did I live in?").

Answers are scored by the values they name (case-insensitive, whole words): `current` (the
value true now, or at the date asked), `stale` (a value that was true once but not then). This
is the dev set the memory semantics are tuned on; public knowledge-update sets are held out.
"""

from __future__ import annotations

import datetime as dt
import random
import re
from dataclasses import dataclass, field

SLOTS: dict[str, dict[str, object]] = {
    "city": {
        "values": ["Denver", "Lisbon", "Austin", "Toronto", "Seattle", "Madrid", "Osaka",
                   "Nairobi", "Melbourne", "Dublin", "Prague", "Montreal"],
        "first": ["I live in {v}.", "My home is in {v}, where I have lived for years."],
        "change": ["I moved to {v} last month.", "My new apartment is in {v}.",
                   "We left {old} and relocated to {v}."],
        "now": "Which city do I live in now?",
        "then": "As of {date}, which city did I live in?"},
    "employer": {
        "values": ["Acme Robotics", "Bluefin Analytics", "Cobalt Health", "Dunmore Press",
                   "Everline Energy", "Foxglove Labs", "Granite Bank", "Harbor Logistics",
                   "Ionic Games", "Juniper Foods"],
        "first": ["I work at {v} as an engineer.", "My employer is {v}."],
        "change": ["I started a new job at {v} this week.", "I quit {old} and joined {v}.",
                   "These days I work for {v}."],
        "now": "Which company do I work for now?",
        "then": "As of {date}, which company did I work for?"},
    "dog": {
        "values": ["Pepper", "Biscuit", "Luna", "Rocco", "Maple", "Ziggy", "Nala", "Otis",
                   "Juno", "Waffles"],
        "first": ["My dog is called {v}.", "I have a beagle named {v}."],
        "change": ["We adopted a puppy named {v}; {old} went to live with my parents.",
                   "Our dog now is {v}, a rescue we took in."],
        "now": "What is the name of my dog now?",
        "then": "As of {date}, what was the name of my dog?"},
    "car": {
        "values": ["Corolla", "Civic", "Outback", "Model 3", "Golf", "Mustang", "Prius",
                   "Wrangler", "Miata", "Leaf"],
        "first": ["I drive a {v}.", "My car is a {v}."],
        "change": ["I sold my {old} and bought a {v}.", "I just got a new car: a {v}."],
        "now": "What car do I drive now?",
        "then": "As of {date}, what car did I drive?"},
    "sport": {
        "values": ["tennis", "climbing", "rowing", "badminton", "volleyball", "fencing",
                   "squash", "cycling", "judo", "swimming"],
        "first": ["I play {v} every weekend.", "My sport is {v}."],
        "change": ["I gave up {old}; now I do {v}.", "Lately my weekend sport is {v}."],
        "now": "Which sport do I do now?",
        "then": "As of {date}, which sport did I do?"},
    "language": {
        "values": ["Portuguese", "Japanese", "Korean", "Italian", "Swahili", "Greek",
                   "Turkish", "Polish", "Dutch", "Hindi"],
        "first": ["I am learning {v}.", "I take {v} lessons twice a week."],
        "change": ["I switched from {old} to learning {v}.", "My new language class is {v}."],
        "now": "Which language am I learning now?",
        "then": "As of {date}, which language was I learning?"},
}
"""Attributes that change: value pool, how a first value and an update are written, and the
questions for now and for a date."""

STABLE = [
    "My sister is named {name}.", "My birthday is in {month}.", "I am allergic to {food}.",
    "My favourite band is {band}.", "I grew up near the sea.", "I prefer tea to coffee.",
    "My best friend from school is {name2}.", "I am saving up for a trip to {place}.",
]
CHATTER = [
    "I had {food} for lunch today.", "It rained all afternoon, so I stayed in.",
    "I watched a documentary about {place} last night.", "The train was late again this morning.",
    "I spent the evening reading a novel.", "I finally fixed the squeaky door.",
    "I called {name} to catch up.", "I baked bread for the first time.",
]
FILL = {"name": ["Maya", "Ines", "Tomas", "Priya", "Kofi"], "name2": ["Leo", "Sara", "Ravi"],
        "month": ["March", "July", "October", "January"], "food": ["peanuts", "shellfish",
                                                                    "ramen", "tacos", "curry"],
        "band": ["The Strokes", "Radiohead", "ABBA"], "place": ["Iceland", "Peru", "Vietnam"]}


@dataclass(frozen=True, slots=True)
class KUFact:
    """One fact as the user said it, with the day it was said."""

    text: str
    date: dt.date
    slot: str | None = None
    """The attribute it sets (None: a stable fact or chatter)."""


@dataclass(frozen=True, slots=True)
class KUQuestion:
    """A question about one attribute, now (as_of None) or at a date."""

    question_id: str
    text: str
    slot: str
    current: str
    """The value true now, or at `as_of`."""
    stale: tuple[str, ...]
    """Values true at some time, but not then."""
    as_of: dt.date | None = None


@dataclass(slots=True)
class Scenario:
    """One user's dated facts, in the order they were said, and the questions about them."""

    user_id: str
    facts: list[KUFact] = field(default_factory=list)
    questions: list[KUQuestion] = field(default_factory=list)


def scenarios(count: int = 24, seed: int = 0, start: dt.date = dt.date(2023, 1, 9),
              sessions: int = 10) -> list[Scenario]:
    """`count` users, each over `sessions` weekly-to-monthly sessions; seeded, deterministic."""
    return [_scenario(i, random.Random(f"{seed}:{i}"), start, sessions) for i in range(count)]


def _scenario(index: int, rng: random.Random, start: dt.date, sessions: int) -> Scenario:
    days = sorted(rng.sample(range(7, 7 * 4 * sessions), sessions - 1))
    dates = [start, *(start + dt.timedelta(days=d) for d in days)]
    plan: dict[int, list[KUFact]] = {i: [] for i in range(sessions)}
    timeline: dict[str, list[tuple[dt.date, str]]] = {}
    for slot in rng.sample(sorted(SLOTS), k=len(SLOTS)):
        spec = SLOTS[slot]
        changes = rng.choice((1, 1, 2, 2, 3))
        values = rng.sample(list(spec["values"]), changes + 1)  # type: ignore[arg-type]
        at = sorted(rng.sample(range(1, sessions), changes))
        first = rng.randrange(0, at[0])
        timeline[slot] = [(dates[s], v) for s, v in zip([first, *at], values, strict=True)]
        plan[first].append(KUFact(rng.choice(spec["first"]).format(v=values[0]),  # type: ignore
                                  dates[first], slot))
        for n, session in enumerate(at, start=1):
            template = rng.choice(spec["change"])  # type: ignore[arg-type]
            plan[session].append(KUFact(template.format(v=values[n], old=values[n - 1]),
                                        dates[session], slot))
    for template in rng.sample(STABLE, 5) + rng.sample(CHATTER, 6):
        session = rng.randrange(sessions)
        plan[session].append(KUFact(_fill(template, rng), dates[session]))
    scenario = Scenario(f"ku-user-{index:02d}")
    for session in range(sessions):
        rng.shuffle(plan[session])
        scenario.facts.extend(plan[session])
    for slot, history in sorted(timeline.items()):
        spec = SLOTS[slot]
        values = [v for _, v in history]
        scenario.questions.append(KUQuestion(f"{scenario.user_id}/{slot}/now",
                                             str(spec["now"]), slot, values[-1],
                                             tuple(values[:-1])))
        step = rng.randrange(len(history) - 1)  # a day strictly between two values' dates
        lo, hi = history[step][0], history[step + 1][0]
        if (hi - lo).days >= 2:
            day = lo + dt.timedelta(days=rng.randrange(1, (hi - lo).days))
            scenario.questions.append(KUQuestion(
                f"{scenario.user_id}/{slot}/then", str(spec["then"]).format(date=day.isoformat()),
                slot, values[step], tuple(v for v in values if v != values[step]), day))
    return scenario


def _fill(template: str, rng: random.Random) -> str:
    return template.format(**{k: rng.choice(v) for k, v in FILL.items()})


def names(answer: str, value: str) -> bool:
    """Whether `answer` names `value` (case-insensitive, whole words)."""
    return re.search(rf"(?<!\w){re.escape(value)}(?!\w)", answer, re.IGNORECASE) is not None


def score(answer: str, question: KUQuestion) -> dict[str, bool]:
    """current: the answer names the value true then; stale: it names a value that was not."""
    return {"current": names(answer, question.current),
            "stale": any(names(answer, v) for v in question.stale)}
