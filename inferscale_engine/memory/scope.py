"""The one preamble of Memory's verbs: the user checked, the lock, the Memory open, synced.

    user = scopes.user(user_id)     # the id checked now: bad input fails before any work
    ...                             # work outside the lock (tokenize, embed)
    with user as uid:               # the lock held, the Memory open, the user's served
        ...                         # facts synced with a shared store, expired ones forgotten

A shared store's per-user version (one round trip to PostgreSQL) is read before the lock is
taken, so requests of different users never queue behind each other's reads; registration.py
keeps the versions it has read (the version cache) and reads the user's facts only when that
version moved.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from inferscale_engine import checks
from inferscale_engine.errors import StoreError
from inferscale_engine.memory.registration import RegisteredFacts
from inferscale_engine.memory.store import FactStore


class Scopes:
    """Makes the scopes of one Memory's verbs (the Memory's lock, store and served facts)."""

    def __init__(self, lock: threading.RLock, check_open: Callable[[], None],
                 served: RegisteredFacts, store: FactStore) -> None:
        self.lock, self.check_open, self.served, self.store = lock, check_open, served, store

    def user(self, user_id: str, *, sync: bool = True) -> UserScope:
        """The scope of a verb of `user_id` (checked now); sync=False reads no store version."""
        return UserScope(self, checks.check_user_id(user_id), sync)

    @contextmanager
    def open(self) -> Iterator[None]:
        """The scope of a verb of no one user: the lock, on an open Memory."""
        with self.lock:
            self.check_open()
            yield


class UserScope:
    """One verb's user: `user_id` is checked; entering holds the lock (see the module)."""

    __slots__ = ("_scopes", "_sync", "user_id")

    def __init__(self, scopes: Scopes, user_id: str, sync: bool) -> None:
        self.user_id = user_id
        self._scopes, self._sync = scopes, sync

    def __enter__(self) -> str:
        scopes = self._scopes
        scopes.check_open()
        try:
            version = scopes.served.version(scopes.store, self.user_id) if self._sync else None
        except StoreError:
            scopes.check_open()  # closed meanwhile: say so, not what the closed store said
            raise
        scopes.lock.acquire()
        try:
            scopes.check_open()
            if self._sync:
                scopes.served.sync(scopes.store, self.user_id, version)
            scopes.served.expire_due()  # an expired fact is never served (memory/expiry.py)
        except BaseException:
            scopes.lock.release()
            raise
        return self.user_id

    def __exit__(self, *exc: object) -> None:
        self._scopes.lock.release()
