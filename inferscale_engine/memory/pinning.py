"""Pinning: the verbs that pin and unpin facts, and the pinned part of add() and update().

A pinned fact is in every answer of its user, right after the preamble and before the
retrieved facts (counted outside k; answering.py), and its KV never leaves the slab while it is
pinned (runtime/pins.py). The flag is durable (store/pinning.py): the store changes first, then
the engine follows; at start-up and on a shared store's sync, registration.py pins what the
store says. A superseded, expired or deleted fact is unpinned with it (it leaves the engine).
The caps are the engine's (EngineConfig.max_pinned_tokens, max_pinned_slab_fraction): over one,
InvalidRequestError and nothing changes.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence

from inferscale_engine import checks
from inferscale_engine.errors import FactNotFoundError, InvalidRequestError
from inferscale_engine.facts import FactId
from inferscale_engine.memory.expiry import has_expired
from inferscale_engine.memory.registration import RegisteredFacts
from inferscale_engine.memory.scope import Scopes
from inferscale_engine.memory.store import FactStore, StoredFact
from inferscale_engine.runtime.engine import Engine

logger = logging.getLogger(__name__)


class Pinning:
    """The pin verbs of Memory, and the checks add() and update() make for pinned facts."""

    def __init__(self, engine: Engine, store: FactStore, served: RegisteredFacts,
                 scopes: Scopes, counters: Counter[str]) -> None:
        self._engine, self._store, self._served = engine, store, served
        self._scopes, self.counters = scopes, counters

    def pin(self, *, user_id: str, fact_ids: Sequence[int]) -> list[FactId]:
        """Pin the user's current facts; returns those that were not pinned yet.

        They join every answer of the user, first, outside k, and their KV stays in the slab.

        Raises:
            FactNotFoundError: an id is unknown, another user's, superseded or expired.
            InvalidRequestError: over the user's or the slab's cap; nothing is pinned.
        """
        return self._set(user_id, fact_ids, True)

    def unpin(self, *, user_id: str, fact_ids: Sequence[int]) -> list[FactId]:
        """Unpin the user's facts (retrieved like any fact again); returns those that were.

        Raises:
            FactNotFoundError: an id is unknown, another user's, superseded or expired.
        """
        return self._set(user_id, fact_ids, False)

    def pinned(self, *, user_id: str) -> list[FactId]:
        """The user's pinned facts that are served, in the order they were added."""
        with self._scopes.user(user_id) as uid:
            return self._engine.pinned_facts(uid)

    def served_pins(self, user_id: str, exclude: Sequence[int] = ()) -> list[FactId]:
        """The pinned facts a request of the user starts with (under the Memory's lock)."""
        return [f for f in self._engine.pinned_facts(user_id)
                if f in self._served and f not in exclude]

    def check_add(self, user_id: str, token_counts: Sequence[int],
                  repeated: Sequence[FactId]) -> None:
        """Refuse a pinned add over a cap (under the lock, before anything is stored).

        Args:
            token_counts: the new facts' tokens.
            repeated: stored facts the add repeats (duplicates): pinned too.

        Raises:
            InvalidRequestError: over the user's or the slab's cap.
        """
        held = set(self._engine.pinned_facts(user_id))
        extra = [len(self._served[f].token_ids) for f in dict.fromkeys(repeated)
                 if f in self._served and f not in held]
        self._engine.check_pins(user_id, [*token_counts, *extra])

    def pin_repeated(self, user_id: str, repeated: Sequence[FactId]) -> None:
        """Pin the stored facts a pinned add repeated (under the lock, after check_add)."""
        ids = [f for f in dict.fromkeys(repeated) if f in self._served]
        if ids:
            self._store.set_pinned(user_id=user_id, fact_ids=ids, pinned=True)
            self._engine.pin(user_id, ids)

    def pinned_of(self, user_id: str, found: Mapping[FactId, Sequence[FactId]]
                  ) -> list[FactId]:
        """The new facts of an automatic supersession (new -> older facts) replacing a pin.

        Read under the lock, before the older facts are marked superseded.
        """
        older = [f for facts in found.values() for f in facts]
        pinned = {f.fact_id for f in self._store.get(user_id=user_id, fact_ids=older)
                  if f.pinned} if older else set()
        return [new for new, facts in found.items() if pinned & set(facts)]

    def carry(self, user_id: str, fact_ids: Sequence[FactId]) -> None:
        """Pin the newer facts that replaced pinned ones, as supersede() does.

        One over the pin caps is served unpinned (logged and counted).
        """
        for fact_id in fact_ids:
            try:
                self.pin(user_id=user_id, fact_ids=[fact_id])
            except (InvalidRequestError, FactNotFoundError) as exc:
                logger.warning("fact %s of %r replaced a pinned fact but stays unpinned: %s",
                               fact_id, user_id, exc)
                self.counters["pins_not_carried"] += 1

    def check_update(self, user_id: str, old: StoredFact, token_ids: Sequence[int]) -> None:
        """Refuse an update of a pinned fact whose new text passes the user's cap.

        Raises:
            InvalidRequestError: over the user's or the slab's cap; nothing changes.
        """
        if old.pinned and old.fact_id in self._served:
            self._engine.check_pins(user_id, [len(token_ids)], replacing=[old.fact_id])

    def _set(self, user_id: str, fact_ids: Sequence[int], pinned: bool) -> list[FactId]:
        user = self._scopes.user(user_id)
        ids = list(dict.fromkeys(checks.check_fact_ids(fact_ids)))
        with user as uid:
            stored = self._store.get(user_id=uid, fact_ids=ids)
            now = time.time()
            gone = [f.fact_id for f in stored if f.valid_to is not None or has_expired(f, now)]
            if gone:
                raise FactNotFoundError(f"fact(s) {gone} of {uid!r} were superseded or have "
                                        "expired; only current facts can be pinned or unpinned")
            served = [f.fact_id for f in stored if f.fact_id in self._served]
            if pinned:
                held = set(self._engine.pinned_facts(uid))
                self._engine.check_pins(uid, [len(f.token_ids) for f in stored
                                              if f.fact_id in self._served
                                              and f.fact_id not in held])
            changed = self._store.set_pinned(user_id=uid, fact_ids=ids, pinned=pinned)
            if pinned:
                self._engine.pin(uid, served)  # a pending fact is pinned once it is served
            else:
                self._engine.unpin(uid, served)
            self._served.wrote(self._store, uid)
            self.counters["pinned" if pinned else "unpinned"] += len(changed)
            return changed
