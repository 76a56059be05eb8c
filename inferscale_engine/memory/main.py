"""Memory: the user-facing memory API (add, search, get_all, update, delete, reset, generate).

Every verb is scoped by the keyword `user_id=`. A write goes to the durable FactStore first (one
transaction per call), then to the Engine (KV encoding), then to the retrieval index: a crash
never loses an acknowledged fact, and search never names a fact the engine does not know. KV is
a cache: at start-up stored facts are re-encoded (startup='encode') or on first use ('lazy').
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tqdm import tqdm

from inferscale_engine import checks
from inferscale_engine.errors import EngineClosedError, InvalidFactError, InvalidRequestError
from inferscale_engine.facts import Fact, MemoryHandle
from inferscale_engine.memory import ingest
from inferscale_engine.memory.aio import AsyncVerbs
from inferscale_engine.memory.answering import MemoryServing
from inferscale_engine.memory.config import (
    DEFAULT_DB_PATH,
    DEFAULT_EMBEDDING_MODEL,
    DEFAULT_MAX_SERVED_USERS,
    MemoryConfig,
    check_dedupe_threshold,
    check_startup,
)
from inferscale_engine.memory.gate import InteractiveGate, interactive_call
from inferscale_engine.memory.infer import infer_add
from inferscale_engine.memory.registration import ServedFacts
from inferscale_engine.memory.search import filters
from inferscale_engine.memory.search.embedder import Embedder
from inferscale_engine.memory.search.index import RetrievalIndex
from inferscale_engine.memory.store import FactStore, StoredFact, Turn, open_store, reserved
from inferscale_engine.memory.store.history import HistoryEvent
from inferscale_engine.memory.store.sessions import Session
from inferscale_engine.memory.types import AddResult, MemoryStats, SearchResult
from inferscale_engine.runtime.engine import Engine

logger = logging.getLogger(__name__)

_PROGRESS_FROM = 256
"""Adds of this many facts show a progress bar (on a terminal) while their KV is encoded."""

class Memory(MemoryServing, AsyncVerbs):
    """Long-term memory of many users, served as injected KV. Thread-safe.

    A large add works in chunks and lets searches and answers of other users go first between
    them, so one user's bulk import does not stall everyone's chats.
    """

    def __init__(self, engine: Engine, store: FactStore | str | os.PathLike[str] = DEFAULT_DB_PATH,
                 embedder: Embedder | str | None = None, *,
                 dedupe_threshold: float | None = 0.95, startup: str = "encode",
                 encode_on_add: bool = True, device: str | torch.device | None = None,
                 context_turns: int = 16, progress_bar: bool | None = None,
                 half_scan_min_rows: int | None = None,
                 max_served_users: int = DEFAULT_MAX_SERVED_USERS) -> None:
        """Open the store and make every stored fact searchable and servable.

        Args:
            engine: the serving engine. This Memory owns its fact ids: add no facts to it
                directly.
            store: a FactStore, the path of its SQLite file (created if missing), or a
                postgresql:// URL (a database that several processes may share).
            embedder: an Embedder, a sentence-transformers model name, or None (the offline
                all-MiniLM-L6-v2).
            dedupe_threshold: cosine similarity at or above which an added fact is reported as a
                DUPLICATE of an existing one instead of being stored; None stores everything.
            startup: 'encode' re-encodes every stored fact's KV now (batched, with a progress
                bar); 'lazy' registers the facts and encodes each on first use.
            encode_on_add: encode KV in add() (False: on first use).
            device: where the embedding matrices live; None = the embedder's device.
            context_turns: stored turns of a session (or, for facts added as texts, the user's
                last facts) read as the context a new fact is encoded after.
            progress_bar: show the start-up progress bar (None: only on a terminal).
            half_scan_min_rows, max_served_users: see MemoryConfig.
        """
        self._dedupe_threshold = check_dedupe_threshold(dedupe_threshold)
        check_startup(startup)
        checks.check_half_scan_min_rows(half_scan_min_rows)
        checks.check_int(context_turns, "context_turns", 0, InvalidRequestError)
        self._engine = engine
        self._owns_engine = False
        self._owns_store = not isinstance(store, FactStore)
        self._store = open_store(store)
        try:
            self._embedder = embedder if isinstance(embedder, Embedder) else Embedder(
                embedder or DEFAULT_EMBEDDING_MODEL, device=device)
            self._device = torch.device(device) if device else self._embedder.device
            self._index = RetrievalIndex(device=self._device,
                                         half_scan_min_rows=half_scan_min_rows)
            self._encode_on_add = encode_on_add
            self._context_turns = context_turns
            self._lock = threading.RLock()
            self._gate = InteractiveGate()
            """Large adds yield to searches and answers between chunks (gate.py)."""
            self._closed = False
            self.counters: Counter[str] = Counter()
            self._served = ServedFacts(engine, self._index, self.counters, max_served_users)
            """What search may return: facts registered with the engine and indexed."""
            self._served.load(self._store, self._embedder.name, self._embed,
                              startup == "encode", progress_bar)
        except BaseException:
            if self._owns_store:
                self._store.close()
            raise

    @classmethod
    def from_config(cls, config: MemoryConfig, *, runner: Any = None) -> Memory:
        """Build the Engine, store and embedder of `config`; close() closes them all.

        `runner` is what drives vLLM (default: a co-located vllm.LLM; see Engine).
        """
        engine = Engine(config.engine, **({"runner": runner} if runner is not None else {}))
        try:
            memory = cls(engine, config.db_path,
                         Embedder(config.embedding_model, device=config.device),
                         dedupe_threshold=config.dedupe_threshold, startup=config.startup,
                         encode_on_add=config.encode_on_add, device=config.device,
                         half_scan_min_rows=config.half_scan_min_rows,
                         max_served_users=config.max_served_users)
        except BaseException:
            engine.close()
            raise
        memory._owns_engine = True
        return memory

    @property
    def engine(self) -> Engine:
        """The serving engine."""
        return self._engine

    # ---- write verbs -------------------------------------------------------------------
    def add(self, *, user_id: str, texts: Sequence[str] | None = None,
            messages: Sequence[Mapping[str, str]] | None = None, session_id: str | None = None,
            metadata: Mapping[str, Any] | None = None, dedupe: bool = True,
            agent_id: str | None = None, run_id: str | None = None,
            infer: bool = False) -> list[AddResult]:
        """Remember facts, or a conversation's turns; one result per fact, in order.

        dedupe=False stores every fact, also one that repeats a stored fact (stores keyed by
        something other than the text, such as LangGraph's). agent_id and run_id (mem0's
        scopes) tag the facts; search, records and delete_all can then narrow to them.
        infer=True has the served model extract facts from `messages` and add, update or
        delete stored facts accordingly (memory/infer.py); results say which it did.

        With `messages`, every turn is recorded in the session and the content of each user or
        assistant turn becomes a fact encoded after the session's turns before it (their last W
        tokens); facts added as texts: see EngineConfig.context_source.

        Raises:
            InvalidUserIdError, InvalidFactError, InvalidTurnError, InvalidRequestError: bad
                input; nothing is stored.
        """
        user_id = checks.check_user_id(user_id)
        session_id = checks.check_session(session_id)
        if infer:  # texts are read as the user's messages
            chat = checks.check_messages(messages if messages is not None else [
                {"role": "user", "content": t} for t in checks.check_list(
                    texts, "texts", InvalidFactError)])
            return infer_add(self, user_id=user_id, messages=[
                {"role": r, "content": c} for r, c in chat], metadata=metadata,
                agent_id=agent_id, run_id=run_id)
        metadata = reserved.scoped(checks.check_metadata(metadata),
                                   *filters.scope(agent_id, run_id))
        if (texts is None) == (messages is None):
            raise InvalidRequestError("pass exactly one of texts=[...] (facts) or messages=[...] "
                                      "(conversation turns)")
        turns = checks.check_messages(messages) if messages is not None else None
        if turns is None:
            facts = [(checks.check_text(t, f"texts[{i}]"), 0) for i, t in
                     enumerate(checks.check_list(texts, "texts", InvalidFactError))]
        else:
            facts = ingest.turn_facts(turns)
        token_ids = [self._engine.tokenize_fact(text) for text, _ in facts]
        vectors = self._embed_in_chunks([text for text, _ in facts])
        with self._lock:
            self._check_open()
            self._served.sync(self._store, user_id)
            matches = ingest.find_duplicates(
                self._index, user_id, vectors, self._dedupe_threshold if dedupe else None,
                [text for text, _ in facts],
                self._served.text_of)
            keep = [i for i, match in enumerate(matches) if match is None]
            contexts = ingest.contexts(self._store, user_id, session_id, turns, facts, keep,
                                       self._context_turns, [len(t) for t in token_ids],
                                       self._engine.config, ingest.SimilarSource(
                                           self._index, vectors, self._served.prompt_line))
            stored = ingest.store_facts(self._store, user_id, session_id, metadata,
                                        [facts[i][0] for i in keep], [token_ids[i] for i in keep],
                                        vectors[keep], [contexts[i] for i in keep], turns or ())
            self._served.stage(f.fact_id for f in stored)
            self._served.wrote(self._store, user_id)
            new_ids = dict(zip(keep, (f.fact_id for f in stored), strict=True))
            self.counters["added"] += len(keep)
            self.counters["duplicates"] += len(facts) - len(keep)
        self._register_in_chunks(user_id, stored)
        return ingest.add_results([text for text, _ in facts], matches, new_ids)

    def add_turns(self, *, user_id: str, session_id: str | None,
                  messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Record conversation turns only (no facts); returns their turn ids."""
        user_id = checks.check_user_id(user_id)
        session_id = checks.check_session(session_id)
        turns = checks.check_messages(messages)
        with self._lock:
            self._check_open()
            return self._store.add_turns(user_id=user_id, session_id=session_id, turns=turns)

    def update(self, *, user_id: str, fact_id: int, text: str,
               metadata: Mapping[str, Any] | None = None) -> Fact:
        """Replace a fact's text (metadata=None keeps the old metadata); its KV is rebuilt.

        Raises:
            FactNotFoundError: the user has no such fact; nothing changes.
        """
        user_id = checks.check_user_id(user_id)
        (fact_id,) = checks.check_fact_ids([fact_id], "fact_id")
        text = checks.check_text(text, "text")
        metadata = checks.check_metadata(metadata)
        token_ids = self._engine.tokenize_fact(text)
        vector = self._embed([text])[0]
        with self._lock:
            self._check_open()
            self._served.sync(self._store, user_id)
            (old,) = self._store.get(user_id=user_id, fact_ids=[fact_id])
            metadata = reserved.with_context(metadata, old.metadata)
            new = self._store.update(user_id=user_id, fact_id=fact_id, text=text,
                                     token_ids=token_ids, embedding=vector, metadata=metadata)
            self._served.forget(user_id, [fact_id])  # the new version is encoded afresh
            self._served.register(user_id, [new], self._encode_on_add)
            self._served.wrote(self._store, user_id)
            self.counters["updated"] += 1
            return new.to_fact()

    def delete(self, *, user_id: str, fact_ids: Sequence[int]) -> None:
        """Delete facts (all or nothing) and free their KV.

        Raises:
            FactNotFoundError: an id is unknown or another user's; nothing is deleted.
        """
        user_id = checks.check_user_id(user_id)
        ids = list(dict.fromkeys(checks.check_fact_ids(fact_ids)))
        with self._lock:
            self._check_open()
            self._served.sync(self._store, user_id)
            self._store.delete(user_id=user_id, fact_ids=ids)
            self._served.forget(user_id, ids)
            self._served.wrote(self._store, user_id)

    def reset(self, *, user_id: str) -> int:
        """Delete every fact and turn of a user; returns the number of facts deleted."""
        user_id = checks.check_user_id(user_id)
        with self._lock:
            self._check_open()
            self._served.sync(self._store, user_id)
            deleted = self._store.reset(user_id=user_id)
            self._served.forget(user_id, deleted)
            self._served.wrote(self._store, user_id)
            return len(deleted)

    # ---- read verbs --------------------------------------------------------------------
    @interactive_call
    def search(self, *, user_id: str, query: str, k: int = 5,
               filter: Mapping[str, Any] | None = None, agent_id: str | None = None,
               run_id: str | None = None) -> SearchResult:
        """The user's k facts most similar to `query` (cosine), best first, and their handle.

        With `filter` (memory/search/filters.py), only facts whose metadata match it; with
        agent_id / run_id, only facts added in them. A user with no facts gets an empty result.
        """
        user_id = checks.check_user_id(user_id)
        query = checks.check_text(query, "query", InvalidRequestError)
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise InvalidRequestError(f"k={k!r} must be an int >= 0 (facts to retrieve)")
        wanted = filters.check_filter(filter)
        scope = filters.scope(agent_id, run_id)
        narrow = wanted is not None or scope != (None, None)
        vector = self._embed([query])[0]
        with self._lock:
            self._check_open()
            self._served.sync(self._store, user_id)
            ranked = self._index.search(user_id=user_id, query_embedding=vector, k=k if not
                                        narrow else self._index.count(user_id=user_id))
            if not narrow:
                hits = tuple((self._served[fact_id], score) for fact_id, score in ranked)
            else:  # rank all; the filter is evaluated after, outside the lock
                stored = self._store.get(user_id=user_id, fact_ids=[f for f, _ in ranked])
        if narrow:  # the first k that match and are still served (a delete may come between)
            ranked = [hit for hit, record in zip(ranked, stored, strict=True)
                      if filters.selected(reserved.public_record(record), wanted, scope)]
            with self._lock:
                hits = tuple((self._served[f], s) for f, s in ranked if f in self._served)[:k]
        assert all(fact.user_id == user_id for fact, _ in hits), "the index crossed users"
        return SearchResult(hits, MemoryHandle(user_id, tuple(f.fact_id for f, _ in hits),
                                               tuple(score for _, score in hits)))

    def owner_of(self, fact_id: int) -> str | None:
        """The user a fact belongs to (None: no such fact); for servers checking access."""
        return self._store.owner(fact_id)

    def get(self, *, user_id: str, fact_id: int) -> StoredFact:
        """The durable record of one fact (text, token ids, metadata, timestamps)."""
        user_id = checks.check_user_id(user_id)
        (fact_id,) = checks.check_fact_ids([fact_id], "fact_id")
        with self._lock:
            self._check_open()
            (stored,) = self._store.get(user_id=user_id, fact_ids=[fact_id])
        return reserved.public_record(stored)

    def get_all(self, *, user_id: str) -> list[Fact]:
        """All facts of a user, oldest first ([] for a user with none)."""
        user_id = checks.check_user_id(user_id)
        with self._lock:
            self._check_open()
            return [f.to_fact() for f in self._store.get_all(user_id=user_id)]

    def records(self, *, user_id: str, filter: Mapping[str, Any] | None = None,
                agent_id: str | None = None, run_id: str | None = None) -> list[StoredFact]:
        """The user's facts as stored (text, metadata, timestamps), oldest first.

        With `filter` (memory/search/filters.py), those whose metadata match it; with agent_id /
        run_id, those added in them.
        """
        user_id = checks.check_user_id(user_id)
        wanted, scope = filters.check_filter(filter), filters.scope(agent_id, run_id)
        with self._lock:
            self._check_open()
            stored = self._store.get_all(user_id=user_id)
        return [r for r in map(reserved.public_record, stored)
                if filters.selected(r, wanted, scope)]

    def history(self, *, user_id: str, fact_id: int) -> list[HistoryEvent]:
        """A fact's ADD / UPDATE / DELETE events with old and new text, oldest first."""
        user_id = checks.check_user_id(user_id)
        with self._lock:
            self._check_open()
            return self._store.history(user_id=user_id, fact_id=fact_id)

    def delete_all(self, *, user_id: str, agent_id: str | None = None,
                   run_id: str | None = None) -> int:
        """Delete the user's facts added in agent_id / run_id (all: reset()); returns how many.

        Without agent_id and run_id this is reset(): facts, turns and history.
        """
        user_id = checks.check_user_id(user_id)
        scope = filters.scope(agent_id, run_id)
        if scope == (None, None):
            return self.reset(user_id=user_id)
        with self._lock:  # selected and deleted as one step
            ids = [r.fact_id for r in self.records(user_id=user_id, agent_id=agent_id,
                                                   run_id=run_id)]
            if ids:
                self.delete(user_id=user_id, fact_ids=ids)
            return len(ids)

    def users(self) -> list[str]:
        """Every user with facts or turns, sorted."""
        with self._lock:
            self._check_open()
            return self._store.users()

    def turns(self, *, user_id: str, session_id: str | None = None,
              limit: int = 20) -> list[Turn]:
        """The last `limit` turns of a session, oldest first."""
        user_id = checks.check_user_id(user_id)
        session_id = checks.check_session(session_id)
        with self._lock:
            self._check_open()
            return self._store.recent_turns(user_id=user_id, session_id=session_id, limit=limit)

    def sessions(self, *, user_id: str) -> list[Session]:
        """The user's conversations with stored turns, the most recently active first."""
        user_id = checks.check_user_id(user_id)
        with self._lock:
            self._check_open()
            return self._store.sessions(user_id=user_id)

    def stats(self) -> MemoryStats:
        """Sizes and counters (the engine's include evictions, re-encodes and fallbacks)."""
        with self._lock:
            self._check_open()
            engine = self._engine.stats()
            return MemoryStats(len(self._store.users()), self._store.count(), len(self._served),
                               engine.num_resident_facts, engine, dict(self.counters),
                               self._served.num_users)

    def close(self) -> None:
        """Close what this Memory opened (a store given as a path, an engine from_config).

        A shared engine only forgets this Memory's facts, which frees their slab pages.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._owns_engine:
                    self._engine.close()
                else:
                    self._served.release_all()
            except EngineClosedError:
                pass  # nothing left to free
            finally:
                if self._owns_store:
                    self._store.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals ---------------------------------------------------------------------
    def _embed(self, texts: list[str]) -> torch.Tensor:
        """[len(texts), dim] float32 on the index's device, rows L2-normalized."""
        return self._embedder.encode(texts).to(self._device)

    def _embed_in_chunks(self, texts: list[str]) -> torch.Tensor:
        """_embed in chunks, yielding to interactive calls between them (InteractiveGate)."""
        if len(texts) <= 1:
            return self._embed(texts)
        return torch.cat([self._embed(texts[lo:hi]) for lo, hi in self._gate.chunks(len(texts))])

    def _register_in_chunks(self, user_id: str, stored: list[StoredFact]) -> None:
        """Make an add's stored facts servable (encoding their KV), in chunks.

        The write is already durable; between chunks, interactive calls of other users go
        first (InteractiveGate), and each chunk holds the Memory's lock only while it works.
        """
        with tqdm(total=len(stored), unit="fact", desc="InferScale: encoding facts",
                  disable=None if len(stored) >= _PROGRESS_FROM else True) as bar:
            for lo, hi in self._gate.chunks(len(stored)):
                with self._lock:
                    self._check_open()
                    self._served.register_staged(user_id, stored[lo:hi], self._encode_on_add)
                bar.update(hi - lo)

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("this Memory was closed; build a new Memory")

