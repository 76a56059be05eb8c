"""LoCoMo (locomo10.json) as memory facts, encoding contexts and questions, read in place.

Facts are either the dataset's `observation` facts or the raw dialogue turns. Every fact text
starts with its session's date ("[8 May 2023] ..."), so temporal questions are answerable, and
the facts of a conversation are kept in chronological order (session, then the first dialogue
turn the fact cites). The encoding context of a fact (Context-Window Encoding) is one of:
  memory    the facts before it in the conversation, as the memory lines a prompt shows them
            (what precedes a fact in a prompt whose facts are in chronological order)
  dialogue  the session's dialogue up to and including the last turn the fact cites
The data is CC BY-NC 4.0: it is read from ../shared/data/locomo and never copied.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from inferscale_engine.prompting.prompt import FACT_FORMAT

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo10.json"
CATEGORIES = (1, 2, 3, 4)
"""LoCoMo question categories we answer (5, adversarial, has no `answer` and is dropped)."""
CONTEXT_FACTS = 12
"""Preceding facts / turns put in a context string: more than W=128 tokens' worth."""

_DIA_ID = re.compile(r"D:?(\d+):(\d+)")  # also the data's typos 'D:11:26' and 'D8:6; D9:17'
_DATE = re.compile(r"(\d{1,2}) (\w+),? (\d{4})")


@dataclass(frozen=True, slots=True)
class MemoryFact:
    """One fact as stored in a user's memory."""

    text: str
    """Text put in the memory block: '[date] fact'."""
    retrieval_text: str
    """Text the retriever embeds (the fact without its date)."""
    source_ids: tuple[str, ...]
    """Dialogue turns (dia_ids, 'D3:12') the fact comes from."""


@dataclass(frozen=True, slots=True)
class Question:
    """One LoCoMo question of categories 1-4."""

    index: int
    """Position in the conversation's `qa` list (the resume key, with the conversation)."""
    category: int
    question: str
    answer: str
    evidence: tuple[str, ...]
    """dia_ids of the turns that hold the answer (may be empty)."""


@dataclass(frozen=True, slots=True)
class Conversation:
    """A conversation's facts (chronological), their encoding contexts and its questions."""

    sample_id: str
    facts: tuple[MemoryFact, ...]
    contexts: tuple[str, ...]
    questions: tuple[Question, ...]
    context_kind: str = "memory"
    """What `contexts` hold: 'memory' (preceding facts) or 'dialogue'."""


def load_conversations(path: Path, facts: str = "observation",
                       context: str = "memory") -> list[Conversation]:
    """All conversations of locomo10.json, with `facts` ('observation' | 'turns') as memory."""
    if facts not in ("observation", "turns"):
        raise ValueError(f"facts={facts!r}: use 'observation' or 'turns'")
    if context not in ("memory", "dialogue"):
        raise ValueError(f"context={context!r}: use 'memory' or 'dialogue'")
    out = []
    for sample in json.loads(Path(path).read_text()):
        sessions = _sessions(sample["conversation"])
        if facts == "observation":
            memory = _observation_facts(sample["observation"], sessions)
        else:
            memory = _turn_facts(sessions)
        if context == "memory":
            contexts = _memory_contexts(memory)
        else:
            contexts = _dialogue_contexts(memory, sessions)
        out.append(Conversation(sample["sample_id"], tuple(memory), tuple(contexts),
                                tuple(_questions(sample["qa"])), context))
    return out


def parse_dia_ids(value: object) -> tuple[str, ...]:
    """dia_ids in an evidence field (a string or a list of strings), normalized to 'D3:12'."""
    parts = value if isinstance(value, list) else [value]
    return tuple(f"D{s}:{t}" for part in parts for s, t in _DIA_ID.findall(str(part)))


def _sessions(conversation: dict) -> dict[int, tuple[str, list[dict]]]:
    """Session number -> (date 'd Month yyyy', turns), in session order."""
    numbers = sorted(int(m.group(1)) for key in conversation
                     if (m := re.fullmatch(r"session_(\d+)", key)))
    out = {}
    for n in numbers:
        stamp = conversation[f"session_{n}_date_time"]
        match = _DATE.search(stamp)
        date = " ".join(match.groups()) if match else stamp
        out[n] = (date, conversation[f"session_{n}"])
    return out


def _turn_number(dia_id: str) -> tuple[int, int]:
    session, turn = dia_id[1:].split(":")
    return int(session), int(turn)


def _observation_facts(observation: dict, sessions: dict) -> list[MemoryFact]:
    facts: list[tuple[tuple[int, int, int], MemoryFact]] = []
    for n, (date, _) in sessions.items():
        for speaker_facts in observation.get(f"session_{n}_observation", {}).values():
            for text, evidence in speaker_facts:
                ids = parse_dia_ids(evidence)
                first_turn = min((_turn_number(i)[1] for i in ids), default=10**6)
                fact = MemoryFact(f"[{date}] {text.strip()}", text.strip(), ids)
                facts.append(((n, first_turn, len(facts)), fact))
    return [fact for _, fact in sorted(facts, key=lambda item: item[0])]


def _turn_line(turn: dict) -> str:
    text = f"{turn['speaker']}: {turn['text'].strip()}"
    if turn.get("blip_caption"):
        text += f" [shares a photo: {turn['blip_caption'].strip()}]"
    return text


def _turn_facts(sessions: dict) -> list[MemoryFact]:
    return [MemoryFact(f"[{date}] {_turn_line(turn)}", _turn_line(turn),
                       parse_dia_ids(turn["dia_id"]))
            for date, turns in sessions.values() for turn in turns]


def _memory_contexts(facts: list[MemoryFact]) -> list[str]:
    return ["".join(FACT_FORMAT.format(text=f.text) for f in facts[max(0, i - CONTEXT_FACTS):i])
            for i in range(len(facts))]


def _dialogue_contexts(facts: list[MemoryFact], sessions: dict) -> list[str]:
    contexts = []
    for fact in facts:
        if not fact.source_ids:
            contexts.append("")
            continue
        session, last = max(_turn_number(i) for i in fact.source_ids)
        date, turns = sessions[session]
        upto = [t for t in turns if _turn_number(parse_dia_ids(t["dia_id"])[0])[1] <= last]
        lines = "".join(f"{_turn_line(t)}\n" for t in upto[-CONTEXT_FACTS:])
        contexts.append(f"[{date}]\n{lines}")
    return contexts


def _questions(qa: list[dict]) -> list[Question]:
    out = []
    for index, item in enumerate(qa):
        if item.get("category") not in CATEGORIES or "answer" not in item:
            continue
        out.append(Question(index, int(item["category"]), item["question"].strip(),
                            str(item["answer"]), parse_dia_ids(item.get("evidence", []))))
    return out
