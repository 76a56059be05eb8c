"""RegisteredFacts: the facts Memory has registered with the engine and indexed for search.

A durable fact is servable once the engine knows it (its KV encoded now or on first use) and
the retrieval index holds its embedding; search may only return such facts. At start-up every
stored fact is registered again, per user in batches, after stale token ids or embeddings
(a changed tokenizer or embedder) are recomputed in the store.

A store that other processes write too (FactStore.shared: replicas sharing one Postgres
database) is read per user instead (unless start-up encodes every fact): a user's facts are
registered on first use, and again
whenever the store's version of that user moved (another replica wrote), so whichever replica
serves a user serves exactly what the store holds. The users read this way are held in an LRU
of `max_users`: the least recently served one beyond it is released (its facts leave the
engine, their disk entries kept, and the index) and read again on its next use, so the state a
process holds does not grow with every user id it is asked about. The version is read before
Memory's lock is taken (version(); scope.py), the facts only when it moved (sync()).

An add's facts are durable and staged (stage()) before they are registered in chunks
(register_in_chunks): until then they are stored but not served. An asynchronous add
(background.py) registers its facts as pending instead (register_pending): the engine knows
them, so a request can have them as text, but they are not searchable and have no KV until the
background queue has embedded and encoded them (finish).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager

import torch
from tqdm import tqdm

from inferscale_engine.errors import EngineClosedError, InvalidFactError, InvalidRequestError
from inferscale_engine.facts import Fact, FactId
from inferscale_engine.memory.config import DEFAULT_MAX_SERVED_USERS, check_max_served_users
from inferscale_engine.memory.dating import FactDates
from inferscale_engine.memory.expiry import ExpiryClock, unexpired
from inferscale_engine.memory.gate import InteractiveGate
from inferscale_engine.memory.search.index import RetrievalIndex
from inferscale_engine.memory.store.fact_store import FactStore
from inferscale_engine.memory.store.fingerprint import fingerprint, refresh, stale_parts
from inferscale_engine.memory.store.records import StoredFact
from inferscale_engine.memory.store.reserved import stored_context
from inferscale_engine.runtime.engine import Engine

logger = logging.getLogger(__name__)

_BATCH = 256
"""Facts per engine registration call at start-up."""
_PROGRESS_FROM = 256
"""Adds of this many facts show a progress bar (on a terminal) while their KV is encoded."""


class RegisteredFacts:
    """Fact ids -> Facts that are registered with the engine and in the index."""

    def __init__(self, engine: Engine, index: RetrievalIndex, counters: Counter[str],
                 max_users: int = DEFAULT_MAX_SERVED_USERS, dates: FactDates | None = None
                 ) -> None:
        self._engine = engine
        self.dates = dates or FactDates(engine.tokenize_fact, False)
        """How facts are written for the model (dating.py): the engine serves that text."""
        self._index = index
        self._counters = counters
        self._max_users = check_max_served_users(max_users)
        self._facts: dict[FactId, Fact] = {}
        self._by_user: dict[str, set[FactId]] = {}
        self._versions: OrderedDict[str, int] = OrderedDict()
        """Per user read from a shared store, the version its served facts were last read at
        (sync); least recently served first."""
        self._since: dict[FactId, float] = {}
        """When each served fact became true (its valid_from, else created_at)."""
        self._staged: set[int] = set()
        """Ids of facts an add has stored but not yet registered (Memory registers them in
        chunks); a delete or update meanwhile takes them out, so they are never served."""
        self._pending: dict[str, dict[FactId, Fact]] = {}
        """Per user, facts of asynchronous adds registered with the engine without KV or an
        index entry: served as text only, until finish(). Per user, so that a request reads
        its own user's and not a bulk add's of someone else."""
        self.expiry = ExpiryClock()
        """When served facts expire (expire_due forgets them; memory/expiry.py)."""

    def __len__(self) -> int:
        return len(self._facts)

    def __contains__(self, fact_id: object) -> bool:
        return fact_id in self._facts

    def __getitem__(self, fact_id: FactId) -> Fact:
        return self._facts[fact_id]

    def __iter__(self) -> Iterator[Fact]:
        return iter(list(self._facts.values()))

    @property
    def num_users(self) -> int:
        """Users whose state is held: facts registered, or a shared store's version read."""
        return len(self._by_user.keys() | self._versions.keys())

    def text_of(self, fact_id: FactId) -> str | None:
        """The text of a served fact, or None."""
        fact = self._facts.get(fact_id)
        return fact.text if fact is not None else None

    def since(self, fact_id: FactId) -> float | None:
        """When a served fact became true, or None (not served)."""
        return self._since.get(fact_id)

    def prompt_line(self, fact_id: FactId) -> tuple[str, int] | None:
        """(text, tokens of its prompt line) of a served fact, or None."""
        fact = self._facts.get(fact_id)
        return (self.dates.text(fact.text, self._since.get(fact_id)), len(fact.token_ids)
                ) if fact is not None else None

    def register(self, user_id: str, stored: Sequence[StoredFact], encode: bool) -> None:
        """Register durable facts with the engine (encoding their KV if asked), index them.

        If encoding fails, the facts are registered without KV: it is built on first use. A fact
        the engine refuses (e.g. over a lowered max_fact_tokens) stays in the store but is not
        served; it is logged and counted. A fact that has expired is never registered.
        """
        stored = unexpired([f for f in stored if f.valid_to is None])  # current facts only
        if not stored:
            return
        facts = [f.to_fact() for f in stored]
        served = [self.dates.served(fact, f.since) for fact, f in zip(facts, stored, strict=True)]
        contexts = [stored_context(f.metadata) for f in stored]
        ids = [f.fact_id for f in stored]
        try:
            self._engine.add_tokenized_facts(served, contexts, encode=encode)
        except EngineClosedError:
            raise
        except InvalidFactError as exc:
            if len(stored) == 1:
                logger.warning("fact %s of %r is stored but cannot be served: %s", ids[0],
                               user_id, exc)
                self._counters["unservable_facts"] += 1
                return
            for one in stored:  # register all but the refused ones
                self.register(user_id, [one], encode)
            return
        except Exception as exc:  # noqa: BLE001 - whatever failed in encoding: KV comes later
            logger.warning("encoding %d facts of %r failed (%s); their KV will be built on "
                           "first use", len(ids), user_id, exc)
            self._counters["encode_failures"] += len(ids)
            self._engine.add_tokenized_facts(served, contexts, encode=False)
        self._index.add(user_id=user_id, fact_ids=ids, embeddings=torch.stack(
            [torch.from_numpy(f.embedding_array().copy()) for f in stored]),
            texts=[f.text for f in facts], sessions=[f.session_id for f in stored])
        self._facts.update((f.fact_id, f) for f in facts)
        self._since.update((f.fact_id, f.since) for f in stored)
        self._by_user.setdefault(user_id, set()).update(ids)
        for one in stored:
            self.expiry.note(user_id, one.fact_id, one.expires_at)
        self.pin(user_id, [f.fact_id for f in stored if f.pinned])

    def pin(self, user_id: str, fact_ids: Sequence[FactId]) -> None:
        """Pin registered facts the store says are pinned, each while the caps allow.

        A fact over a cap (lowered since it was pinned) is served unpinned, logged and counted.
        """
        for fact_id in fact_ids:
            try:
                self._engine.pin(user_id, [fact_id])
            except InvalidRequestError as exc:
                logger.warning("fact %s of %r is stored pinned but served unpinned: %s",
                               fact_id, user_id, exc)
                self._counters["pinned_over_cap"] += 1

    def register_historic(self, user_id: str, stored: Sequence[StoredFact]) -> None:
        """Make superseded facts servable for an as-of read.

        The engine knows them (KV built on first use); the index does not, so search of the
        present never finds them.
        """
        fresh = [f for f in stored if f.fact_id not in self._facts]
        if not fresh:
            return
        self._engine.add_tokenized_facts([self.dates.served(f.to_fact(), f.since) for f in fresh],
                                         [stored_context(f.metadata) for f in fresh],
                                         encode=False)
        self._facts.update((f.fact_id, f.to_fact()) for f in fresh)
        self._by_user.setdefault(user_id, set()).update(f.fact_id for f in fresh)
        self._counters["historic_facts"] += len(fresh)

    def register_pending(self, user_id: str, stored: Sequence[StoredFact]) -> None:
        """Register facts of an asynchronous add with the engine only (no KV, not indexed)."""
        mine = self._pending.get(user_id, {})
        fresh = [f for f in stored if f.fact_id not in mine and f.fact_id not in self._facts]
        facts = [f.to_fact() for f in fresh]
        if facts:
            self._engine.add_tokenized_facts(
                [self.dates.served(fact, f.since) for fact, f in zip(facts, fresh, strict=True)],
                None, encode=False)
            self._pending.setdefault(user_id, {}).update((f.fact_id, f) for f in facts)

    def pending_of(self, user_id: str, max_tokens: int | None = None) -> list[FactId]:
        """The user's pending facts, oldest first; with max_tokens, the newest that fit it."""
        mine = self._pending.get(user_id, {})
        ids = sorted(mine)
        if max_tokens is None:
            return ids
        kept: list[FactId] = []
        for fact_id in reversed(ids):
            max_tokens -= len(mine[fact_id].token_ids)
            if max_tokens < 0:
                break
            kept.append(fact_id)
        return kept[::-1]

    def pending_among(self, user_id: str, fact_ids: Iterable[int]) -> frozenset[FactId]:
        """Those of the user's facts that are pending (served as text only)."""
        mine = self._pending.get(user_id, {})
        return frozenset(FactId(i) for i in fact_ids if i in mine)

    def _unpend(self, user_id: str, fact_ids: Iterable[FactId]) -> None:
        mine = self._pending[user_id]
        for fact_id in fact_ids:
            del mine[fact_id]
        if not mine:  # a user with no pending facts holds no entry
            del self._pending[user_id]

    def finish(self, user_id: str, stored: Sequence[StoredFact], encode: bool) -> None:
        """Pending facts embedded: registered again with their context, KV and index entry.

        Facts deleted meanwhile (no longer pending here) are skipped.
        """
        chunk = [f for f in stored if f.fact_id in self._pending.get(user_id, {})]
        if chunk:
            self._engine.delete(user_id, [f.fact_id for f in chunk])
            self._unpend(user_id, [f.fact_id for f in chunk])
            self.register(user_id, chunk, encode)

    def stage(self, fact_ids: Iterable[int]) -> None:
        """Note facts just stored, to be registered by register_staged."""
        self._staged.update(fact_ids)

    def register_staged(self, user_id: str, stored: Sequence[StoredFact], encode: bool) -> None:
        """register() those of `stored` still staged (not deleted or replaced meanwhile)."""
        chunk = [f for f in stored if f.fact_id in self._staged]
        self._staged.difference_update(f.fact_id for f in chunk)
        self.register(user_id, chunk, encode)

    def register_in_chunks(self, user_id: str, stored: list[StoredFact], encode: bool,
                           gate: InteractiveGate,
                           locked: Callable[[], AbstractContextManager[None]]) -> None:
        """Make an add's stored facts servable (encoding their KV), in chunks.

        The write is already durable; between chunks, interactive calls of other users go
        first (InteractiveGate), and each chunk holds the Memory's lock (`locked`) only while
        it works.
        """
        with tqdm(total=len(stored), unit="fact", desc="InferScale: encoding facts",
                  disable=None if len(stored) >= _PROGRESS_FROM else True) as bar:
            for lo, hi in gate.chunks(len(stored)):
                with locked():
                    self.register_staged(user_id, stored[lo:hi], encode)
                bar.update(hi - lo)

    def forget(self, user_id: str, fact_ids: Sequence[int]) -> None:
        """Drop deleted facts from the engine (freeing their KV) and from the index."""
        self._staged.difference_update(fact_ids)
        pending = list(self.pending_among(user_id, fact_ids))
        if pending:
            self._engine.delete(user_id, pending)
            self._unpend(user_id, pending)
        self.expiry.drop(fact_ids)
        known = [FactId(i) for i in fact_ids if i in self._facts]
        if known:
            self._engine.delete(user_id, known)
            self._index.remove(user_id=user_id, fact_ids=known)
            for fact_id in known:
                del self._facts[fact_id]
                self._since.pop(fact_id, None)
            held = self._by_user.get(user_id, set())
            held.difference_update(known)
            if not held:  # a user with no facts left holds no state
                self._by_user.pop(user_id, None)

    def expire_due(self, now: float | None = None) -> list[FactId]:
        """Forget the served facts whose expiry is at or before `now`; returns them."""
        due = self.expiry.due(time.time() if now is None else now)
        for user_id, ids in due.items():
            self.forget(user_id, ids)
            self._counters["expired_facts"] += len(ids)
        return [i for ids in due.values() for i in ids]

    def release_all(self) -> None:
        """Forget every fact, freeing its KV in a shared engine (Memory.close; disk kept)."""
        by_user: dict[str, list[FactId]] = defaultdict(list)
        for fact in [*self._facts.values(), *(f for mine in self._pending.values()
                                               for f in mine.values())]:
            by_user[fact.user_id].append(fact.fact_id)
        try:
            for user_id, ids in by_user.items():
                self._engine.delete(user_id, ids, keep_disk=True)
        finally:
            self._facts.clear()
            self._since.clear()
            self._pending.clear()
            self._by_user.clear()
            self._versions.clear()
            self.expiry = ExpiryClock()

    def wrote(self, store: FactStore, user_id: str) -> None:
        """After this process wrote a synced user: keep it synced if no one else wrote too.

        Each write moves the user's version by one, so the next version means the write was
        the only one since the last sync; the next request then need not read the user again.
        """
        if store.shared and user_id in self._versions:
            version = store.user_version(user_id)
            if version == self._versions[user_id] + 1:
                self._versions[user_id] = version

    def version(self, store: FactStore, user_id: str) -> int | None:
        """The user's version in a shared store (one primary-key read), None for a private one.

        Read before the lock is taken (scope.py) and before the user's facts: a write after
        this read moves the version again, so the next request syncs again.
        """
        return store.user_version(user_id) if store.shared else None

    def sync(self, store: FactStore, user_id: str, version: int | None) -> None:
        """Serve what a shared store holds for the user at `version` (see version()).

        Nothing to do when the version is the one last read (the version cache) or the store
        is private (None). When another process wrote the user, facts deleted or changed there
        are forgotten here and new ones registered (their KV is built on first use: from the
        disk tier if it holds them, else encoded). Facts an add of this process is still
        registering are left to it.
        """
        if version is None:
            return
        held = self._versions.get(user_id)
        if held is not None and version <= held:  # read before a write this process synced
            self._versions.move_to_end(user_id)
            return
        current = {f.fact_id: f for f in store.get_all(user_id=user_id) if f.valid_to is None}
        stale = [i for i in self._by_user.get(user_id, ()) if i not in current
                 or _changed(self._facts[i], current[i])]
        stale += [i for i in self.pending_of(user_id)  # finished (or deleted) elsewhere
                  if i not in current or not current[i].pending]
        self.forget(user_id, stale)
        served = self._by_user.get(user_id, set())
        for fact_id in served:  # another process may have set these
            self.expiry.note(user_id, fact_id, current[fact_id].expires_at)
        pinned = set(self._engine.pinned_facts(user_id))
        self._engine.unpin(user_id, [i for i in pinned if not current[i].pinned])
        self.pin(user_id, sorted(i for i in served if current[i].pinned and i not in pinned))
        fresh = [f for i, f in current.items() if i not in self._facts and i not in self._staged
                 and i not in self._pending.get(user_id, {})]
        self.register_pending(user_id, [f for f in fresh if f.pending])
        self.register(user_id, [f for f in fresh if not f.pending], encode=False)
        self._versions[user_id] = version
        self._versions.move_to_end(user_id)
        self._counters["synced_users"] += 1
        self._counters["synced_facts"] += len(fresh)
        while len(self._versions) > self._max_users:
            self._release(next(iter(self._versions)))

    def _release(self, user_id: str) -> None:
        """Let go of a user read from a shared store (the least recently served).

        Its facts leave the engine (disk entries kept) and the index; its next use reads it
        again.
        """
        del self._versions[user_id]
        self.forget(user_id, self.pending_of(user_id))  # the queue finishes them in the store
        ids = list(self._by_user.pop(user_id, ()))
        if ids:
            self.expiry.drop(ids)
            self._engine.delete(user_id, ids, keep_disk=True)
            self._index.remove(user_id=user_id, fact_ids=ids)
            for fact_id in ids:
                del self._facts[fact_id]
                self._since.pop(fact_id, None)
        self._counters["released_users"] += 1

    def register_stored(self, store: FactStore, embedder_name: str,
             embed: Callable[[list[str]], torch.Tensor], encode: bool,
             progress_bar: bool | None) -> None:
        """Register every stored fact, per user in batches; first recompute stale data."""
        current = fingerprint(self._engine.config, self._engine.tokenizer, embedder_name,
                              self.dates.on)
        total = store.count()
        stale = stale_parts(store.fingerprint(), current) if total else set()
        if store.shared and not stale and not encode:  # each user is read on first use (sync)
            store.set_fingerprint(json.dumps(current, sort_keys=True))
            return
        def tokenize(fact: StoredFact) -> tuple[int, ...]:
            return self.dates.tokens(fact.text, fact.since, check_length=False)

        pending: dict[str, list[StoredFact]] = defaultdict(list)
        with tqdm(total=total, unit="fact", disable=None if progress_bar is None else (
                not progress_bar), desc="InferScale: " + ("encoding" if encode else "loading")
                + " stored facts") as bar:
            for batch in store.iter_all(_BATCH):
                if stale:
                    batch = refresh(store, batch, stale, tokenize, embed)
                    self._counters["startup_refreshed"] += len(batch)
                for stored in batch:  # pending facts: registered by the queue (background.py)
                    if not stored.pending:
                        pending[stored.user_id].append(stored)
                for user_id in [u for u, facts in pending.items() if len(facts) >= _BATCH]:
                    facts = pending.pop(user_id)
                    self.register(user_id, facts, encode)
                    bar.update(len(facts))
            for user_id, facts in pending.items():
                self.register(user_id, facts, encode)
                bar.update(len(facts))
        store.set_fingerprint(json.dumps(current, sort_keys=True))
        self._counters["startup_facts"] = len(self._facts)


def _changed(served: Fact, stored: StoredFact) -> bool:
    """The stored fact is not the one served (updated by another process)."""
    return served.text != stored.text or tuple(served.token_ids) != tuple(stored.token_ids)
