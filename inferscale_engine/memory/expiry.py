"""Expiry: facts that stop being served at a time (mem0's expiration_date, LangGraph's TTL).

    expiration_time   add's expiration_date (date, datetime, ISO string, epoch seconds) ->
                      seconds since the epoch, checked: a bad or past value stores nothing
    ExpiryClock       the served facts' expiry times, soonest first (a heap)
    Expiry            the part Memory holds: sweep, set_expiration, the background sweeper

An expired fact is never served. Every verb's scope (scope.py) first forgets the served
facts whose time has passed (RegisteredFacts.expire_due: one look at the heap when none is
due), which frees their KV in every tier (Engine.delete: slab, host, disk); the reading verbs
(listing.py) leave out rows whose expires_at has passed; registration never serves one.

What happens to the rows is the caller's choice (Memory's on_expiry): 'hide' keeps them,
hidden (mem0's behaviour: history and the inspector still know them); 'delete' has the sweep
delete them, history EXPIRE (LangGraph's TTL sweeper). The sweeper is a background thread
that runs sweep() every `expiry_sweep_s` seconds; it starts only once a fact with an expiry
exists (at start-up, or when one is added), and close() stops it. Deleting rows is the
sweep's alone, so an expired row stays readable by the store's own verbs until a sweep (what
LangGraph's stores do when omit_expired is off; KVMemoryStore uses records(include_expired)).
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from inferscale_engine import checks
from inferscale_engine.errors import EngineClosedError, FactNotFoundError, InvalidRequestError
from inferscale_engine.facts import FactId
from inferscale_engine.memory.store import FactStore, StoredFact

if TYPE_CHECKING:
    from inferscale_engine.memory.scope import Scopes

logger = logging.getLogger(__name__)

_SWEEP_BATCH = 500
"""Expired rows one sweep step deletes (under Memory's lock), then the next."""
_HINT = ("pass a datetime (naive: UTC), a date (it expires when that day ends, UTC), an ISO "
         "8601 string ('2026-05-08' or '2026-05-08T12:00:00+02:00'), seconds since the epoch, "
         "or None (never expires)")


def expiration_time(value: object, now: float | None = None) -> float | None:
    """The expiration_date of an add as seconds since the epoch (None: never expires).

    Raises:
        InvalidRequestError: not a date, datetime, ISO string or number, or not in the future.
    """
    moment = checks.check_time(value, "expiration_date", day_end=True, hint=_HINT)
    if moment is None:
        return None
    now = time.time() if now is None else now
    if moment <= now:
        raise InvalidRequestError(
            f"expiration_date={value!s:.60} has already passed (it is "
            f"{datetime.fromtimestamp(now, UTC).isoformat(timespec='seconds')}); nothing was "
            "stored. Pass a later time, or None for a fact that never expires")
    return moment


def has_expired(fact: StoredFact, now: float) -> bool:
    """True if the fact's expires_at is at or before `now`."""
    return fact.expires_at is not None and fact.expires_at <= now


def unexpired(facts: Iterable[StoredFact], now: float | None = None) -> list[StoredFact]:
    """The facts that have not expired by `now` (default: now)."""
    now = time.time() if now is None else now
    return [f for f in facts if not has_expired(f, now)]


class ExpiryClock:
    """Served facts' expiry times, soonest first; a changed time leaves a stale heap entry."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []
        self._at: dict[int, float] = {}
        """fact id -> its current expiry (heap entries that disagree are stale)."""

    def __len__(self) -> int:
        return len(self._at)

    def note(self, user_id: str, fact_id: int, expires_at: float | None) -> None:
        """Record when a served fact expires (None: never)."""
        if expires_at is None:
            self._at.pop(fact_id, None)
            return
        if self._at.get(fact_id) == expires_at:
            return
        self._at[fact_id] = expires_at
        heapq.heappush(self._heap, (expires_at, fact_id, user_id))
        if len(self._heap) > 2 * len(self._at) + 64:  # refreshed often: drop stale entries
            self._heap = [e for e in self._heap if self._at.get(e[1]) == e[0]]
            heapq.heapify(self._heap)

    def drop(self, fact_ids: Iterable[int]) -> None:
        """Forget facts no longer served."""
        for fact_id in fact_ids:
            self._at.pop(fact_id, None)

    def due(self, now: float) -> dict[str, list[FactId]]:
        """Take out the facts whose time is at or before `now`, per user."""
        out: dict[str, list[FactId]] = defaultdict(list)
        while self._heap and self._heap[0][0] <= now:
            at, fact_id, user_id = heapq.heappop(self._heap)
            if self._at.get(fact_id) == at:
                del self._at[fact_id]
                out[user_id].append(FactId(fact_id))
        return out


class Expiry:
    """Memory's expiry verbs (sweep_expired, set_expiration) and its background sweeper."""

    def __init__(self, store: FactStore, scopes: Scopes, counters: Counter[str],
                 on_expiry: str, sweep_s: float | None) -> None:
        self._store, self._scopes, self._counters = store, scopes, counters
        self._served = scopes.served
        self._delete = on_expiry == "delete"
        self._sweep_s = sweep_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if store.expired(math.inf, 1):  # facts with an expiry exist: sweep them
            self.start()

    def sweep_expired(self, *, delete: bool | None = None,
                      user_prefix: str = "") -> list[FactId]:
        """Expire what is due now; returns the facts this sweep took out of serving or deleted.

        Served facts whose time passed are forgotten (their KV freed in every tier); with
        delete (default: on_expiry == 'delete') expired rows of the users whose id starts
        with `user_prefix` (KVMemoryStore: its namespaces) are deleted, history EXPIRE.
        """
        now = time.time()
        with self._scopes.open():
            out = dict.fromkeys(self._served.expire_due(now))
        if not (self._delete if delete is None else delete):
            return list(out)
        while True:
            with self._scopes.open():  # found and deleted as one step: a refresh cannot slip in
                found = self._store.expired(now, _SWEEP_BATCH, user_prefix)
                by_user: dict[str, list[FactId]] = defaultdict(list)
                for user_id, fact_id in found:
                    by_user[user_id].append(fact_id)
                deleted = [i for user_id, ids in by_user.items()
                           for i in self._delete_rows(user_id, ids)]
                out.update(dict.fromkeys(deleted))
            if len(found) < _SWEEP_BATCH or not deleted:  # not deleted: gone meanwhile
                return list(out)

    def set_expiration(self, *, user_id: str, fact_ids: Sequence[int],
                       expiration_date: object) -> list[FactId]:
        """Set when the user's facts expire (None: never), e.g. a TTL refreshed on read.

        Returns the facts set; ids unknown, another user's or already expired are left out
        (an expired fact never comes back).

        Raises:
            InvalidRequestError: a bad expiration_date (see expiration_time); nothing changes.
        """
        user = self._scopes.user(user_id)
        ids = list(dict.fromkeys(checks.check_fact_ids(fact_ids)))
        expires_at = expiration_time(expiration_date)
        with user as uid:
            changed = self._store.set_expiry(user_id=uid, fact_ids=ids, expires_at=expires_at)
            for fact_id in changed:
                if fact_id in self._served:
                    self._served.expiry.note(uid, fact_id, expires_at)
            self._served.wrote(self._store, uid)
        if expires_at is not None:
            self.start()
        return changed

    def start(self) -> None:
        """Start the background sweeper (no-op: running, closed, or expiry_sweep_s None)."""
        if self._sweep_s is None or self._stop.is_set() or (
                self._thread is not None and self._thread.is_alive()):
            return
        self._thread = threading.Thread(target=self._run, name="inferscale-expiry-sweeper",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the sweeper (before Memory's lock is taken: a sweep may be waiting for it)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        assert self._sweep_s is not None
        while not self._stop.wait(self._sweep_s):
            try:
                self.sweep_expired()
            except EngineClosedError:
                return
            except Exception as exc:  # noqa: BLE001 - the next sweep tries again
                logger.warning("expiry sweep failed (%s); retrying in %.0f s", exc,
                               self._sweep_s)

    def _delete_rows(self, user_id: str, ids: list[FactId]) -> list[FactId]:
        """Delete expired rows of one user (history EXPIRE) and forget them; returns those."""
        try:
            self._store.delete(user_id=user_id, fact_ids=ids, event="EXPIRE")
            deleted = ids
        except FactNotFoundError:  # one was deleted by another process meanwhile
            deleted = []
            for fact_id in ids:
                try:
                    self._store.delete(user_id=user_id, fact_ids=[fact_id], event="EXPIRE")
                    deleted.append(fact_id)
                except FactNotFoundError:
                    continue
        self._served.forget(user_id, deleted)
        self._served.wrote(self._store, user_id)
        self._counters["expired_deleted"] += len(deleted)
        return deleted
