"""BackgroundAdds: add(wait=False), the facts stored at once, embedded and encoded in a queue.

    submit   the caller's thread, milliseconds: the input checked and tokenized; the contexts
             that need no embedding (a turn's session turns, EngineConfig.context_source
             'recent'); facts and turns stored in one transaction, pending=1 with a stand-in
             embedding; the facts registered as pending (served as text); one job queued
    worker   background threads, one job at a time each: embed; the duplicate check (a
             duplicate's row is deleted: AddStatus.event 'DUPLICATE'); 'similar' contexts;
             embedding and context written and pending cleared (one transaction); the KV
             encoded and the facts indexed, in chunks that yield to interactive calls (gate.py)
    resume   at start-up, facts still pending in the store are queued again: nothing
             acknowledged is lost to a restart
    infer    add(infer=True, wait=False): the user's messages are stored as pending rows
             (INFER_KEY; served as text meanwhile); the worker runs add(infer=True) on them
             (`infer`: extraction, decisions, applied with the Memory's own verbs), then
             deletes the rows; their AddStatus says INFER with what was done. A failure leaves
             them pending, retried at the next start

The embedding is deferred too: all-MiniLM-L6-v2 costs milliseconds per fact on a CPU, so a
100-fact add would not return in milliseconds. Until a fact is embedded it cannot be ranked:
Answering serves a user's pending facts after the top-k, as text (counted in
counters['pending_served_as_text']). At most `max_queued_facts` facts wait: an add beyond that
raises AddQueueFullError (HTTP 429) before anything is stored.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from inferscale_engine import checks
from inferscale_engine.config import EngineConfig
from inferscale_engine.errors import (
    AddQueueFullError,
    EngineClosedError,
    FactNotFoundError,
    InvalidRequestError,
    StoreError,
)
from inferscale_engine.facts import FactId
from inferscale_engine.memory import ingest
from inferscale_engine.memory.config import DEFAULT_MAX_QUEUED_FACTS
from inferscale_engine.memory.gate import InteractiveGate
from inferscale_engine.memory.registration import RegisteredFacts
from inferscale_engine.memory.scope import Scopes, UserScope
from inferscale_engine.memory.search.index import RetrievalIndex
from inferscale_engine.memory.store import FactStore, StoredFact
from inferscale_engine.memory.store.reserved import (
    AGENT_KEY,
    INFER_KEY,
    RUN_KEY,
    context_metadata,
    public_metadata,
    stored_context,
)
from inferscale_engine.memory.types import AddResult, AddStatus

logger = logging.getLogger(__name__)

_ROWLESS_EVENTS = ("DUPLICATE", "INFER")
"""Events after which the fact's row is deleted: its kept status is all that is left."""
_KEPT_STATUSES = 100_000
"""Statuses of finished facts kept for add_status (older ones are read from the store)."""


@dataclass(slots=True)
class _Job:
    """One asynchronous add's facts (or, resumed, one user's pending facts)."""

    user_id: str
    fact_ids: list[FactId]
    session_id: str | None
    dedupe: bool
    contexts_later: bool
    """Their contexts need their embeddings ('similar' contexts of facts added as texts)."""
    infer: bool = False
    """The rows are user messages of add(infer=True, wait=False) (module docstring)."""


Infer = Callable[..., list[AddResult]]
"""add(infer=True) of one user's messages: (user_id, messages, metadata, agent_id, run_id,
timestamp, expiration_date) as keywords -> its results."""


class BackgroundAdds:
    """The queue of asynchronous adds of one Memory, and its worker threads.

    Threads start with the first job (nothing on construction) and stop in close(); a job
    interrupted by close() leaves its facts pending in the store, for resume() at the next start.
    """

    def __init__(self, *, store: FactStore, served: RegisteredFacts, index: RetrievalIndex,
                 scopes: Scopes, gate: InteractiveGate, counters: Counter[str],
                 embed: Callable[[list[str]], torch.Tensor], dim: Callable[[], int],
                 config: EngineConfig, context_turns: int, dedupe_threshold: float | None,
                 encode: bool, max_queued_facts: int = DEFAULT_MAX_QUEUED_FACTS,
                 workers: int = 1, infer: Infer | None = None) -> None:
        self._max_queued = checks.check_int(max_queued_facts, "max_queued_facts", 1,
                                            InvalidRequestError)
        self._num_workers = checks.check_int(workers, "add_workers", 1, InvalidRequestError)
        self._store, self._served, self._index, self._scopes = store, served, index, scopes
        self._gate, self._counters, self._embed, self._dim = gate, counters, embed, dim
        self._config, self._context_turns = config, context_turns
        self._threshold, self._encode, self._infer = dedupe_threshold, encode, infer
        self._jobs: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._queued = 0
        """Facts in jobs not yet finished (queued or running)."""
        self._running = 0
        self._statuses: OrderedDict[FactId, tuple[str, AddStatus]] = OrderedDict()
        """Per fact this process queued: (user, status); the oldest finished ones dropped."""
        self._threads: list[threading.Thread] = []
        self._closed = False

    # ---- the caller's side ----------------------------------------------------------------
    def submit(self, user: UserScope, request: ingest.AddInput,
               tokenize: Callable[[str], tuple[int, ...]], dedupe: bool,
               infer: bool = False) -> list[AddResult]:
        """Store an add's facts as pending and queue the rest; one PENDING result per fact.

        infer=True: the facts are user messages (request.metadata holds INFER_KEY) for the
        served model to read (module docstring).

        Raises:
            AddQueueFullError: max_queued_facts facts are waiting; nothing is stored.
        """
        token_ids = [tokenize(text) for text in request.texts]
        num_facts = len(token_ids)
        self._reserve(num_facts)
        try:
            stand_in = torch.zeros(self._dim() if num_facts else 1)
            facts = [ingest.NewFact(text, turn, ids, stand_in) for text, turn, ids in
                     zip(request.texts, request.turn_of, token_ids, strict=True)]
            later = (request.turns is None and self._config.context_source == "similar"
                     and not infer)
            with user as uid:
                if not later and not infer:
                    ingest.contexts(facts, request, uid, self._sources())
                stored = ingest.store(facts, request, uid, self._store, pending=True)
                self._served.register_pending(uid, stored)
                self._served.wrote(self._store, uid)
                self._counters["queued_adds"] += len(stored)
        except BaseException:
            self._release(num_facts)
            raise
        if facts:
            self._enqueue(_Job(uid, [s.fact_id for s in stored], request.session_id, dedupe,
                               later, infer))
        return [AddResult(f.fact_id, f.text, "ADD", turn=f.turn, status="PENDING")
                for f in facts if f.fact_id is not None]

    def status(self, *, user_id: str, fact_id: int) -> AddStatus:
        """How the asynchronous add of a fact went (its event: PENDING, ... SUCCEEDED).

        Raises:
            FactNotFoundError: the user has no such fact (never added, or deleted).
        """
        user = self._scopes.user(user_id, sync=False)
        (fact_id,) = checks.check_fact_ids([fact_id], "fact_id")
        with self._cond:
            known = self._statuses.get(FactId(fact_id))
        if known is not None and known[0] == user.user_id and known[1].event in _ROWLESS_EVENTS:
            return known[1]  # its row is deleted: the status is all that says how it went
        with user as uid:  # the store says whether it exists (a user may delete it any time)
            (stored,) = self._store.get(user_id=uid, fact_ids=[fact_id])
        if known is not None and known[0] == user.user_id:
            return known[1]
        return AddStatus(stored.fact_id, "PENDING" if stored.pending else "SUCCEEDED")

    def owner(self, fact_id: int) -> str | None:
        """The user of a finished event whose row was deleted (DUPLICATE, INFER), or None.

        Any other id is None here: the store knows the owners of the rows it holds.
        """
        with self._cond:
            known = self._statuses.get(FactId(fact_id))
        return known[0] if known is not None and known[1].event in _ROWLESS_EVENTS else None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every queued add is done (or `timeout` s passed); True if all are."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._jobs and not self._running, timeout)

    @property
    def num_queued_facts(self) -> int:
        """Facts waiting for (or in) the background work now."""
        return self._queued

    def resume(self) -> None:
        """Queue the facts a previous process left pending (start-up): one job per user."""
        by_user: dict[tuple[str, bool, bool], list[StoredFact]] = {}
        for fact in self._store.pending_facts():
            infer = INFER_KEY in fact.metadata
            later = (stored_context(fact.metadata) is None and not infer
                     and self._config.context_source == "similar")
            by_user.setdefault((fact.user_id, later, infer), []).append(fact)
        for (user_id, later, infer), facts in by_user.items():
            with self._scopes.open():
                self._served.register_pending(user_id, facts)
            with self._cond:
                self._queued += len(facts)  # never refused: they are stored already
            self._enqueue(_Job(user_id, [f.fact_id for f in facts], None, True, later, infer))
            self._counters["resumed_adds"] += len(facts)

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop the workers after their current step; unfinished facts stay pending."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout_s)

    # ---- the workers' side ----------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._jobs or self._closed)
                if self._closed:
                    return
                job = self._jobs.popleft()
                self._running += 1
            try:
                self._gate.wait_turn()
                self._run(job)
            except (EngineClosedError, StoreError) as exc:
                if not self._closed:
                    self._failed(job, exc)
            except Exception as exc:  # noqa: BLE001 - the facts stay stored and served as text
                self._failed(job, exc)
            finally:
                with self._cond:
                    self._running -= 1
                    self._release(len(job.fact_ids), notify=False)
                    self._cond.notify_all()

    def _run(self, job: _Job) -> None:
        """Embed, check duplicates, write the embedding, encode and index one job's facts."""
        self._mark(job, job.fact_ids, "RUNNING")
        with self._scopes.user(job.user_id) as uid:
            stored = self._rows(uid, job.fact_ids)
        with self._cond:  # deleted meanwhile: their status is the store's (FactNotFoundError)
            for gone in set(job.fact_ids) - {s.fact_id for s in stored}:
                self._statuses.pop(gone, None)
        if not stored or self._closed:
            return
        if job.infer:
            self._run_infer(job, uid, stored)
            return
        vectors = self._embed([f.text for f in stored])  # outside the lock
        if self._closed:  # the facts stay pending in the store: resumed at the next start
            return
        facts = [ingest.NewFact(f.text, None, f.token_ids, v) for f, v in
                 zip(stored, vectors, strict=True)]
        with self._scopes.user(job.user_id) as uid:
            ingest.duplicates(facts, self._index, uid, self._threshold if job.dedupe else None,
                              self._served.text_of)
            if job.contexts_later:
                texts = [f.text for f in facts]
                ingest.contexts(facts, ingest.AddInput(job.session_id, None, texts,
                                                       [None] * len(texts), None),
                                uid, self._sources())
            self._drop_duplicates(job, uid, stored, facts)
            done: dict[int, tuple[torch.Tensor, dict[str, Any]]] = {
                s.fact_id: (f.vector, {**s.metadata, **(context_metadata(f.context)
                                                        if job.contexts_later else {})})
                for s, f in zip(stored, facts, strict=True) if f.kept}
            written = self._store.finish_pending(user_id=uid, done=done) if done else []
            self._served.wrote(self._store, uid)
            finished = self._rows(uid, [s.fact_id for s in stored if s.fact_id in done])
        for lo, hi in self._gate.chunks(len(finished)):
            with self._scopes.open():
                self._served.finish(uid, finished[lo:hi], self._encode)
        self._counters["async_added"] += len(written)
        kept = {f.fact_id for f in finished}
        with self._cond:  # deleted while it was embedded: its status is the store's
            for lost in set(done) - kept:
                self._statuses.pop(FactId(lost), None)
        self._mark(job, [f.fact_id for f in finished], "SUCCEEDED")

    def _run_infer(self, job: _Job, user_id: str, stored: Sequence[StoredFact]) -> None:
        """add(infer=True) of the stored user messages, then their rows deleted."""
        if self._infer is None:
            raise InvalidRequestError("this Memory runs no inferred adds")
        first = stored[0]
        if first.expires_at is not None and first.expires_at <= time.time():
            results: list[AddResult] = []  # expired while queued: nothing left to read
            self._counters["infer_expired"] += 1
        else:
            results = self._infer(
                user_id=user_id, messages=[{"role": "user", "content": f.text} for f in stored],
                metadata=public_metadata(first.metadata) or None,
                agent_id=first.metadata.get(AGENT_KEY), run_id=first.metadata.get(RUN_KEY),
                timestamp=first.valid_from, expiration_date=first.expires_at)
        with self._scopes.user(job.user_id) as uid:
            ids = [f.fact_id for f in self._rows(uid, [f.fact_id for f in stored])]
            if ids:
                self._store.delete(user_id=uid, fact_ids=ids)
                self._served.forget(uid, ids)
                self._served.wrote(self._store, uid)
        self._counters["inferred_adds"] += 1
        done = AddStatus(FactId(0), "SUCCEEDED", "INFER", inferred=tuple(results))
        with self._cond:
            for fact_id in job.fact_ids:
                if fact_id in ids:
                    self._set(job.user_id, replace(done, fact_id=fact_id))
                else:  # deleted by the user meanwhile: the store's answer (not found)
                    self._statuses.pop(fact_id, None)

    def _drop_duplicates(self, job: _Job, user_id: str, stored: Sequence[StoredFact],
                         facts: Sequence[ingest.NewFact]) -> None:
        """Delete the rows of facts the check found to repeat another (history: DELETE)."""
        for fact, row in zip(facts, stored, strict=True):
            if fact.duplicate_of is None:
                continue
            target, score = fact.duplicate_of
            original = stored[target[0]].fact_id if isinstance(target, tuple) else target
            try:
                self._store.delete(user_id=user_id, fact_ids=[row.fact_id])
            except FactNotFoundError:
                continue  # deleted meanwhile
            self._served.forget(user_id, [row.fact_id])
            self._counters["duplicates"] += 1
            self._set(job.user_id, AddStatus(row.fact_id, "SUCCEEDED", "DUPLICATE", original))

    def _rows(self, user_id: str, fact_ids: list[FactId]) -> list[StoredFact]:
        """The facts of `fact_ids` still stored (a user may delete one meanwhile)."""
        try:
            return self._store.get(user_id=user_id, fact_ids=fact_ids)
        except FactNotFoundError:
            wanted = set(fact_ids)
            return [f for f in self._store.get_all(user_id=user_id) if f.fact_id in wanted]

    def _failed(self, job: _Job, exc: BaseException) -> None:
        logger.warning("asynchronous add of %d facts of %r failed (%s: %s); they stay stored "
                       "and served as text, and are retried at the next start",
                       len(job.fact_ids), job.user_id, type(exc).__name__, exc)
        self._counters["async_add_failures"] += len(job.fact_ids)
        with self._cond:
            for fact_id in job.fact_ids:
                known = self._statuses.get(fact_id)
                if known is None or known[1].status in ("PENDING", "RUNNING"):
                    self._set(job.user_id, AddStatus(fact_id, "FAILED",
                                                     error=f"{type(exc).__name__}: {exc}"))

    # ---- queue bookkeeping -------------------------------------------------------------
    def _reserve(self, num_facts: int) -> None:
        with self._cond:
            if self._closed:
                raise EngineClosedError("this Memory was closed; build a new Memory")
            if num_facts and self._queued + num_facts > self._max_queued:
                self._counters["async_add_refusals"] += 1
                raise AddQueueFullError(
                    f"{self._queued} facts are waiting for their embedding and KV and this add "
                    f"brings {num_facts} (max_queued_facts={self._max_queued}); retry later, "
                    "add fewer facts at a time, or add with wait=True")
            self._queued += num_facts

    def _release(self, num_facts: int, notify: bool = True) -> None:
        with self._cond:
            self._queued -= num_facts
            if notify:
                self._cond.notify_all()

    def _enqueue(self, job: _Job) -> None:
        with self._cond:
            self._jobs.append(job)
            for fact_id in job.fact_ids:
                self._set(job.user_id, AddStatus(fact_id, "PENDING"))
            while len(self._threads) < self._num_workers:
                thread = threading.Thread(target=self._work, daemon=True,
                                          name=f"inferscale-adds-{len(self._threads)}")
                self._threads.append(thread)
                thread.start()
            self._cond.notify_all()

    def _mark(self, job: _Job, fact_ids: Sequence[FactId], status: str) -> None:
        with self._cond:
            for fact_id in fact_ids:
                self._set(job.user_id, AddStatus(fact_id, status))

    def _set(self, user_id: str, status: AddStatus) -> None:
        with self._cond:  # re-entrant use from _failed and _enqueue: Condition over an RLock
            self._statuses[status.fact_id] = (user_id, status)
            self._statuses.move_to_end(status.fact_id)
            while len(self._statuses) > _KEPT_STATUSES:
                self._statuses.popitem(last=False)

    def _sources(self) -> ingest.ContextSources:
        return ingest.ContextSources(self._store, self._index, self._config,
                                     self._context_turns, self._served.prompt_line)
