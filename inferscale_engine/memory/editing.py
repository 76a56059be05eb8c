"""Editing: the verbs that change stored facts (update, supersede, delete, reset, ...).

A plain part Memory holds and forwards to (main.py), as it does Listing and Answering. Each
change is durable first (one transaction), then the served facts follow it (registration.py):
forgotten, or registered again with their KV rebuilt.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from inferscale_engine import checks
from inferscale_engine.errors import FactNotFoundError
from inferscale_engine.facts import Fact
from inferscale_engine.memory.pinning import Pinning
from inferscale_engine.memory.registration import RegisteredFacts
from inferscale_engine.memory.scope import Scopes
from inferscale_engine.memory.search import filters
from inferscale_engine.memory.store import FactStore, StoredFact, reserved
from inferscale_engine.memory.types import AddResult


class Editing:
    """The verbs of Memory that change a user's stored facts or turns."""

    def __init__(self, store: FactStore, served: RegisteredFacts, scopes: Scopes,
                 counters: Counter[str], tokenize: Callable[[str, float | None], tuple[int, ...]],
                 embed: Callable[[list[str]], torch.Tensor], encode: bool,
                 records: Callable[..., list[StoredFact]],
                 add: Callable[..., list[AddResult]], pinning: Pinning) -> None:
        self._store, self._served, self._scopes, self.counters = store, served, scopes, counters
        self._tokenize, self._embed, self._encode = tokenize, embed, encode
        self._records = records
        """Memory.records (Listing): the facts delete_all selects."""
        self._add = add
        """Memory.add: what supersede adds the newer fact with."""
        self._pinning = pinning
        """Checks an update of a pinned fact against the caps; pins a supersede's newer fact."""

    def add_turns(self, *, user_id: str, session_id: str | None,
                  messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Record conversation turns only (no facts); returns their turn ids."""
        user = self._scopes.user(user_id, sync=False)
        session_id = checks.check_session(session_id)
        turns = checks.check_messages(messages)
        with user as uid:
            return self._store.add_turns(user_id=uid, session_id=session_id, turns=turns)

    def update(self, *, user_id: str, fact_id: int, text: str,
               metadata: Mapping[str, Any] | None = None) -> Fact:
        """Replace a fact's text (metadata=None keeps the old metadata); its KV is rebuilt.

        A pinned fact stays pinned.

        Raises:
            FactNotFoundError: the user has no such fact; nothing changes.
            InvalidRequestError: a pinned fact's new text passes a pin cap; nothing changes.
        """
        user = self._scopes.user(user_id)
        (fact_id,) = checks.check_fact_ids([fact_id], "fact_id")
        text = checks.check_text(text, "text")
        metadata = checks.check_metadata(metadata)
        vector = self._embed([text])[0]
        with user as uid:
            (old,) = self._store.get(user_id=uid, fact_ids=[fact_id])
            token_ids = self._tokenize(text, old.since)  # the fact keeps its date
            self._pinning.check_update(uid, old, token_ids)
            new = self._store.update(user_id=uid, fact_id=fact_id, text=text,
                                     token_ids=token_ids, embedding=vector,
                                     metadata=reserved.with_context(metadata, old.metadata))
            self._served.forget(uid, [fact_id])  # the new version is encoded afresh
            self._served.register(uid, [new], self._encode)
            self._served.wrote(self._store, uid)
            self.counters["updated"] += 1
            return new.to_fact()

    def supersede(self, *, user_id: str, fact_id: int, text: str | None = None,
                  timestamp: Any = None, metadata: Mapping[str, Any] | None = None
                  ) -> AddResult | None:
        """Replace a fact by a newer one, keeping the old one as history (mem0 v3's update).

        With `text`, a new fact is added (in the old fact's agent and run scope; metadata None:
        the old fact's) and the old one is marked superseded by it: it stays in the store
        (history SUPERSEDE; as-of reads find it) and leaves what search and answers serve.
        Without `text`, the fact just stops being true (at `timestamp`, default now). A pinned
        fact's newer fact is pinned in its place (InvalidRequestError, nothing changed, if its
        text would pass the pin caps).

        Returns:
            The new fact's AddResult (event 'UPDATE', supersedes=(fact_id,)); None without
            text.

        Raises:
            FactNotFoundError: the user has no such current fact; nothing changes.
        """
        user = self._scopes.user(user_id, sync=False)
        (fact_id,) = checks.check_fact_ids([fact_id], "fact_id")
        at = checks.check_time(timestamp, "timestamp")
        with user as uid:
            old = reserved.public_record(self._store.get(user_id=uid, fact_ids=[fact_id])[0])
        if old.valid_to is not None:
            raise FactNotFoundError(f"fact {fact_id} of {uid!r} was already superseded; "
                                    "supersede the fact that replaced it "
                                    f"({old.superseded_by})")
        new = None
        if text is not None:
            if old.pinned:  # the newer fact keeps the pin: checked before anything changes
                with self._scopes.user(uid) as uid:
                    self._pinning.check_update(uid, old, self._tokenize(text, at))
            (new,) = self._add(user_id=uid, texts=[text], dedupe=False, timestamp=at,
                               metadata=old.metadata if metadata is None else metadata,
                               agent_id=old.agent_id, run_id=old.run_id)
        with self._scopes.user(uid) as uid:
            done = self._store.supersede(user_id=uid, fact_ids=[fact_id],
                                         by=None if new is None else new.fact_id, at=at)
            self._served.forget(uid, done)
            self._served.wrote(self._store, uid)
            self.counters["superseded"] += len(done)
        if new is None:
            return None
        if old.pinned and done:
            self._pinning.pin(user_id=uid, fact_ids=[new.fact_id])
        return AddResult(new.fact_id, new.text, "UPDATE", supersedes=tuple(done))

    def delete(self, *, user_id: str, fact_ids: Sequence[int]) -> None:
        """Delete facts (all or nothing) and free their KV.

        Raises:
            FactNotFoundError: an id is unknown or another user's; nothing is deleted.
        """
        user = self._scopes.user(user_id)
        ids = list(dict.fromkeys(checks.check_fact_ids(fact_ids)))
        with user as uid:
            self._store.delete(user_id=uid, fact_ids=ids)
            self._served.forget(uid, ids)
            self._served.wrote(self._store, uid)

    def reset(self, *, user_id: str) -> int:
        """Delete every fact and turn of a user; returns the number of facts deleted."""
        with self._scopes.user(user_id) as uid:
            deleted = self._store.reset(user_id=uid)
            self._served.forget(uid, deleted)
            self._served.wrote(self._store, uid)
            return len(deleted)

    def delete_all(self, *, user_id: str, agent_id: str | None = None,
                   run_id: str | None = None) -> int:
        """Delete the user's facts added in agent_id / run_id (all: reset()); returns how many.

        Without agent_id and run_id this is reset(): facts, turns and history.
        """
        user = self._scopes.user(user_id, sync=False)
        if filters.scope(agent_id, run_id) == (None, None):
            return self.reset(user_id=user.user_id)
        with self._scopes.lock:  # selected and deleted as one step
            ids = [r.fact_id for r in self._records(user_id=user.user_id, agent_id=agent_id,
                                                   run_id=run_id, include_expired=True)]
            if ids:
                self.delete(user_id=user.user_id, fact_ids=ids)
            return len(ids)
