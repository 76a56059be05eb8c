"""A user's facts written whole: the rows of an import, with their times, links and history.

An import (memory/importing.py) stores facts as they were where they came from: their created,
updated and valid times, their expiry, the facts that superseded them (re-pointed at the new
ids) and their history events at their own times. Every fact has an identity (identity()): the
source key of the record it was imported from, or for a fact added here its own id and
creation time. write_user skips a record whose identity the user already has, so importing a
file twice, or a user's export back into its own store, adds nothing. The caller runs
write_user inside the FactStore transaction that bumps the user's version.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inferscale_engine.facts import FactId
from inferscale_engine.memory.store import history
from inferscale_engine.memory.store.records import (
    StoredFact,
    content_hash,
    embedding_blob,
    metadata_json,
    token_blob,
)
from inferscale_engine.memory.store.reserved import SOURCE_KEY
from inferscale_engine.memory.store.sql.database import Database

NATIVE_PREFIX = "inferscale:"
"""Identities of facts added in an InferScale store: inferscale:<fact id>@<created_at>."""


@dataclass(frozen=True, slots=True)
class ImportedFact:
    """One fact to import, ready to store (its token ids and embedding made by the caller)."""

    source: str
    """The record's identity (a source key such as 'mem0:<id>'); stored as SOURCE_KEY."""
    text: str
    token_ids: Sequence[int]
    embedding: Any
    """A float vector [dim] (as FactStore.add_facts takes)."""
    metadata: dict[str, Any]
    """The fact's metadata, reserved keys (scopes, context) included; SOURCE_KEY is added."""
    created_at: float
    updated_at: float
    session_id: str | None = None
    valid_from: float | None = None
    valid_to: float | None = None
    superseded_by: str | None = None
    """The source of the fact that superseded it (re-pointed at its new id), if any."""
    expires_at: float | None = None
    history: tuple[tuple[str, str | None, str | None, float], ...] = ()
    """(event, old text, new text, time) of each history event, oldest first."""


def native_source(fact_id: int, created_at: float) -> str:
    """The identity of a fact added in an InferScale store."""
    return f"{NATIVE_PREFIX}{fact_id}@{created_at!r}"


def identity(fact: StoredFact) -> str:
    """A stored fact's identity: the source it was imported from, else its own."""
    source = fact.metadata.get(SOURCE_KEY)
    return source if isinstance(source, str) else native_source(fact.fact_id, fact.created_at)


def write_user(db: Database, user_id: str, facts: Sequence[ImportedFact]) -> list[FactId]:
    """Store the facts whose identity the user does not have yet; returns their new ids.

    Supersede links name sources: those of facts of this call or already stored for the user
    are re-pointed at their ids; a link to a fact neither holds is dropped (valid_to stays).
    """
    known = _identities(db, user_id)
    fresh = [f for f in facts if f.source not in known]
    if not fresh:
        return []
    rows = [(user_id, f.session_id, f.text, token_blob(f.token_ids, f"{f.source} token_ids"),
             embedding_blob(f.embedding, f"{f.source} embedding"),
             metadata_json({**f.metadata, SOURCE_KEY: f.source}, 1)[0], f.created_at,
             f.updated_at, content_hash(f.text), f.valid_from, f.valid_to, f.expires_at)
            for f in fresh]
    ids = [FactId(i) for i in db.insert(
        "INSERT INTO facts (user_id, session_id, text, token_ids, embedding, metadata, "
        "created_at, updated_at, content_hash, valid_from, valid_to, expires_at, pending) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)", rows, "fact_id")]
    known.update((f.source, i) for f, i in zip(fresh, ids, strict=True))
    db.executemany("UPDATE facts SET superseded_by = ? WHERE fact_id = ?",
                   [(known[f.superseded_by], i) for f, i in zip(fresh, ids, strict=True)
                    if f.superseded_by is not None and f.superseded_by in known])
    history.record_at(db, user_id, [(i, *event) for f, i in zip(fresh, ids, strict=True)
                                    for event in f.history])
    return ids


def _identities(db: Database, user_id: str) -> dict[str, FactId]:
    """The fact id of every fact the user has, by its identity."""
    found = {}
    for fact_id, created_at, metadata in db.execute(
            "SELECT fact_id, created_at, metadata FROM facts WHERE user_id = ?", (user_id,)):
        source = json.loads(metadata).get(SOURCE_KEY)
        found[source if isinstance(source, str) else native_source(fact_id, created_at)] = (
            FactId(fact_id))
    return found
