"""In-process plan handoff: the embedded engine hands its plans to vLLM's scheduler by reference.

With the embedded default (VLLM_ENABLE_V1_MULTIPROCESSING=0) the app, vLLM's EngineCore and
the scheduler-side connector share one process, so a plan need not be encoded, signed, parsed
and MAC-checked to cross a boundary it never crosses (a fifth of the host work a kv request
adds at k=100: docs/benchmarks.md, the defaults' figures). The engine puts the plan here
under a fresh random reference and sends only the reference in the request's
kv_transfer_params; the scheduler takes it back, once, and still checks what no reference
vouches for: the prompt's cache_salt and token ids (design invariant 6 of docs/how-it-works.md:
the connector never trusts a plan). The ids are checked by identity when the engine handed
over the prompt list with the plan (it does when that list holds the very tuples the plan's
runs were packed from) and vLLM carried that list through; otherwise id by id. The worker
re-checks ownership as always (invariant 5: a user's request reaches only that user's facts).

A reference is 128 random bits, bound to the engine that made it (a digest of its secret), and
lives from the engine's prepare until the scheduler takes it or the engine's batch ends. One
that is unknown here (made in another process, already taken, guessed) is refused like a plan
whose MAC fails: the connector claims nothing and vLLM prefills the prompt. Plans that cross a
process (EngineCore in a process of its own, `inferscale serve`, data parallelism) travel
signed, as before.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from typing import Any

from inferscale_engine.protocol.plan import PARAMS_KEY, PLAN_VERSION, InjectionPlan

LOCAL_KIND = "local"
"""kv_transfer_params kind of a plan handed over by reference."""

MAX_PENDING = 1 << 16
"""Plans held at most (the oldest go first): a bound, should an engine never end its batch."""

_PENDING: dict[str, tuple[bytes, InjectionPlan, list[int] | None, int]] = {}
"""reference -> (engine tag, plan, the prompt's id list and its length, or None and 0), for every
engine of this process (insertion ordered)."""


def engine_tag(secret: bytes) -> bytes:
    """The identity a reference is bound to: a digest of the engine's plan secret."""
    return hashlib.blake2b(secret, digest_size=16, person=b"inferscale-ref").digest()


class PlanHandoff:
    """One engine's side of the handoff: put plans, end a batch's references."""

    def __init__(self, secret: bytes) -> None:
        self._tag = engine_tag(secret)

    def put(self, plan: InjectionPlan, prompt_ids: list[int] | None = None
            ) -> tuple[str, dict[str, Any]]:
        """Hold `plan` (unsigned is fine) under a new reference; (reference, the params).

        prompt_ids: the very list the engine hands vLLM as the prompt, when the engine vouches
        that it starts with exactly the plan's tokens (RequestPlanner builds both from the same
        tuples). The scheduler then checks the prompt by identity (see `take`).
        """
        ref = os.urandom(16).hex()
        if len(_PENDING) >= MAX_PENDING:
            _PENDING.pop(next(iter(_PENDING), ""), None)
        _PENDING[ref] = (self._tag, plan, prompt_ids,
                         len(prompt_ids) if prompt_ids is not None else 0)
        return ref, {PARAMS_KEY: {"v": PLAN_VERSION, "kind": LOCAL_KIND, "ref": ref}}

    @staticmethod
    def discard(refs: Iterable[str]) -> None:
        """Drop references the scheduler did not take (a request vLLM refused or aborted)."""
        for ref in refs:
            _PENDING.pop(ref, None)


def take(tag: bytes, params: Any, prompt: list[int] | None = None
         ) -> tuple[InjectionPlan, bool] | None:
    """The plan a local reference names, removed, and whether `prompt` is the vouched list.

    None if the reference is unknown here or another engine's. `params` is the InferScale
    entry of kv_transfer_params (kind LOCAL_KIND). The bool is True when `prompt` is the very
    list object the engine put with the plan, at the length it had then: vLLM carried the
    engine's prompt through, so its ids are the plan's without comparing ~2,500 of them one by
    one (invariant 6 by identity). vLLM builds a new list for a prompt it rewrites; in place it
    only appends or pops at the end (streaming input), which the length check sees. Anything
    else is compared id by id, as a signed plan is.
    """
    ref = params.get("ref")
    held = _PENDING.pop(ref, None) if type(ref) is str else None  # one atomic step: taken once
    if held is None:
        return None
    if held[0] != tag or params.get("v") != PLAN_VERSION:
        _PENDING[ref] = held  # another engine's: it stays for that one
        return None
    _, plan, vouched, length = held
    return plan, vouched is not None and prompt is vouched and len(prompt) == length


def num_pending() -> int:
    """References held in this process (0 between batches: nothing leaks)."""
    return len(_PENDING)
