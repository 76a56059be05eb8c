"""What Memory makes of its input: turn facts and their contexts, duplicates, add() results.

Argument checks live in inferscale_engine.checks (one implementation for every layer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from inferscale_engine import checks
from inferscale_engine.config import EngineConfig
from inferscale_engine.facts import FactId
from inferscale_engine.memory.search.index import RetrievalIndex
from inferscale_engine.memory.store.fact_store import FactStore
from inferscale_engine.memory.store.records import StoredFact, Turn
from inferscale_engine.memory.store.reserved import context_metadata
from inferscale_engine.memory.types import AddResult
from inferscale_engine.prompting.contexts import (
    SIMILAR_CANDIDATES,
    Context,
    run_contexts,
    similar_context,
)
from inferscale_engine.prompting.prompt import FACT_FORMAT

_DUPLICATE_CANDIDATES = 8
"""Most similar indexed facts compared by text per new fact."""

Match = tuple[FactId | tuple[int], float]
"""What a new fact duplicates: an existing fact id, or (position,) of an earlier fact of the
same call; and the cosine similarity."""


# ---- turns -> facts ----------------------------------------------------------------------
def turn_facts(turns: list[tuple[str, str]]) -> list[tuple[str, int]]:
    """(fact text, turn position) of every user/assistant turn with content."""
    return [(content.strip(), i) for i, (role, content) in enumerate(turns)
            if role in checks.FACT_ROLES and checks.has_visible(content)]


def turn_contexts(earlier: list[Turn], turns: list[tuple[str, str]],
                  positions: list[int]) -> list[str | None]:
    """Per turn fact, the text of the session's turns before it: stored ones, then this call's.

    The engine keeps the last W tokens of it (EngineConfig.context_window_tokens).
    """
    history = [f"{t.role}: {t.content}\n" for t in earlier]
    history += [f"{role}: {content}\n" for role, content in turns]
    return ["".join(history[:len(earlier) + p]) or None for p in positions]


@dataclass(frozen=True, slots=True)
class SimilarSource:
    """What similar-facts contexts need (EngineConfig.context_source 'similar')."""

    index: RetrievalIndex
    vectors: torch.Tensor
    """[n, dim] L2-normalized embeddings of the call's facts."""
    stored: Callable[[FactId], tuple[str, int] | None]
    """(text, prompt-line tokens) of a stored fact id, or None if it is gone."""


def contexts(store: FactStore, user_id: str, session_id: str | None,
             turns: list[tuple[str, str]] | None, facts: list[tuple[str, int]],
             keep: list[int], limit: int, lengths: Sequence[int], config: EngineConfig,
             similar: SimilarSource) -> list[Context]:
    """Per new fact (text, turn position), what it is encoded after.

    A turn's fact: the session's turns before it. A fact added as text (config.
    context_source): 'similar', the user's earlier facts most similar to it
    (similar_fact_contexts); 'recent', the user's facts right before it (the kept ones of this
    call included; duplicates get none: they are not stored), with config.context_run_tokens
    > 0 as runs of facts (RunContext), each run encoded in one request.

    Args:
        lengths: token counts of `facts`.
    """
    if turns is not None:
        earlier = store.recent_turns(user_id=user_id, session_id=session_id, limit=limit)
        return list[Context](turn_contexts(earlier, turns, [p for _, p in facts]))
    texts = [facts[i][0] for i in keep]
    kept: list[Context]
    if config.context_source == "similar":
        kept = list(similar_fact_contexts(
            similar.index, user_id, similar.vectors[keep], texts, [lengths[i] for i in keep],
            window=config.context_window_tokens, stored=similar.stored))
    else:
        recent = [f.text for f in store.recent_facts(user_id=user_id, limit=limit)]
        kept = list(run_contexts(recent, texts, [lengths[i] for i in keep],
                                 run_tokens=config.context_run_tokens, lead_facts=limit)
                    if config.context_run_tokens else fact_contexts(recent, texts, limit))
    out: list[Context] = [None] * len(facts)
    for i, context in zip(keep, kept, strict=True):
        out[i] = context
    return out


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


def find_duplicates(index: RetrievalIndex, user_id: str, vectors: torch.Tensor,
                    threshold: float | None, texts: Sequence[str],
                    text_of: Callable[[FactId], str | None]) -> list[Match | None]:
    """Per new fact (vectors: [n, dim], L2-normalized): None, or the fact it duplicates.

    A fact duplicates one of the user's indexed facts, or an earlier fact of the same call,
    when BOTH their cosine similarity is >= threshold AND their texts say the same words
    (checks.same_text). The embedding alone never drops a fact: models map texts they cannot
    read (emoji, rare scripts) to one vector. threshold None disables detection.

    Args:
        texts: the new facts' texts, one per row of `vectors`.
        text_of: text of an indexed fact id (None if unknown).
    """
    if threshold is None or not len(vectors):
        return [None] * len(vectors)
    within = vectors @ vectors.T  # [n, n]
    candidates = index.similar_many(user_id=user_id, embeddings=vectors, threshold=threshold,
                                    limit=_DUPLICATE_CANDIDATES)
    matches: list[Match | None] = []
    for i, similar in enumerate(candidates):
        best: Match | None = next(((fact_id, score) for fact_id, score in similar
                                   if (known := text_of(fact_id)) is not None
                                   and checks.same_text(known, texts[i])), None)
        for j in range(i):
            score = float(within[i, j])
            if score >= threshold and (best is None or score > best[1]) and checks.same_text(
                    texts[j], texts[i]):
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


def store_facts(store: FactStore, user_id: str, session_id: str | None,
                metadata: dict[str, Any] | None, texts: list[str],
                token_ids: list[tuple[int, ...]], vectors: torch.Tensor,
                contexts: list[Context], turns: Sequence[tuple[str, str]]) -> list[StoredFact]:
    """Write facts and turns in one transaction; returns the facts' records as stored."""
    metas = [{**(metadata or {}), **context_metadata(c)} for c in contexts]
    ids = store.add_facts(user_id=user_id, texts=texts, token_ids=token_ids,
                          embeddings=list(vectors), metadata=metas, session_id=session_id,
                          turns=turns)
    return store.get(user_id=user_id, fact_ids=ids) if ids else []
