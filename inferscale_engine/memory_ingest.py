"""What Memory makes of its input: checked arguments, turn facts and their contexts, duplicates.

Each check raises the specific InferScaleError, with a message that says what to do next.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from inferscale_engine.errors import (
    InvalidFactError,
    InvalidTurnError,
    InvalidUserIdError,
)
from inferscale_engine.facts import FactId
from inferscale_engine.memory_config import AddResult
from inferscale_engine.retrieval import RetrievalIndex
from inferscale_engine.store import Turn

if TYPE_CHECKING:
    from inferscale_engine.engine import Engine

CONTEXT_KEY = "inferscale.context"
"""Metadata key holding the conversation a turn fact was encoded after (Context-Window
Encoding), so that its KV is rebuilt exactly. Keys starting with 'inferscale.' are reserved."""
ROLES = ("system", "user", "assistant", "tool")
FACT_ROLES = ("user", "assistant")
"""Turns whose content becomes a fact."""

Match = tuple[FactId | tuple[int], float]
"""What a new fact duplicates: an existing fact id, or (position,) of an earlier fact of the
same call; and the cosine similarity."""


# ---- turns -> facts ----------------------------------------------------------------------
def turn_facts(turns: list[tuple[str, str]]) -> list[tuple[str, int]]:
    """(fact text, turn position) of every user/assistant turn with content."""
    return [(content.strip(), i) for i, (role, content) in enumerate(turns)
            if role in FACT_ROLES and content.strip()]


def turn_contexts(earlier: list[Turn], turns: list[tuple[str, str]],
                  positions: list[int]) -> list[str | None]:
    """Per turn fact, the text of the session's turns before it: stored ones, then this call's.

    The engine keeps the last W tokens of it (EngineConfig.context_window_tokens).
    """
    history = [f"{t.role}: {t.content}\n" for t in earlier]
    history += [f"{role}: {content}\n" for role, content in turns]
    return ["".join(history[:len(earlier) + p]) or None for p in positions]


def find_duplicates(index: RetrievalIndex, user_id: str, vectors: torch.Tensor,
                    threshold: float | None) -> list[Match | None]:
    """Per new fact (vectors: [n, dim], L2-normalized): None, or the fact it duplicates.

    A fact duplicates the most similar of the user's indexed facts and the earlier facts of the
    same call when that similarity is >= threshold; None disables detection.
    """
    if threshold is None or not len(vectors):
        return [None] * len(vectors)
    within = vectors @ vectors.T  # [n, n]
    matches: list[Match | None] = []
    for i, nearest in enumerate(index.nearest_many(user_id=user_id, embeddings=vectors)):
        best: Match | None = nearest if nearest is not None and nearest[1] >= threshold else None
        if i:
            j = int(torch.argmax(within[i, :i]))
            score = float(within[i, j])
            if score >= threshold and (best is None or score > best[1]):
                earlier = matches[j]  # a duplicate of a duplicate names the original
                best = (earlier[0] if earlier else (j,), score)
        matches.append(best)
    return matches


def add_results(texts: list[str], matches: list[Match | None],
                new_ids: dict[int, FactId]) -> list[AddResult]:
    """add()'s answer: per fact, its new id (by position), or what it duplicates."""
    results = []
    for i, (text, match) in enumerate(zip(texts, matches, strict=True)):
        if match is None:
            results.append(AddResult(new_ids[i], text, "ADD"))
        else:
            target, score = match
            fact_id = new_ids[target[0]] if isinstance(target, tuple) else target
            results.append(AddResult(fact_id, text, "DUPLICATE", score))
    return results


def fact_tokens(engine: Engine, text: str) -> tuple[int, ...]:
    """A fact's token ids, checked against max_fact_tokens before anything is stored."""
    token_ids = engine.prompts.fact_ids(text)
    limit = engine.config.max_fact_tokens
    if len(token_ids) > limit:
        raise InvalidFactError(f"a fact has {len(token_ids)} tokens, over max_fact_tokens="
                               f"{limit}; split it or raise EngineConfig.max_fact_tokens: "
                               f"{text[:60]!r}")
    return token_ids


def public_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """Metadata without InferScale's reserved keys."""
    return {k: v for k, v in metadata.items() if not k.startswith("inferscale.")}


# ---- argument checks ---------------------------------------------------------------------
def check_str(value: object, what: str, error: type[Exception]) -> str:
    """`value` if it is a str of valid Unicode (possibly blank)."""
    if isinstance(value, bytes | bytearray | memoryview):
        raise error(f"{what} is {type(value).__name__}, not text; decode it first, e.g. "
                    "data.decode('utf-8', errors='replace')")
    if not isinstance(value, str):
        raise error(f"{what} must be a str, got {type(value).__name__} {value!r:.60}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(f"{what} is not valid Unicode: a lone surrogate at index {exc.start} "
                    "(bytes decoded with 'surrogateescape'?); decode the source with its real "
                    "encoding or errors='replace'") from None
    return value


def check_text(value: object, what: str, error: type[Exception] = InvalidFactError) -> str:
    """`value` stripped, if it is valid Unicode text with content."""
    if not check_str(value, what, error).strip():
        raise error(f"{what} is empty or whitespace ({value!r:.20}); pass text with content")
    return str(value).strip()


def check_user_id(user_id: object) -> str:
    """A user id: any non-blank str of valid Unicode, used as given."""
    check_str(user_id, "user_id", InvalidUserIdError)
    if not str(user_id).strip():
        raise InvalidUserIdError(f"user_id is empty or blank ({user_id!r:.20}); pass the same "
                                 "non-empty id for every call of one user")
    return str(user_id)


def check_session(session_id: object) -> str | None:
    """None or a non-blank session id."""
    if session_id is None:
        return None
    check_text(session_id, "session_id", InvalidTurnError)
    return str(session_id)


def check_list(values: object, what: str, error: type[Exception]) -> Sequence[Any]:
    """`values` if it is a list-like sequence (not a str, bytes or dict)."""
    if isinstance(values, str | bytes | bytearray | Mapping) or not isinstance(values, Sequence):
        raise error(f"{what} must be a list, got {type(values).__name__} {values!r:.60}; wrap "
                    f"a single item: {what}=[...]")
    return values


def check_messages(messages: object) -> list[tuple[str, str]]:
    """(role, content) of role/content dicts; content may be blank (it is not made a fact)."""
    turns = []
    for i, message in enumerate(check_list(messages, "messages", InvalidTurnError)):
        if not isinstance(message, Mapping) or message.get("role") not in ROLES:
            raise InvalidTurnError(f"messages[{i}] is {message!r:.80}; pass dicts with role in "
                                   f"{ROLES} and str content")
        content = check_str(message.get("content"), f"messages[{i}] content", InvalidTurnError)
        turns.append((str(message["role"]), content))
    return turns


def check_metadata(metadata: object) -> dict[str, Any] | None:
    """None or a JSON-serializable dict with str keys, none of them reserved."""
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata):
        raise InvalidFactError(f"metadata is {metadata!r:.80}; pass a dict with string keys")
    if any(k.startswith("inferscale.") for k in metadata):
        raise InvalidFactError("metadata keys starting with 'inferscale.' are reserved; rename "
                               "them")
    try:
        json.dumps(dict(metadata), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidFactError(f"metadata is not JSON-serializable ({exc}); use str, int, "
                               "finite float, bool, None, lists and dicts") from None
    return dict(metadata)


def check_fact_ids(fact_ids: object, what: str = "fact_ids") -> list[FactId]:
    """Fact ids as add() returned them: a list of positive ints (`what`: a single one's name)."""
    ids = check_list(fact_ids, what, InvalidFactError)
    for i, fact_id in enumerate(ids):
        if isinstance(fact_id, bool) or not isinstance(fact_id, numbers.Integral) or fact_id < 1:
            name = what if what != "fact_ids" else f"fact_ids[{i}]"
            raise InvalidFactError(f"{name} is {fact_id!r:.40}; pass fact ids as returned by "
                                   "add() (positive ints)")
    return [FactId(int(f)) for f in ids]
