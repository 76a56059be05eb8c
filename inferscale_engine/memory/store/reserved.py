"""Metadata keys InferScale reserves in a fact's metadata ('inferscale.*'), and their rules.

A fact's app metadata is the app's; these keys ride beside it in the same column, so that a
fact's KV can be rebuilt exactly (the context it was encoded after) and mem0's scopes survive
(agent_id, run_id). Reads strip them (public_record); updates keep them (with_context).
Fact fields that later features add (validity, expiry) are columns (schema.py), not keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from inferscale_engine.memory.store.records import StoredFact
from inferscale_engine.prompting.contexts import Context, RunContext

RESERVED_PREFIX = "inferscale."
"""Keys starting with this are InferScale's; an app's own keys never do."""

CONTEXT_KEY = "inferscale.context"
"""Metadata key holding what a fact was encoded after (Context-Window Encoding): the text
before it, or a run context as JSON ({"lead": ..., "facts": [...]}), so that its KV is
rebuilt exactly. Keys starting with 'inferscale.' are reserved."""


def context_metadata(context: Context) -> dict[str, Any]:
    """The metadata entry that stores `context` (none for no context)."""
    if isinstance(context, RunContext):
        return {CONTEXT_KEY: context.to_json()}
    return {CONTEXT_KEY: context} if context else {}


def with_context(metadata: dict[str, Any] | None, old: Mapping[str, Any]
                 ) -> dict[str, Any] | None:
    """An updated fact's new metadata (None: unchanged), keeping its reserved keys."""
    if metadata is None:
        return None
    return {**metadata, **{k: v for k, v in old.items() if k.startswith(RESERVED_PREFIX)}}


AGENT_KEY, RUN_KEY = "inferscale.agent_id", "inferscale.run_id"
"""Metadata keys of the agent and run scopes (mem0's agent_id / run_id) a fact was added in."""


def scoped(metadata: dict[str, Any] | None, agent_id: str | None, run_id: str | None
           ) -> dict[str, Any] | None:
    """Metadata with the fact's agent and run scopes (checked ids) added."""
    scope = {key: value for key, value in ((AGENT_KEY, agent_id), (RUN_KEY, run_id))
             if value is not None}
    return {**(metadata or {}), **scope} if scope else metadata



INFER_KEY = "inferscale.infer"
"""Metadata key of a user message stored for add(infer=True, wait=False): a pending row the
background worker reads the served model's facts from, then deletes (memory/background.py)."""

SOURCE_KEY = "inferscale.source"
"""Metadata key of an imported fact: the identity of the record it was imported from
(store/transfer.py), which makes a second import of the same record add nothing."""


def stored_context(metadata: Mapping[str, Any]) -> Context:
    """The context a stored fact was encoded after (inverse of context_metadata)."""
    value = metadata.get(CONTEXT_KEY)
    return RunContext.from_json(value) if isinstance(value, Mapping) else value


def public_record(stored: StoredFact) -> StoredFact:
    """A stored fact as Memory returns it: public metadata, its agent and run scopes."""
    return replace(stored, metadata=public_metadata(stored.metadata),
                   agent_id=stored.metadata.get(AGENT_KEY), run_id=stored.metadata.get(RUN_KEY))


def public_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Metadata without InferScale's reserved keys."""
    return {k: v for k, v in metadata.items() if not k.startswith(RESERVED_PREFIX)}
