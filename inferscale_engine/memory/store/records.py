"""What the FactStore holds per row (StoredFact, Turn) and how values become column blobs.

Token ids are little-endian int32 and embeddings little-endian float32 bytes, so a record
compares with == and round-trips exactly. Importable without torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferscale_engine.checks import check_list, check_role, check_str, json_object
from inferscale_engine.errors import InvalidFactError, InvalidTurnError
from inferscale_engine.facts import Fact, FactId
from inferscale_engine.memory.types import MemoryItem

TOKEN_DTYPE = np.dtype("<i4")
EMBEDDING_DTYPE = np.dtype("<f4")
_MAX_TOKEN_ID = 2**31 - 1


@dataclass(frozen=True, slots=True)
class StoredFact:
    """One fact as stored: everything needed to rebuild its KV and its index entry."""

    fact_id: FactId
    user_id: str
    session_id: str | None
    text: str
    token_ids: tuple[int, ...]
    embedding: bytes
    """Little-endian float32 bytes (immutable, so the record compares with ==); see
    embedding_array()."""
    metadata: dict[str, Any]
    created_at: float
    """Seconds since the epoch (time.time())."""
    updated_at: float
    agent_id: str | None = None
    """The agent scope the fact was added in (Memory's records; None in the store's)."""
    run_id: str | None = None
    """The run scope the fact was added in (likewise)."""
    valid_from: float | None = None
    """When the fact became true (add's timestamp); None: when it was added (created_at)."""
    valid_to: float | None = None
    """When a newer fact superseded it (None: current)."""
    superseded_by: FactId | None = None
    """The fact that superseded it."""
    expires_at: float | None = None
    """When it expires (None: never); an expired fact is never served."""
    pending: bool = False
    """Its embedding and KV are still being made (an asynchronous add)."""
    pinned: bool = False
    """In every prompt of the user, its KV never evicted (store/pinning.py)."""

    @property
    def since(self) -> float:
        """When the fact became true: valid_from, else created_at."""
        return self.created_at if self.valid_from is None else self.valid_from

    def current(self, at: float) -> bool:
        """True if the fact was true and not expired at time `at` (seconds since the epoch)."""
        return (self.since <= at and (self.valid_to is None or at < self.valid_to)
                and (self.expires_at is None or at < self.expires_at))

    def embedding_array(self) -> np.ndarray:
        """The embedding as a read-only float32 vector [dim] (a view, no copy)."""
        return np.frombuffer(self.embedding, dtype=EMBEDDING_DTYPE)

    def to_fact(self) -> Fact:
        """The app-facing Fact (id, user, text, token ids)."""
        return Fact(self.fact_id, self.user_id, self.text, self.token_ids)

    def to_item(self, score: float | None = None) -> MemoryItem:
        """The user-facing MemoryItem (metadata as held here: Memory's records are public)."""
        return MemoryItem(self.fact_id, self.user_id, self.text, score, dict(self.metadata),
                          self.session_id, self.created_at, self.updated_at, self.agent_id,
                          self.run_id, self.valid_from, self.valid_to, self.superseded_by,
                          self.expires_at, self.pinned)


@dataclass(frozen=True, slots=True)
class Turn:
    """One stored conversation message."""

    turn_id: int
    user_id: str
    session_id: str | None
    role: str
    content: str
    created_at: float


def token_blob(value: Any, what: str) -> bytes:
    """Token ids (a list, numpy array or tensor of ints in [0, 2**31)) as int32 bytes."""
    if hasattr(value, "tolist"):  # numpy array or torch tensor
        value = value.tolist()
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise InvalidFactError(f"{what} must be a list of ints, got {type(value).__name__}")
    if not value:
        raise InvalidFactError(f"{what} is empty; pass the fact text's token ids")
    for token in value:
        if isinstance(token, bool) or not isinstance(token, int | np.integer) or not (
                0 <= token <= _MAX_TOKEN_ID):
            raise InvalidFactError(f"{what} holds {token!r:.40}; token ids are ints in "
                                   f"[0, {_MAX_TOKEN_ID}]")
    return np.asarray(value, dtype=TOKEN_DTYPE).tobytes()


def embedding_blob(value: Any, what: str) -> bytes:
    """One embedding [dim] (list, numpy, tensor or float32 bytes) as finite float32 bytes."""
    if isinstance(value, bytes | bytearray | memoryview):
        if len(value) % 4:
            raise InvalidFactError(f"{what} has {len(value)} bytes, not a whole number of "
                                   "float32 values")
        value = np.frombuffer(value, dtype=EMBEDDING_DTYPE)
    elif hasattr(value, "detach"):  # torch tensor, on any device and dtype
        value = value.detach().float().cpu().numpy()
    try:
        vector = np.asarray(value, dtype=EMBEDDING_DTYPE)
    except (TypeError, ValueError):
        raise InvalidFactError(f"{what} is {value!r:.80}, not a vector of floats") from None
    if vector.ndim != 1 or vector.size == 0:
        raise InvalidFactError(f"{what} has shape {vector.shape}; pass one vector [dim] per fact")
    if not np.isfinite(vector).all():
        raise InvalidFactError(f"{what} contains NaN or inf; check the embedder's output")
    return vector.tobytes()


STORED_METADATA_BYTES = 2**20
"""Largest metadata of one stored fact: the app's (checks.MAX_METADATA_BYTES) and what the
fact was encoded after."""


def metadata_json(metadata: object, num_facts: int) -> list[str]:
    """Per fact, its metadata as JSON: None, one dict for all, or one dict per fact."""
    if metadata is None or isinstance(metadata, Mapping):
        items: Sequence[Any] = [metadata] * num_facts
    else:
        items = check_list(metadata, "metadata", InvalidFactError, num_facts)
    out = []
    for i, item in enumerate(items):
        if item is None:
            out.append("{}")
            continue
        if not isinstance(item, Mapping) or not all(isinstance(k, str) for k in item):
            raise InvalidFactError(f"metadata[{i}] is {item!r:.80}; pass a dict with string keys")
        # The app's metadata was bounded by check_metadata; this adds the encoding context.
        out.append(json.dumps(json_object(item, f"metadata[{i}]", STORED_METADATA_BYTES),
                              allow_nan=False))
    return out


def turn_rows(turns: object) -> list[tuple[str, str]]:
    """(role, content) pairs checked: a known role, str content (may be blank)."""
    rows = []
    for i, turn in enumerate(check_list(turns, "turns", InvalidTurnError)):
        if isinstance(turn, str) or not isinstance(turn, Sequence) or len(turn) != 2:
            raise InvalidTurnError(f"turns[{i}] is {turn!r:.80}; pass (role, content) pairs")
        rows.append((check_role(turn[0], f"turns[{i}] role"),
                     check_str(turn[1], f"turns[{i}] content", InvalidTurnError)))
    return rows


def content_hash(text: str) -> str:
    """The facts table's content_hash of a text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def fact_from_row(row: tuple[Any, ...]) -> StoredFact:
    """A StoredFact from a row of the facts table."""
    (fact_id, user_id, session_id, text, tokens, embedding, metadata, created, updated,
     valid_from, valid_to, superseded_by, expires_at, pending, pinned) = row
    return StoredFact(FactId(fact_id), user_id, session_id, text,
                      tuple(np.frombuffer(tokens, dtype=TOKEN_DTYPE).tolist()), bytes(embedding),
                      json.loads(metadata), created, updated, valid_from=valid_from,
                      valid_to=valid_to,
                      superseded_by=None if superseded_by is None else FactId(superseded_by),
                      expires_at=expires_at, pending=bool(pending), pinned=bool(pinned))
