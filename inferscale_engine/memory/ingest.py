"""The write path of add(): one NewFact per fact, through each step once, downhill.

    new_facts      texts or turns -> NewFact (text, turn, token ids, vector)   outside the lock
    duplicates     NewFact.duplicate_of: an indexed fact or an earlier one of the call
    contexts       NewFact.context: what each kept fact is encoded after
    store          NewFact.fact_id: the kept facts and the turns, one transaction
    (register)     registration.py makes them servable, in chunks, after the lock
    results        one AddResult per NewFact, in order

Memory.add (main.py) runs the steps; the rules of each live here. A later field of a fact (a
timestamp, an expiry) is one more field of NewFact, checked in AddInput and written by store().
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from inferscale_engine import checks
from inferscale_engine.config import EngineConfig
from inferscale_engine.errors import InvalidFactError, InvalidRequestError
from inferscale_engine.facts import FactId
from inferscale_engine.memory.expiry import expiration_time
from inferscale_engine.memory.search.filters import scope
from inferscale_engine.memory.search.index import RetrievalIndex
from inferscale_engine.memory.search.retrieval import Match, find_duplicates
from inferscale_engine.memory.store.fact_store import FactStore
from inferscale_engine.memory.store.records import StoredFact, Turn
from inferscale_engine.memory.store.reserved import context_metadata, scoped
from inferscale_engine.memory.types import AddResult
from inferscale_engine.prompting.contexts import (
    SIMILAR_CANDIDATES,
    Context,
    run_contexts,
    similar_context,
)
from inferscale_engine.prompting.prompt import FACT_FORMAT


@dataclass(slots=True)
class NewFact:
    """One fact on its way through add(), as a request travels through an engine.

    Each step fills its own field; nothing is passed beside it in parallel lists.
    """

    text: str
    turn: int | None
    """Index of the message of add(messages=...) the fact is made of; None for texts."""
    token_ids: tuple[int, ...]
    vector: torch.Tensor
    """[dim] float32, L2-normalized, on the index's device."""
    duplicate_of: Match | None = None
    """Set by duplicates(): the fact it repeats (then it is not stored), and the similarity."""
    context: Context = None
    """Set by contexts(): what the fact is encoded after (Context-Window Encoding)."""
    fact_id: FactId | None = None
    """Set by store(): the durable id."""

    @property
    def kept(self) -> bool:
        """Stored (not a duplicate)."""
        return self.duplicate_of is None


@dataclass(frozen=True, slots=True)
class AddInput:
    """add()'s arguments, checked: bad input is refused before any work (nothing stored)."""

    session_id: str | None
    metadata: dict[str, Any] | None
    """The app's metadata with the agent and run scopes (reserved keys) added."""
    texts: list[str]
    """The facts' texts (for messages: the content of each user or assistant turn)."""
    turn_of: list[int | None]
    """Per text, its message's index (None: added as a text)."""
    turns: list[tuple[str, str]] | None
    """(role, content) of every message; None when facts were added as texts."""
    valid_from: float | None = None
    """add()'s timestamp: when the facts became true (None: now)."""
    expires_at: float | None = None
    """When the facts expire (add's expiration_date), seconds since the epoch; None: never."""
    pinned: bool = False
    """The facts (and stored facts they repeat) are pinned (memory/pinning.py)."""

    @classmethod
    def checked(cls, texts: Sequence[str] | None, messages: Sequence[Mapping[str, str]] | None,
                session_id: str | None, metadata: Mapping[str, Any] | None,
                agent_id: str | None, run_id: str | None, timestamp: object = None,
                expiration_date: object = None, pinned: object = False) -> AddInput:
        """The arguments checked in add()'s order (InvalidFactError, InvalidTurnError, ...)."""
        if not isinstance(pinned, bool):
            raise InvalidRequestError(f"pinned must be True or False, got {pinned!r:.40}")
        valid_from = checks.check_time(timestamp, "timestamp", InvalidFactError)
        expires_at = expiration_time(expiration_date)
        session_id = checks.check_session(session_id)
        meta = scoped(checks.check_metadata(metadata), *scope(agent_id, run_id))
        if (texts is None) == (messages is None):
            raise InvalidRequestError("pass exactly one of texts=[...] (facts) or messages=[...] "
                                      "(conversation turns)")
        if messages is None:
            facts = [checks.check_text(t, f"texts[{i}]") for i, t in
                     enumerate(checks.check_list(texts, "texts", InvalidFactError))]
            return cls(session_id, meta, facts, [None] * len(facts), None, valid_from,
                       expires_at, pinned)
        turns = checks.check_messages(messages)
        made = turn_facts(turns)
        return cls(session_id, meta, [t for t, _ in made], [i for _, i in made], turns,
                   valid_from, expires_at, pinned)


def turn_facts(turns: list[tuple[str, str]]) -> list[tuple[str, int]]:
    """(fact text, message index) of every user/assistant turn with content.

    The one rule of which turns become facts: AddResult.turn tells callers which message a
    fact came from, so they never re-derive it.
    """
    return [(content.strip(), i) for i, (role, content) in enumerate(turns)
            if role in checks.FACT_ROLES and checks.has_visible(content)]


def infer_messages(texts: Sequence[str] | None, messages: Sequence[Mapping[str, str]] | None
                   ) -> list[dict[str, str]]:
    """add(..., infer=True)'s conversation: `messages`, or each text as a user message."""
    chat = checks.check_messages(messages if messages is not None else [
        {"role": "user", "content": t} for t in checks.check_list(texts, "texts",
                                                                  InvalidFactError)])
    return [{"role": role, "content": content} for role, content in chat]


def new_facts(request: AddInput, tokenize: Callable[[str], tuple[int, ...]],
              embed: Callable[[list[str]], torch.Tensor]) -> list[NewFact]:
    """Step 1: a NewFact per text, tokenized and embedded (run outside Memory's lock)."""
    token_ids = [tokenize(text) for text in request.texts]
    vectors = embed(request.texts)
    return [NewFact(text, turn, ids, vector) for text, turn, ids, vector in
            zip(request.texts, request.turn_of, token_ids, vectors, strict=True)]


def duplicates(facts: list[NewFact], index: RetrievalIndex, user_id: str,
               threshold: float | None, text_of: Callable[[FactId], str | None]) -> None:
    """Step 2: set each fact's duplicate_of (search/retrieval.py find_duplicates)."""
    if not facts:
        return
    vectors = torch.stack([f.vector for f in facts])
    matches = find_duplicates(index, user_id, vectors, threshold, [f.text for f in facts],
                              text_of)
    for fact, match in zip(facts, matches, strict=True):
        fact.duplicate_of = match


@dataclass(frozen=True, slots=True)
class ContextSources:
    """Where contexts come from: the store's turns and facts, the index, EngineConfig."""

    store: FactStore
    index: RetrievalIndex
    config: EngineConfig
    limit: int
    """Stored turns of a session (or the user's last facts) read as context."""
    prompt_line: Callable[[FactId], tuple[str, int] | None]
    """(text, prompt-line tokens) of a served fact id, or None if it is gone."""


def contexts(facts: list[NewFact], request: AddInput, user_id: str,
             sources: ContextSources) -> None:
    """Step 3: set what each kept fact is encoded after.

    A turn's fact: the session's turns before it. A fact added as text (config.
    context_source): 'similar', the user's earlier facts most similar to it
    (similar_fact_contexts); 'recent', the user's facts right before it (the kept ones of this
    call included; duplicates get none: they are not stored), with config.context_run_tokens
    > 0 as runs of facts (RunContext), each run encoded in one request.
    """
    store, config, limit = sources.store, sources.config, sources.limit
    if request.turns is not None:
        earlier = store.recent_turns(user_id=user_id, session_id=request.session_id,
                                     limit=limit)
        found: list[Context] = list(turn_contexts(earlier, request.turns,
                                                  [f.turn or 0 for f in facts]))
        for fact, context in zip(facts, found, strict=True):
            fact.context = context
        return
    kept = [f for f in facts if f.kept]
    if not kept:
        return
    texts, lengths = [f.text for f in kept], [len(f.token_ids) for f in kept]
    if config.context_source == "similar":
        vectors = torch.stack([f.vector for f in kept])
        found = list(similar_fact_contexts(sources.index, user_id, vectors, texts, lengths,
                                           window=config.context_window_tokens,
                                           stored=sources.prompt_line))
    else:
        recent = [f.text for f in store.recent_facts(user_id=user_id, limit=limit)]
        found = list(run_contexts(recent, texts, lengths, run_tokens=config.context_run_tokens,
                                  lead_facts=limit)
                     if config.context_run_tokens else fact_contexts(recent, texts, limit))
    for fact, context in zip(kept, found, strict=True):
        fact.context = context


def store(facts: list[NewFact], request: AddInput, user_id: str, fact_store: FactStore,
          pending: bool = False) -> list[StoredFact]:
    """Step 4: write the kept facts and the turns in one transaction; set their fact_id.

    Returns the kept facts' records as stored (for registration). pending: an asynchronous
    add's facts, whose vectors stand in until the background queue embeds them.
    """
    kept = [f for f in facts if f.kept]
    ids = fact_store.add_facts(
        user_id=user_id, texts=[f.text for f in kept], token_ids=[f.token_ids for f in kept],
        embeddings=[f.vector for f in kept], session_id=request.session_id,
        metadata=[{**(request.metadata or {}), **context_metadata(f.context)} for f in kept],
        turns=request.turns or (), valid_from=request.valid_from, pending=pending,
        expires_at=request.expires_at, pinned=request.pinned)
    for fact, fact_id in zip(kept, ids, strict=True):
        fact.fact_id = fact_id
    return fact_store.get(user_id=user_id, fact_ids=ids) if ids else []


def repeated(facts: list[NewFact]) -> list[FactId]:
    """The stored facts that facts of this call duplicate (a pinned add pins them too)."""
    return [f.duplicate_of[0] for f in facts
            if f.duplicate_of is not None and not isinstance(f.duplicate_of[0], tuple)]


def kept_vectors(facts: list[NewFact]) -> torch.Tensor:
    """[kept, dim] the stored facts' embeddings, in store() order."""
    kept = [f.vector for f in facts if f.kept]
    return torch.stack(kept) if kept else torch.empty(0)


def results(facts: list[NewFact]) -> list[AddResult]:
    """Step 6, add()'s answer: per fact its new id, or the id of the fact it duplicates."""
    out = []
    for fact in facts:
        if fact.duplicate_of is None:
            assert fact.fact_id is not None
            out.append(AddResult(fact.fact_id, fact.text, "ADD", turn=fact.turn))
            continue
        target, score = fact.duplicate_of
        fact_id = facts[target[0]].fact_id if isinstance(target, tuple) else target
        assert fact_id is not None
        out.append(AddResult(fact_id, fact.text, "DUPLICATE", score, turn=fact.turn))
    return out


# ---- context rules -------------------------------------------------------------------------
def turn_contexts(earlier: list[Turn], turns: list[tuple[str, str]],
                  positions: list[int]) -> list[str | None]:
    """Per turn fact, the text of the session's turns before it: stored ones, then this call's.

    The engine keeps the last W tokens of it (EngineConfig.context_window_tokens).
    """
    history = [f"{t.role}: {t.content}\n" for t in earlier]
    history += [f"{role}: {content}\n" for role, content in turns]
    return ["".join(history[:len(earlier) + p]) or None for p in positions]


def similar_fact_contexts(index: RetrievalIndex, user_id: str, vectors: torch.Tensor,
                          texts: Sequence[str], lengths: Sequence[int], *, window: int,
                          stored: Callable[[FactId], tuple[str, int] | None]
                          ) -> list[str | None]:
    """Per new fact, a context of the user's earlier facts most similar to it.

    EngineConfig.context_source 'similar': the user's stored facts and this call's facts
    before it, picked by cosine similarity while they fit W tokens, in the order they were
    added (contexts.similar_context).

    Args:
        vectors: [n, dim] L2-normalized embeddings of the new facts.
        texts, lengths: the new facts and the token counts of their prompt lines.
        stored: (text, prompt-line tokens) of a stored fact id, or None if it is gone.
    """
    if not window:
        return [None] * len(texts)
    known = index.similar_many(user_id=user_id, embeddings=vectors, threshold=-1.0,
                               limit=SIMILAR_CANDIDATES)
    within = vectors @ vectors.T  # [n, n]
    out = []
    for i, similar in enumerate(known):
        candidates = [((0, int(fact_id)), score, *found) for fact_id, score in similar
                      if (found := stored(fact_id)) is not None]
        if i:
            scores, earlier = within[i, :i].topk(min(i, SIMILAR_CANDIDATES))
            candidates += [((1, j), score, texts[j], lengths[j])
                           for score, j in zip(scores.tolist(), earlier.tolist(), strict=True)]
        out.append(similar_context(candidates, window))
    return out


def fact_contexts(earlier: Sequence[str], texts: Sequence[str], limit: int = 16
                  ) -> list[str | None]:
    """Per new fact, the memory block of the user's `limit` facts before it, as in prompts.

    Stored facts first, then this call's; the engine keeps the last W tokens. Facts added as
    texts are encoded after their predecessors, as facts of one conversation are: a fact
    encoded alone (W=0) loses the cross-fact context a prompt gives it. Bounded by `limit`, so
    a call of n facts builds O(n * limit) text, not O(n^2).
    """
    history = [FACT_FORMAT.format(text=t) for t in (*earlier, *texts)]
    return ["".join(history[max(0, len(earlier) + i - limit):len(earlier) + i]) or None
            for i in range(len(texts))]
