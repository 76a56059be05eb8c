"""Listing: the verbs that read the store as it is (get, get_all, records, history, turns, ...).

A plain part Memory holds and forwards to (main.py), as it does Answering. These verbs read
durable rows only: no engine, no index, no sync of served facts. Expired facts are left out
(memory/expiry.py), as a sweep may not have deleted them yet.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from inferscale_engine import checks
from inferscale_engine.errors import FactNotFoundError, InvalidRequestError
from inferscale_engine.facts import Fact
from inferscale_engine.memory.expiry import has_expired, unexpired
from inferscale_engine.memory.scope import Scopes
from inferscale_engine.memory.search import filters
from inferscale_engine.memory.store import FactStore, StoredFact, Turn, reserved
from inferscale_engine.memory.store.history import HistoryEvent
from inferscale_engine.memory.store.sessions import Session


class Listing:
    """The store-reading verbs of Memory."""

    def __init__(self, store: FactStore, scopes: Scopes) -> None:
        self._store, self._scopes = store, scopes

    def owner_of(self, fact_id: int) -> str | None:
        """The user a fact belongs to (None: no such fact); for servers checking access."""
        return self._store.owner(fact_id)

    def get(self, *, user_id: str, fact_id: int) -> StoredFact:
        """The durable record of one fact (text, token ids, metadata, timestamps).

        Raises:
            FactNotFoundError: the user has no such fact, or it has expired.
        """
        user = self._scopes.user(user_id, sync=False)
        (fact_id,) = checks.check_fact_ids([fact_id], "fact_id")
        with user as uid:
            (stored,) = self._store.get(user_id=uid, fact_ids=[fact_id])
        if has_expired(stored, time.time()):
            raise FactNotFoundError(f"fact {fact_id} of user {uid!r} expired at "
                                    f"{stored.expires_at}; expired facts are not served")
        return reserved.public_record(stored)

    def get_all(self, *, user_id: str, as_of: Any = None,
                include_superseded: bool = False) -> list[Fact]:
        """The user's current facts, oldest first ([] for a user with none).

        as_of (a datetime, date, ISO string or epoch seconds): the facts true then instead;
        include_superseded=True: every stored fact. Expired facts are never listed.
        """
        return [r.to_fact() for r in self.records(user_id=user_id, as_of=as_of,
                                                  include_superseded=include_superseded)]

    def records(self, *, user_id: str, filter: Mapping[str, Any] | None = None,
                agent_id: str | None = None, run_id: str | None = None, as_of: Any = None,
                include_superseded: bool = False, include_expired: bool = False
                ) -> list[StoredFact]:
        """The user's current facts as stored (text, metadata, times), oldest first.

        With `filter` (memory/search/filters.py), those whose metadata match it; with agent_id
        / run_id, those added in them; as_of / include_superseded: see get_all;
        include_expired: also expired rows no sweep deleted yet.
        """
        user = self._scopes.user(user_id, sync=False)
        wanted, scope = filters.check_filter(filter), filters.scope(agent_id, run_id)
        keep = valid_at(as_of, include_superseded)
        with user as uid:
            stored = self._store.get_all(user_id=uid)
        if include_expired is not True:
            stored = unexpired(stored)
        return [r for r in map(reserved.public_record, stored)
                if keep(r) and filters.selected(r, wanted, scope)]

    def history(self, *, user_id: str, fact_id: int) -> list[HistoryEvent]:
        """A fact's events (ADD, UPDATE, SUPERSEDE, ...) with old and new text, oldest first."""
        with self._scopes.user(user_id, sync=False) as uid:
            return self._store.history(user_id=uid, fact_id=fact_id)

    def users(self) -> list[str]:
        """Every user with facts or turns, sorted."""
        with self._scopes.open():
            return self._store.users()

    def turns(self, *, user_id: str, session_id: str | None = None,
              limit: int = 20) -> list[Turn]:
        """The last `limit` turns of a session, oldest first."""
        user = self._scopes.user(user_id, sync=False)
        session_id = checks.check_session(session_id)
        with user as uid:
            return self._store.recent_turns(user_id=uid, session_id=session_id, limit=limit)

    def sessions(self, *, user_id: str) -> list[Session]:
        """The user's conversations with stored turns, the most recently active first."""
        with self._scopes.user(user_id, sync=False) as uid:
            return self._store.sessions(user_id=uid)


def valid_at(as_of: Any, include_superseded: bool) -> Callable[[StoredFact], bool]:
    """Which records a read returns: current ones, those true at `as_of`, or all.

    Raises:
        InvalidRequestError: a bad as_of, or as_of with include_superseded.
    """
    at = checks.check_time(as_of, "as_of")
    if not isinstance(include_superseded, bool):
        raise InvalidRequestError(f"include_superseded={include_superseded!r} must be a bool")
    if at is not None and include_superseded:
        raise InvalidRequestError("pass as_of (the facts true then) or include_superseded=True "
                                  "(every fact), not both")
    if include_superseded:
        return lambda record: True
    if at is None:
        return lambda record: record.valid_to is None  # expiry: unexpired()
    return lambda record: record.since <= at and (record.valid_to is None
                                                   or at < record.valid_to)
