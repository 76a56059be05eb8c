"""A user's facts as InferScale's export: JSON Lines, a header line, then one line per fact.

Every stored fact of the user is written: current, superseded and expired (not yet swept)
alike, each with its history. The schema (docs/memory.md#export-and-import):

    {"format": "inferscale.memories", "version": 1, "user_id": "...", "exported_at": t,
     "num_facts": n}
    {"id": 12, "user_id": "...", "agent_id": null, "run_id": null, "session_id": null,
     "text": "...", "metadata": {...}, "created_at": t, "updated_at": t, "valid_from": null,
     "valid_to": null, "superseded_by": null, "expires_at": null,
     "source": "inferscale:12@1715000000.25", "context": null,
     "history": [{"event": "ADD", "old_text": null, "new_text": "...", "created_at": t}]}

Times are seconds since the epoch (JSON numbers, exact). `source` is the fact's identity
(store/transfer.py): an import skips facts whose identity the user has. `context` is what the
fact's KV was encoded after (a text, a run context or null). Embeddings, token ids and KV are
not exported: an import makes them again with its own model and embedder. Importable without
torch (`inferscale export --db` reads a store with no engine).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

from inferscale_engine.memory.formats import FACT_FIELDS, SCHEMA, SCHEMA_VERSION
from inferscale_engine.memory.store import FactStore, StoredFact
from inferscale_engine.memory.store.history import HistoryEvent
from inferscale_engine.memory.store.reserved import CONTEXT_KEY, public_record
from inferscale_engine.memory.store.transfer import identity


def export_store(store: FactStore, user_id: str) -> Iterator[str]:
    """The export of a user of a store, read now (for a store no Memory serves)."""
    return lines(user_id, store.get_all(user_id=user_id), store.user_history(user_id=user_id))


def lines(user_id: str, facts: Sequence[StoredFact], events: Sequence[HistoryEvent]
          ) -> Iterator[str]:
    """The export's lines (each ending in a newline): the header, then each fact."""
    by_fact: dict[int, list[HistoryEvent]] = defaultdict(list)
    for event in events:
        by_fact[event.fact_id].append(event)
    yield _line({"format": SCHEMA, "version": SCHEMA_VERSION, "user_id": user_id,
                 "exported_at": time.time(), "num_facts": len(facts)})
    for fact in facts:
        yield _line(fact_record(fact, by_fact.get(fact.fact_id, ())))


def fact_record(fact: StoredFact, events: Sequence[HistoryEvent]) -> dict[str, Any]:
    """One fact line of the export (a stored fact, its reserved keys as their own fields)."""
    public = public_record(fact)
    record = {
        "id": int(fact.fact_id), "user_id": fact.user_id, "agent_id": public.agent_id,
        "run_id": public.run_id, "session_id": fact.session_id, "text": fact.text,
        "metadata": public.metadata, "created_at": fact.created_at,
        "updated_at": fact.updated_at, "valid_from": fact.valid_from,
        "valid_to": fact.valid_to,
        "superseded_by": None if fact.superseded_by is None else int(fact.superseded_by),
        "expires_at": fact.expires_at, "pinned": fact.pinned, "source": identity(fact),
        "context": fact.metadata.get(CONTEXT_KEY),
        "history": [{"event": e.event, "old_text": e.old_text, "new_text": e.new_text,
                     "created_at": e.created_at} for e in events]}
    assert tuple(record) == FACT_FIELDS
    return record


def _line(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False) + "\n"
