"""add(..., infer=True): facts extracted by the served model, reconciled with stored facts.

mem0's flow; each change is recorded in history. As in mem0 v3, nothing is overwritten or erased:
an UPDATE adds the new fact and marks the stored one superseded by it, a DELETE marks it no
longer true; both stay in the store (history, as-of reads) and leave what is served.

1. Extract: the model reads the conversation and writes {"facts": [...]} (vLLM's structured
   outputs hold it to a JSON schema).
2. Decide (only when the user has stored facts; otherwise every new fact is added): for the
   new facts, the user's most similar stored facts are listed under short ids;
   the model writes {"memory": [{"event", "id", "text"}, ...]}: ADD a new fact, UPDATE a stored
   one (its id, the new text), DELETE a stored one (its id), NONE (already known). The schema
   allows only the listed ids.
3. Apply through Memory's own verbs (add / update / delete: durable, KV rebuilt, history).

Bad model output (not JSON, cut off, an id that was not listed, an UPDATE without text)
changes nothing: the call returns no events and `counters["infer_invalid"]` counts it
(`counters["infer_calls"]` counts every call).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

EVENTS = ("ADD", "UPDATE", "DELETE", "NONE")
MAX_FACTS = 20
SIMILAR = 5
"""Stored facts listed per new fact in the decision step."""

EXTRACT_SYSTEM = (
    "You write down facts about the user from a conversation, for a memory of the user. "
    "Each fact is one short sentence about the user (for example 'The user lives in Lisbon.'), "
    "taken only from what the user says. Answer with JSON: {\"facts\": [\"...\"]}, and "
    "{\"facts\": []} when the user says nothing about themselves.")
DECIDE_SYSTEM = (
    "You keep a memory of facts about a user up to date. You are given the stored facts, each "
    "with an id, and new facts. For each new fact choose one event: ADD if it is new; UPDATE "
    "if it changes or replaces a stored fact (give that fact's id and the new text); DELETE "
    "if it says a stored fact is no longer true (give its id); NONE if it is already stored. "
    "Answer with JSON: {\"memory\": [{\"event\": ..., \"id\": ..., \"text\": ...}]}; use "
    "\"id\": \"new\" for ADD.")


@dataclass(frozen=True, slots=True)
class Decision:
    """One reconciled change: what the model decided and which stored fact it concerns."""

    event: str
    """ADD, UPDATE, DELETE or NONE."""
    text: str
    fact_id: int | None = None
    """The stored fact an UPDATE, DELETE or NONE concerns (None for ADD)."""


def extract_schema() -> dict[str, Any]:
    """The JSON schema of the extraction answer."""
    return {"type": "object", "additionalProperties": False, "required": ["facts"],
            "properties": {"facts": {"type": "array", "maxItems": MAX_FACTS,
                                     "items": {"type": "string", "minLength": 1,
                                               "maxLength": 400}}}}


def decide_schema(ids: Sequence[str]) -> dict[str, Any]:
    """The JSON schema of the decision answer: ids only from `ids` (and "new")."""
    return {"type": "object", "additionalProperties": False, "required": ["memory"],
            "properties": {"memory": {"type": "array", "maxItems": MAX_FACTS, "items": {
                "type": "object", "additionalProperties": False,
                "required": ["event", "id", "text"],
                "properties": {"event": {"enum": list(EVENTS)},
                               "id": {"enum": [*ids, "new"]},
                               "text": {"type": "string", "maxLength": 400}}}}}}


def conversation_text(messages: Sequence[Mapping[str, str]]) -> str:
    """The conversation as the extraction step reads it."""
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages
                     if m.get("role") in ("user", "assistant") and m.get("content"))


def parse_facts(text: str) -> list[str] | None:
    """The extracted facts, or None if the answer is not the schema's JSON."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    facts = value.get("facts") if isinstance(value, dict) else None
    if not isinstance(facts, list) or not all(isinstance(f, str) for f in facts):
        return None
    return list(dict.fromkeys(f.strip() for f in facts if f.strip()))[:MAX_FACTS]


def decide_prompt(stored: Sequence[tuple[str, str]], facts: Sequence[str]) -> str:
    """The decision step's user message: (id, text) of stored facts, then the new facts."""
    listed = "\n".join(f"{i}: {text}" for i, text in stored) or "(none)"
    return f"Stored facts:\n{listed}\n\nNew facts:\n" + "\n".join(f"- {f}" for f in facts)


def parse_decisions(text: str, ids: Mapping[str, int]) -> list[Decision] | None:
    """The decisions, or None if the answer is not valid.

    Any unknown id or missing text invalidates the whole answer: nothing is half applied.
    """
    try:
        value = json.loads(text)
    except ValueError:
        return None
    items = value.get("memory") if isinstance(value, dict) else None
    if not isinstance(items, list):
        return None
    out = []
    for item in items:
        if not isinstance(item, dict):
            return None
        event, ref, new_text = item.get("event"), item.get("id"), item.get("text")
        if event not in EVENTS or not isinstance(ref, str) or not isinstance(new_text, str):
            return None
        if event == "ADD":
            if not new_text.strip():
                return None
            out.append(Decision("ADD", new_text.strip()))
        elif event == "NONE" and ref == "new":  # nothing to change, about no stored fact
            continue
        elif ref not in ids or (event == "UPDATE" and not new_text.strip()):
            return None
        else:
            out.append(Decision(event, new_text.strip(), ids[ref]))
    return out


def infer_add(memory: Any, *, user_id: str, messages: Sequence[Mapping[str, str]],
              metadata: Mapping[str, Any] | None, agent_id: str | None, run_id: str | None,
              max_tokens: int = 512, timestamp: float | None = None,
              expiration_date: object = None) -> list[Any]:
    """Extract, decide and apply (module docstring); one AddResult per applied decision.

    The ADD / UPDATE / DELETE results carry the fact's id and its (new, or deleted) text; NONE
    results the id of the stored fact that already says it.
    """
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from inferscale_engine.facts import FactId, MemoryHandle
    from inferscale_engine.memory.types import AddResult

    no_facts = MemoryHandle(user_id, ())  # the prompts hold the user's words: its text salt

    def ask(system: str, user: str, schema: dict[str, Any]) -> str:
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                  structured_outputs=StructuredOutputsParams(json=schema))
        return str(memory.engine.generate(no_facts, [{"role": "system", "content": system},
                                                     {"role": "user", "content": user}],
                                          sampling, mode="text").text)

    conversation = conversation_text(messages)
    if not conversation:
        return []
    memory.counters["infer_calls"] += 1
    facts = parse_facts(ask(EXTRACT_SYSTEM, conversation, extract_schema()))
    if facts is None:
        memory.counters["infer_invalid"] += 1
        return []
    if not facts:
        return []
    listed: dict[int, str] = {}
    for fact in facts:
        for stored in memory.search(user_id=user_id, query=fact, k=SIMILAR, agent_id=agent_id,
                                    run_id=run_id).facts:
            listed.setdefault(stored.fact_id, stored.text)
    ids = {str(i): fact_id for i, fact_id in enumerate(listed)}
    decisions = parse_decisions(ask(DECIDE_SYSTEM, decide_prompt(
        [(i, listed[f]) for i, f in ids.items()], facts), decide_schema(list(ids))), ids
    ) if listed else [Decision("ADD", fact) for fact in facts]  # nothing stored to compare
    if decisions is None:
        memory.counters["infer_invalid"] += 1
        return []
    results: list[Any] = []
    adds: list[int] = []  # positions in `results` of the ADDs, added in one batch below
    touched: set[int] = set()
    for decision in decisions:
        if decision.fact_id is not None and decision.fact_id in touched:
            continue  # one change per stored fact and call
        if decision.event == "ADD":
            adds.append(len(results))
            results.append(decision.text)
            continue
        assert decision.fact_id is not None
        touched.add(decision.fact_id)
        if decision.event == "UPDATE":  # a new fact; the old one kept, superseded
            results.append(memory.supersede(user_id=user_id, fact_id=decision.fact_id,
                                            text=decision.text, timestamp=timestamp))
        elif decision.event == "DELETE":  # no longer true: kept, superseded by nothing
            memory.supersede(user_id=user_id, fact_id=decision.fact_id, timestamp=timestamp)
            results.append(AddResult(FactId(decision.fact_id), listed[decision.fact_id], "DELETE"))
        else:
            results.append(AddResult(FactId(decision.fact_id), listed[decision.fact_id], "NONE"))
    if adds:  # one embedding and encoding batch for every new fact, results in decision order
        added = memory.add(user_id=user_id, texts=[results[i] for i in adds],
                           metadata=metadata, agent_id=agent_id, run_id=run_id,
                           timestamp=timestamp, expiration_date=expiration_date)
        for i, result in zip(adds, added, strict=True):
            results[i] = result
    return results
