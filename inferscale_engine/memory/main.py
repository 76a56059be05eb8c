"""Memory: the user-facing memory API, composed of its parts (mem0's verbs, scoped by user_id).

A write goes to the durable store first (one transaction per call, store/), then to the Engine
(KV encoding, registration.py), then to the search index: a crash never loses an acknowledged
fact, and search never names a fact the engine does not know. KV is a cache: at start-up
stored facts are re-encoded (startup='encode') or on first use ('lazy'). The answering verbs
are Answering's (answering.py); Memory forwards them. Every verb opens with one scope
(UserScope: the user id checked, the lock, the Memory open, a shared store's changes synced).

Fact ids: a Memory owns its Engine's fact ids (they are its store's ids). The Engine refuses
add_facts numbered by itself and a second Memory while this one is open (Engine.claim_fact_ids).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from inferscale_engine import checks
from inferscale_engine.errors import EngineClosedError, InvalidFactError, InvalidRequestError
from inferscale_engine.memory import ingest, supersession
from inferscale_engine.memory.aio import forward, in_thread, streamed
from inferscale_engine.memory.answering import Answering
from inferscale_engine.memory.background import BackgroundAdds
from inferscale_engine.memory.config import (
    DEFAULT_DB_PATH,
    DEFAULT_EMBEDDING_MODEL,
    DEFAULT_EXPIRY_SWEEP_S,
    DEFAULT_MAX_QUEUED_FACTS,
    DEFAULT_MAX_SERVED_USERS,
    DEFAULT_SUPERSEDE_THRESHOLD,
    MemoryConfig,
    check_dedupe_threshold,
    check_expiry,
    check_startup,
)
from inferscale_engine.memory.dating import FactDates
from inferscale_engine.memory.editing import Editing
from inferscale_engine.memory.expiry import Expiry, expiration_time
from inferscale_engine.memory.gate import InteractiveGate
from inferscale_engine.memory.infer import infer_add
from inferscale_engine.memory.listing import Listing
from inferscale_engine.memory.pinning import Pinning
from inferscale_engine.memory.registration import RegisteredFacts
from inferscale_engine.memory.scope import Scopes
from inferscale_engine.memory.search import hybrid, versions
from inferscale_engine.memory.search.embedder import Embedder
from inferscale_engine.memory.search.index import RetrievalIndex
from inferscale_engine.memory.search.lexical import context_facts
from inferscale_engine.memory.searching import (
    DEFAULT_RERANK_CANDIDATES,
    Reranker,
    Searching,
)
from inferscale_engine.memory.store import FactStore, open_store
from inferscale_engine.memory.store.reserved import INFER_KEY
from inferscale_engine.memory.transfers import Transfers
from inferscale_engine.memory.types import AddResult, MemoryStats
from inferscale_engine.runtime.engine import Engine

logger = logging.getLogger(__name__)


class Memory:
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
                 max_served_users: int = DEFAULT_MAX_SERVED_USERS,
                 supersede_threshold: float | None = DEFAULT_SUPERSEDE_THRESHOLD,
                 max_queued_facts: int = DEFAULT_MAX_QUEUED_FACTS, add_workers: int = 1,
                 on_expiry: str = "hide", expiry_sweep_s: float | None = DEFAULT_EXPIRY_SWEEP_S,
                 search_mode: str = hybrid.DEFAULT_SEARCH_MODE,
                 reranker: Reranker | None = None,
                 rerank_candidates: int = DEFAULT_RERANK_CANDIDATES,
                 hide_older_versions: str = versions.DEFAULT_HIDE_OLDER_VERSIONS,
                 date_facts: bool = False, recency_weight: float = 0.0,
                 recency_half_life_days: float = 30.0, neighbor_share: float = 0.0,
                 keyword_context: bool = False) -> None:
        """Open the store and make every stored fact searchable and servable.

        Args:
            engine: the serving engine. This Memory owns its fact ids: add no facts to it
                directly, and build no second Memory on it while this one is open.
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
            half_scan_min_rows, max_served_users, on_expiry, expiry_sweep_s, search_mode: see
                MemoryConfig (expired facts: memory/expiry.py).
            supersede_threshold: an added fact supersedes the user's older facts whose
                embeddings have at least this cosine similarity with its own (supersession.py);
                None: facts are only superseded explicitly (supersede(), infer=True).
            max_queued_facts, add_workers: the queue of add(wait=False) (background.py): the
                facts that may wait at once, and the threads that embed and encode them.
            reranker, rerank_candidates: (query, texts) -> scores (a cross-encoder, say): the
                rerank_candidates best facts of a search are reordered by it (searching.py).
            hide_older_versions: 'now' (default), 'always' or 'never': whether a search leaves
                out older versions of the facts it found (search/versions.py).
            date_facts: serve each fact as '[8 May 2023] <text>', its date written into the
                KV and the text prompt alike (dating.py); stored and returned texts are as added.
            recency_weight, recency_half_life_days: a present search chooses by relevance plus
                recency_weight * 0.5 ** (age / half-life) (search/recency.py); 0: off.
            neighbor_share: share of a present search's k given to the facts added right
                beside its best facts (search/neighbors.py); 0: off.
            keyword_context: a fact is also matched by the words of the facts of its session
                added right before it (search/lexical.py; hybrid search).

        Raises:
            ConfigError: a bad option, or another open Memory owns the engine's fact ids.
        """
        self._dedupe_threshold = check_dedupe_threshold(dedupe_threshold)
        self._supersede_threshold = check_dedupe_threshold(supersede_threshold,
                                                           "supersede_threshold")
        check_startup(startup)
        check_expiry(on_expiry, expiry_sweep_s)
        self._search_mode = hybrid.check_search_mode(search_mode, setting=True)
        versions.check_hide_older_versions(hide_older_versions, setting=True)
        checks.check_half_scan_min_rows(half_scan_min_rows)
        checks.check_int(context_turns, "context_turns", 0, InvalidRequestError)
        self._engine = engine
        self._owns_engine = False
        engine.claim_fact_ids(self)
        self._owns_store = not isinstance(store, FactStore)
        try:
            self._store = open_store(store)
        except BaseException:
            engine.release_fact_ids(self)
            raise
        try:
            self._embedder = embedder if isinstance(embedder, Embedder) else Embedder(
                embedder or DEFAULT_EMBEDDING_MODEL, device=device)
            self._device = torch.device(device) if device else self._embedder.device
            self._index = RetrievalIndex(device=self._device,
                                         half_scan_min_rows=half_scan_min_rows,
                                         context_facts=context_facts(keyword_context))
            self._encode_on_add = encode_on_add
            self._context_turns = context_turns
            self._lock = threading.RLock()
            self._gate = InteractiveGate()
            """Large adds yield to searches and answers between chunks (gate.py)."""
            self._closed = False
            self.counters: Counter[str] = Counter()
            self._dates = FactDates(engine.tokenize_fact, date_facts)
            self._served = RegisteredFacts(engine, self._index, self.counters, max_served_users,
                                           self._dates)
            """What search may return: facts registered with the engine and indexed."""
            self._scopes = Scopes(self._lock, self._check_open, self._served, self._store)
            self._user, self._open = self._scopes.user, self._scopes.open
            """The preamble of every verb (scope.py)."""
            self._pinning = Pinning(engine, self._store, self._served, self._scopes,
                                    self.counters)
            self._answering = Answering(engine, self._store, self._served, self._gate,
                                        self.counters, self._scopes, self.search,
                                        self._pinning.served_pins)
            self._searching = Searching(self._store, self._served, self._index, self._scopes,
                                        self._gate, self._embed, self._search_mode,
                                        self.counters, reranker, rerank_candidates,
                                        hide_older_versions, recency_weight,
                                        recency_half_life_days, neighbor_share)
            self._listing = Listing(self._store, self._scopes)
            self._editing = Editing(self._store, self._served, self._scopes, self.counters,
                                    self._dates.tokens, self._embed, encode_on_add,
                                    self._listing.records, self.add, self._pinning)
            self._transfers = Transfers(self._store, self._served, self._scopes, self._gate,
                                        self.counters, self._dates.tokens,
                                        self._embed_in_chunks, encode_on_add,
                                        lambda: self._expiry.start(), self._pinning.pin)
            self._served.register_stored(self._store, self._embedder.name, self._embed,
                                         startup == "encode", progress_bar)
            self._background = BackgroundAdds(
                store=self._store, served=self._served, index=self._index, scopes=self._scopes,
                gate=self._gate, counters=self.counters, embed=self._embed_in_chunks,
                dim=lambda: self._embedder.dim, config=engine.config,
                context_turns=context_turns, dedupe_threshold=self._dedupe_threshold,
                encode=encode_on_add, max_queued_facts=max_queued_facts, workers=add_workers,
                infer=lambda **call: infer_add(self, **call))
            self._background.resume()  # facts a previous process left pending
            self._expiry = Expiry(self._store, self._scopes, self.counters, on_expiry,
                                  expiry_sweep_s)
        except BaseException:
            engine.release_fact_ids(self)
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
                         max_served_users=config.max_served_users,
                         supersede_threshold=config.supersede_threshold,
                         max_queued_facts=config.max_queued_facts,
                         on_expiry=config.on_expiry, expiry_sweep_s=config.expiry_sweep_s,
                         search_mode=config.search_mode,
                         hide_older_versions=config.hide_older_versions,
                         date_facts=config.date_facts, recency_weight=config.recency_weight,
                         recency_half_life_days=config.recency_half_life_days,
                         neighbor_share=config.neighbor_share,
                         keyword_context=config.keyword_context)
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
            infer: bool = False, timestamp: Any = None, expiration_date: Any = None,
            wait: bool = True, pinned: bool = False) -> list[AddResult]:
        """Remember facts, or a conversation's turns; one result per fact, in order.

        dedupe=False stores every fact, also one that repeats a stored fact (stores keyed by
        something other than the text, such as LangGraph's). agent_id and run_id (mem0's
        scopes) tag the facts; search, records and delete_all can then narrow to them.
        infer=True has the served model extract facts from `messages` and add, update or
        delete stored facts accordingly (memory/infer.py); results say which it did.
        timestamp (mem0's name; a datetime, date, ISO string or epoch seconds; default now):
        when the facts became true. A new fact supersedes older ones it replaces
        (supersede_threshold, supersession.py).
        expiration_date (mem0's: a date, datetime, ISO string or epoch seconds) is when the
        facts stop being served (memory/expiry.py).

        With `messages`, every turn is recorded in the session and the content of each user or
        assistant turn becomes a fact encoded after the session's turns before it (their last W
        tokens; AddResult.turn names the message); facts added as texts: see
        EngineConfig.context_source. The steps are ingest.py's.

        wait=False returns once facts and turns are stored (results 'PENDING'); embedding,
        duplicate check and KV follow in a queue (background.py, add_status, wait_adds). With
        infer=True it stores the user's messages (served as text meanwhile) and the model's
        extraction and decisions run in the queue; each message's add_status then says
        'INFER' and lists what was done, and the message rows are deleted.
        pinned=True pins the facts (and stored facts they repeat): in every answer of the user,
        before the retrieved facts, outside k, their KV never evicted (pinning.py).

        Raises:
            InvalidUserIdError, InvalidFactError, InvalidTurnError, InvalidRequestError: bad
                input; nothing is stored.
            AddQueueFullError: wait=False with max_queued_facts facts waiting; nothing stored.
            InvalidRequestError: pinned=True over a cap (pinning.py); nothing stored.
        """
        user = self._user(user_id)
        if pinned is True and (infer or not wait):
            raise InvalidRequestError("add(pinned=True) needs wait=True and infer=False: a "
                                      "pinned fact is served as KV from the moment it is added")
        if infer:
            checks.check_session(session_id)
        if infer and not wait:  # the user's messages stored now, the model reads them later
            said = [piece for m in ingest.infer_messages(texts, messages) if m["role"] == "user"
                    and checks.has_visible(m["content"])
                    for piece in self._answering.split_text(m["content"])]
            request = ingest.AddInput.checked(said, None, None, metadata, agent_id, run_id,
                                              timestamp, expiration_date)
            request = replace(request, metadata={**(request.metadata or {}), INFER_KEY: True})
            return self._background.submit(user, request, self._dates.tokenizer(
                request.valid_from), False, infer=True) if said else []
        if infer:  # texts are read as the user's messages
            return infer_add(self, user_id=user.user_id, metadata=metadata, agent_id=agent_id,
                             run_id=run_id, messages=ingest.infer_messages(texts, messages),
                             timestamp=checks.check_time(timestamp, "timestamp",
                                                         InvalidFactError),
                             expiration_date=expiration_time(expiration_date))
        request = ingest.AddInput.checked(texts, messages, session_id, metadata, agent_id, run_id,
                                          timestamp, expiration_date, pinned)
        if not wait:
            return self._background.submit(user, request, self._dates.tokenizer(
                request.valid_from), dedupe)
        facts = ingest.new_facts(request, self._dates.tokenizer(request.valid_from),
                                 self._embed_in_chunks)
        with user as uid:
            ingest.duplicates(facts, self._index, uid,
                              self._dedupe_threshold if dedupe else None, self._served.text_of)
            if request.pinned:
                self._pinning.check_add(uid, [len(f.token_ids) for f in facts if f.kept],
                                        ingest.repeated(facts))
            ingest.contexts(facts, request, uid, ingest.ContextSources(
                self._store, self._index, self._engine.config, self._context_turns,
                self._served.prompt_line))
            stored = ingest.store(facts, request, uid, self._store)
            self._served.stage(f.fact_id for f in stored)
            found = supersession.find(stored, ingest.kept_vectors(facts), self._index, uid,
                                      self._served.since, self._supersede_threshold)
            carried = self._pinning.pinned_of(uid, found)  # a pin moves to the newer fact
            self.counters["superseded"] += supersession.apply(self._store, uid, found,
                                                              self._served.forget)
            if request.pinned:  # capped, so few: pinned before the lock is let go
                self._served.register_staged(uid, stored, True)
                self._pinning.pin_repeated(uid, ingest.repeated(facts))
            self._served.wrote(self._store, uid)
            self.counters["added"] += len(stored)
            self.counters["duplicates"] += len(facts) - len(stored)
        self._served.register_in_chunks(uid, stored, self._encode_on_add, self._gate,
                                        self._open)
        self._pinning.carry(uid, carried)
        if request.expires_at is not None:
            self._expiry.start()
        return ingest.results(facts)

    # ---- read verbs --------------------------------------------------------------------
    def stats(self) -> MemoryStats:
        """Sizes and counters (the engine's include evictions, re-encodes and fallbacks)."""
        with self._open():
            engine = self._engine.stats()
            return MemoryStats(len(self._store.users()), self._store.count(), len(self._served),
                               engine.num_resident_facts, engine, dict(self.counters),
                               self._served.num_users)

    # ---- the parts' verbs: searching, editing, listing, transfers, answering ------------
    search = forward("_searching", Searching.search)
    add_status = forward("_background", BackgroundAdds.status)
    wait_adds = forward("_background", BackgroundAdds.wait)
    event_owner = forward("_background", BackgroundAdds.owner)
    add_turns = forward("_editing", Editing.add_turns)
    update = forward("_editing", Editing.update)
    supersede = forward("_editing", Editing.supersede)
    delete = forward("_editing", Editing.delete)
    reset = forward("_editing", Editing.reset)
    delete_all = forward("_editing", Editing.delete_all)
    pin = forward("_pinning", Pinning.pin)
    unpin = forward("_pinning", Pinning.unpin)
    pinned = forward("_pinning", Pinning.pinned)
    sweep_expired = forward("_expiry", Expiry.sweep_expired)
    set_expiration = forward("_expiry", Expiry.set_expiration)
    owner_of = forward("_listing", Listing.owner_of)
    get = forward("_listing", Listing.get)
    get_all = forward("_listing", Listing.get_all)
    records = forward("_listing", Listing.records)
    history = forward("_listing", Listing.history)
    users = forward("_listing", Listing.users)
    turns = forward("_listing", Listing.turns)
    sessions = forward("_listing", Listing.sessions)
    export = forward("_transfers", Transfers.export)
    import_ = forward("_transfers", Transfers.import_)
    generate = forward("_answering", Answering.generate)
    answer = forward("_answering", Answering.answer)
    stream = forward("_answering", Answering.stream)
    answer_stream = forward("_answering", Answering.answer_stream)
    prepare = forward("_answering", Answering.prepare)
    handle_for = forward("_answering", Answering.handle_for)
    interactive = forward("_answering", Answering.interactive)
    split_text = forward("_answering", Answering.split_text)
    parse_tool_calls = forward("_answering", Answering.parse_tool_calls)
    text_pieces = forward("_answering", Answering.text_pieces)

    @property
    def model_name(self) -> str:
        """The served model's folder name."""
        return self._answering.model_name

    @property
    def max_model_len(self) -> int:
        """Longest prompt + answer the engine serves, in tokens."""
        return self._answering.max_model_len

    # ---- async twins: the same verbs in a worker thread (aio.py) ------------------------
    aadd, aadd_turns, aupdate = in_thread(add), in_thread(add_turns), in_thread(update)
    asupersede = in_thread(supersede)
    adelete, areset, asearch = in_thread(delete), in_thread(reset), in_thread(search)
    aget, aget_all, arecords = in_thread(get), in_thread(get_all), in_thread(records)
    agenerate, aanswer = in_thread(generate), in_thread(answer)
    astream, aanswer_stream = streamed(stream), streamed(answer_stream)

    # ---- life ----------------------------------------------------------------------------
    def close(self) -> None:
        """Close what this Memory opened (a store given as a path, an engine from_config).

        A shared engine only forgets this Memory's facts, which frees their slab pages.
        """
        self._background.close()  # before the lock: a worker may be waiting for it
        self._expiry.close()  # likewise a sweep
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
                self._engine.release_fact_ids(self)
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

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("this Memory was closed; build a new Memory")
