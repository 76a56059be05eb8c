"""What a fact is encoded after (Context-Window Encoding), and runs of facts encoded together.

A fact's KV is computed once, in a save prompt [preamble][context tokens][fact]. Two kinds of
context:

  str         the text that preceded the fact (a conversation, the user's earlier facts); the
              last W tokens of it are kept (EngineConfig.context_window_tokens)
  RunContext  the fact is one of a run of facts added together: the last W tokens of the
              run's lead text, then the run's facts before it, token for token as they appear
              in prompts. Every fact of a run sees at least W tokens before it and at most
              W + EngineConfig.context_run_tokens, and the run costs ONE save request (the
              write path sees that the contexts chain), instead of one of W + fact tokens per
              fact.

A text context is usually the facts right before the fact (`fact_contexts` in the memory
layer); `similar_contexts` builds it from the user's earlier facts MOST SIMILAR to the fact
instead, in the order they were added, which is what precedes a fact in a prompt whose facts
were retrieved for a query close to it.

Both are plain data (stored in a fact's metadata by the memory layer), so a fact's KV is
rebuilt from exactly the same tokens after a restart or an eviction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferscale_engine.errors import InvalidFactError
from inferscale_engine.prompting.prompt import FACT_FORMAT


@dataclass(frozen=True, slots=True)
class RunContext:
    """The context of a fact of a run: see the module docstring."""

    lead: str | None
    """Text before the run (its last W tokens are kept), or None."""
    facts: tuple[str, ...] = ()
    """Texts of the run's facts before this one, in order (each encoded as in prompts)."""

    def to_json(self) -> dict[str, Any]:
        """JSON form (a fact's metadata)."""
        return {"lead": self.lead, "facts": list(self.facts)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunContext:
        """Inverse of to_json.

        Raises:
            InvalidFactError: `data` is not a run context.
        """
        lead, facts = data.get("lead"), data.get("facts")
        if (lead is not None and not isinstance(lead, str)) or not isinstance(
                facts, list | tuple) or not all(isinstance(t, str) for t in facts):
            raise InvalidFactError(f"malformed run context {dict(data)!r:.80}: expected "
                                   "{'lead': str | None, 'facts': [str, ...]}")
        return cls(lead, tuple(facts))


SIMILAR_CANDIDATES = 64
"""Most similar earlier facts considered per fact (similar_contexts, the memory layer)."""

Context = str | RunContext | None
"""What add_facts takes per fact."""


def run_contexts(earlier: Sequence[str], texts: Sequence[str], lengths: Sequence[int], *,
                 run_tokens: int, lead_facts: int) -> list[RunContext]:
    """Contexts of facts added together, cut into runs of at most `run_tokens` fact tokens.

    A run's lead is its `lead_facts` preceding facts (the user's earlier ones, then this call's
    before the run), formatted as in prompts; a run holds at least one fact.

    Args:
        earlier: the user's facts before these, oldest first.
        texts: the new facts, in order; lengths: their token counts.
    """
    out: list[RunContext] = []
    history = [FACT_FORMAT.format(text=t) for t in earlier]
    start, used = 0, 0
    if len(texts) != len(lengths):
        raise ValueError(f"{len(texts)} texts but {len(lengths)} lengths")
    for i, length in enumerate(lengths):
        if i > start and used + length > run_tokens:
            start, used = i, 0
        if i == start:
            before = [*history, *(FACT_FORMAT.format(text=t) for t in texts[:i])]
            lead = "".join(before[-lead_facts:]) if lead_facts else ""
        out.append(RunContext(lead or None, tuple(texts[start:i])))
        used += length
    return out


def context_texts(contexts: Iterable[object]) -> list[str]:
    """The distinct texts context_tokens() encodes for these contexts, to encode in a batch."""
    texts = (c if isinstance(c, str) else c.lead if isinstance(c, RunContext) else None
             for c in contexts)
    return list(dict.fromkeys(t for t in texts if t))


def context_tokens(context: object, window: int, encode: Callable[[str], Sequence[int]],
                   fact_ids: Callable[[str], Sequence[int]], *, limit: int) -> tuple[int, ...]:
    """The token ids a fact is encoded after.

    Args:
        context: None, a str or a RunContext (see the module docstring).
        window: W, tokens kept of a text context or of a run's lead.
        encode: text -> token ids; fact_ids: fact text -> its token ids as in prompts.
        limit: most context tokens allowed (W + EngineConfig.context_run_tokens).

    Raises:
        InvalidFactError: `context` is of another type, or a run context exceeds `limit`.
    """
    if context is None:
        return ()
    if isinstance(context, RunContext):
        lead = tuple(encode(context.lead))[-window:] if context.lead and window else ()
        ids = lead + tuple(t for text in context.facts for t in fact_ids(text))
        if len(ids) > limit:
            raise InvalidFactError(
                f"a run context of {len(ids)} tokens is longer than context_window_tokens + "
                f"context_run_tokens ({limit}); cut runs with contexts.run_contexts")
        return ids
    if not isinstance(context, str):
        raise InvalidFactError(f"a context must be a string, a RunContext or None, got "
                               f"{type(context).__name__}")
    return tuple(encode(context))[-window:] if window else ()


def similar_context(candidates: Iterable[tuple[Any, float, str, int]], window: int
                    ) -> str | None:
    """The context made of the candidates most similar to a fact, or None.

    Candidates are picked by similarity, best first, while their prompt lines fit `window`
    tokens, and written in added order (by their order key, as a prompt orders facts),
    formatted as in prompts. The engine keeps the last W tokens of a context; the picked
    lines fit W (up to tokenizer merges across line ends).

    Args:
        candidates: (order key, similarity, text, tokens of the text's prompt line) of the
            earlier facts the context may use.
        window: W, the token budget.
    """
    picked, used = [], 0
    for order, _, text, length in sorted(candidates, key=lambda c: -c[1]):
        if used + length <= window:
            picked.append((order, text))
            used += length
    return "".join(FACT_FORMAT.format(text=text) for _, text in sorted(picked)) or None


def similar_contexts(vectors: Any, lengths: Sequence[int], texts: Sequence[str], *,
                     window: int, first_new: int = 0) -> list[str | None]:
    """Per fact from `first_new` on, its similar_context among the facts before it.

    Args:
        vectors: [n, dim] L2-normalized embeddings of all n facts (numpy or CPU torch),
            in added order.
        lengths: tokens of each fact's prompt line (FACT_FORMAT), n of them.
        texts: the n facts' texts.
        window: W, the token budget of a context.
        first_new: index of the first fact that needs a context (those before it are the
            user's earlier facts).
    """
    import numpy as np

    matrix = np.asarray(vectors, dtype=np.float32)
    if not len(matrix) == len(lengths) == len(texts):
        raise ValueError(f"{len(matrix)} vectors, {len(lengths)} lengths, {len(texts)} texts")
    out: list[str | None] = []
    for i in range(first_new, len(texts)):
        scores = matrix[:i] @ matrix[i]
        top = np.argpartition(-scores, SIMILAR_CANDIDATES)[:SIMILAR_CANDIDATES] if (
            i > SIMILAR_CANDIDATES) else range(i)
        out.append(similar_context(((int(j), float(scores[j]), texts[j], lengths[j])
                                    for j in top), window))
    return out
