"""Engine: a co-located vLLM whose prompts start with injected fact KV.

Write path (write_path.py): add_facts() encodes facts through batched vLLM "save" requests
([preamble][<= W context tokens][fact], max_tokens=1); the connector keeps only the fact's KV.
Read path (read_path.py): generate() prepares [preamble][fact_1]..[fact_k][rest] from token
ids with a signed InjectionPlan and a salted prompt, runs the batch, collects the answers.
Text mode sends the same token ids with no plan (the baseline and the fallback).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

from inferscale_engine.checks import check_user_id
from inferscale_engine.config import ConnectorConfig, EngineConfig, plan_secret
from inferscale_engine.errors import EngineClosedError, FactNotFoundError, SlabFullError
from inferscale_engine.facts import Fact, FactId, MemoryHandle
from inferscale_engine.model.calibration import engine_key_scale, model_fingerprint
from inferscale_engine.model.check import check_model, connector_config, load_tokenizer
from inferscale_engine.prompting.contexts import Context
from inferscale_engine.prompting.layout import Layout
from inferscale_engine.prompting.prompt import MemoryPrompt, PromptBuilder
from inferscale_engine.prompting.tool_calls import ToolCall, parse_tool_calls
from inferscale_engine.protocol.plan import InjectionPlan
from inferscale_engine.runtime import read_path
from inferscale_engine.runtime.fact_table import FactTable
from inferscale_engine.runtime.generation import EngineStats, Generation, text_pieces
from inferscale_engine.runtime.pins import PinnedFacts
from inferscale_engine.runtime.read_path import Messages, as_messages, check_request
from inferscale_engine.runtime.residency import FactRecord
from inferscale_engine.runtime.runner import Runner, VllmRunner, WorkerClient
from inferscale_engine.runtime.shards import (
    Shard,
    build_shards,
    engine_stats,
    prepare_requests,
    rank_of,
)
from inferscale_engine.runtime.tier_manager import disk_fingerprint

__all__ = ["Engine", "EngineStats", "Generation", "Messages"]


class Engine:
    """A vLLM engine with InferScale's KV connector and fact index. Thread-safe."""

    def __init__(self, config: EngineConfig, *,
                 runner: Callable[[EngineConfig, ConnectorConfig], Runner] = VllmRunner
                 ) -> None:
        """Check the model, start vLLM with the connector, encode the configured preamble.

        Args:
            runner: builds what drives vLLM: VllmRunner (a co-located vllm.LLM, default) or,
                in `inferscale serve`, a factory of AsyncRunner over vLLM's AsyncLLM.
        """
        self.config = config
        self._lock = threading.RLock()
        self._closed = False
        hf_config, self.rope = check_model(config)
        self.tokenizer = load_tokenizer(config)
        self.prompts = PromptBuilder(self.tokenizer, config.system_prompt,
                                     config.user_block_header)
        self._secret = plan_secret()
        connector = connector_config(config, hf_config)
        self._num_layers = hf_config.num_hidden_layers
        self.fingerprint = model_fingerprint(hf_config, self.tokenizer, config.dtype)
        """Model identity a calibration is bound to."""
        key_scale = engine_key_scale(config, self.fingerprint, self._num_layers)
        disk = disk_fingerprint(config, self.fingerprint)  # checked before vLLM starts
        self._runner = runner(config, connector)
        self._table = FactTable(config, self.prompts, key_scale, self._num_layers)
        """The registered facts and the rules of getting in (fact_table.py)."""
        self._facts: dict[FactId, FactRecord] = self._table.records
        self.counters: Counter[str] = Counter()
        self._pins = PinnedFacts(config)
        """The users' pinned facts: first in their prompts, never evicted (pins.py)."""
        self._shards = build_shards(config, connector, self._runner, self.prompts, self._facts,
                                    self._secret, self.counters, disk, self._pins)
        """One per vLLM engine (shards.py); a user's facts live in rank_of(user)'s."""

    def _user(self, user_id: str) -> tuple[str, Shard]:
        """A verb's user id, checked (the engine's one check), and the shard that serves it."""
        user_id = check_user_id(user_id)
        return user_id, self._shard(user_id)

    def _shard(self, user_id: str | None) -> Shard:
        """The shard of a user's engine (the first for requests without a user)."""
        return self._shards[rank_of(user_id, len(self._shards)) if user_id else 0]

    def _shard_of(self, handle: object) -> Shard:  # resolve() refuses what is not a handle
        return self._shard(handle.user_id if isinstance(handle, MemoryHandle) else None)

    # The first shard's parts: the whole engine without data parallelism (tests use them).
    _planner = property(lambda self: self._shards[0].planner)
    _writer = property(lambda self: self._shards[0].writer)
    _preambles = property(lambda self: self._shards[0].preambles)

    # ---- write path --------------------------------------------------------------------
    def add_facts(self, user_id: str, texts: Sequence[str],
                  contexts: Sequence[Context] | None = None, *,
                  fact_ids: Sequence[FactId] | None = None, window: int | None = None,
                  encode: bool = True, key_scale: float | tuple[float, ...] | None = None
                  ) -> list[FactId]:
        """Register facts and encode their KV once (batched); returns their ids, in order.

        Args:
            contexts: per fact, what it is encoded after (Context-Window Encoding): the
                text that preceded it (its last `window` tokens are kept), a RunContext
                (facts added together; inferscale_engine.prompting.contexts), or None.
            fact_ids: ids to use (e.g. a durable store's); default: the engine numbers them.
            window: tokens of context to keep (default EngineConfig.context_window_tokens).
            encode: False registers the facts only; their KV is built on first use.
            key_scale: key temperature of these facts (default EngineConfig.key_scale).

        Raises:
            InvalidFactError: a text is empty, not a string, or too long. Nothing is stored.
            SlabFullError: the facts do not fit even after eviction. Nothing is stored.
        """
        user_id, _ = self._user(user_id)
        texts = self._table.check_texts(texts)
        token_ids = [self.tokenize_fact(t) for t in texts]
        with self._lock:
            ids = self._table.new_ids(fact_ids, len(texts))
            self.add_tokenized_facts([Fact(i, user_id, t, toks) for i, t, toks in
                                      zip(ids, texts, token_ids, strict=True)],
                                     contexts, window=window, encode=encode,
                                     key_scale=key_scale)
        return ids

    def add_tokenized_facts(self, facts: Sequence[Fact],
                            contexts: Sequence[Context] | None = None, *,
                            window: int | None = None, encode: bool = True,
                            key_scale: float | tuple[float, ...] | None = None) -> None:
        """Register facts whose ids and token ids are already known (a durable store's).

        The engine encodes exactly `fact.token_ids` (tokenize them with tokenize_fact). All
        facts must be one user's.

        Raises:
            InvalidFactError: ids already registered, mixed users, or contexts of another
                length. Nothing is stored.
            SlabFullError: the facts do not fit even after eviction. Nothing is stored.
        """
        records = self._table.build(facts, contexts, window, key_scale)
        with self._lock:
            self._check_open()
            self._table.admit(records)
            if encode and records:
                self._shard(records[0].fact.user_id).writer.make_resident(
                    records, self.prompts.preamble(), {r.fact.fact_id for r in records},
                    skip_on_disk=True)  # a disk entry is KV enough: loaded on first use
            for record in records:
                self._facts[record.fact.fact_id] = record

    def tokenize_fact(self, text: str, *, check_length: bool = True) -> tuple[int, ...]:
        """A fact's token ids as prompts hold them (InvalidFactError: blank, or too long)."""
        return self._table.tokenize(text, check_length)

    def split_text(self, text: str) -> list[str]:
        """`text` cut into pieces that each fit in one fact (max_fact_tokens), in order."""
        return self._table.split(text, self.tokenizer)

    def claim_fact_ids(self, owner: object) -> None:
        """Hand the numbering of facts to `owner` (a Memory: its store's ids) until released.

        An engine's fact ids have one author: while a Memory holds them, add_facts without
        fact_ids and a second Memory are refused (ConfigError here; fact_table.py).
        """
        with self._lock:
            self._table.claim(owner)

    def release_fact_ids(self, owner: object) -> None:
        """End `owner`'s claim (Memory.close); add_facts numbers facts again."""
        with self._lock:
            self._table.release(owner)

    # ---- read path ---------------------------------------------------------------------
    def generate(self, handle: MemoryHandle | None, messages: Messages | str,
                 sampling: Any = None, mode: str = "kv", *, layout: Layout | None = None,
                 tools: Sequence[Mapping[str, Any]] | None = None) -> Generation:
        """Answer `messages` with the handle's facts in the memory block.

        Args:
            handle: facts to use (None: no memory).
            messages: chat messages (role/content dicts) or one user question.
            sampling: vllm.SamplingParams (default: greedy, 64 tokens).
            mode: 'kv' injects the facts' stored KV; 'text' prefills them as text.
            layout: where facts go and which are repaired as text (default:
                EngineConfig.layout); text mode uses the same layout, all prefilled.
            tools: tool schemas (OpenAI function format), rendered by the model's own chat
                template.

        Raises:
            HandleError: the handle is not a MemoryHandle or references another user's facts.
            FactNotFoundError: a fact id is unknown.
            ConfigError: `layout` repairs more facts than the handle has (r > k).
        """
        return self.generate_many([(handle, messages)], sampling, mode, layout=layout,
                                  tools=tools)[0]

    def generate_many(self, requests: Sequence[tuple[MemoryHandle | None, Messages | str]],
                      sampling: Any = None, mode: str = "kv", *, layout: Layout | None = None,
                      tools: Sequence[Mapping[str, Any]] | None = None) -> list[Generation]:
        """generate() for many requests in one vLLM batch: prepare, run, collect."""
        with self._lock:  # held through the run: vllm.LLM is not thread-safe
            prepared, shards = self._prepare(requests, sampling, mode, layout, tools)
            return read_path.run_batch(self._runner, prepared, [s.rank for s in shards],
                                       self.counters)

    def stream(self, handle: MemoryHandle | None, messages: Messages | str,
               sampling: Any = None, mode: str = "kv", *, layout: Layout | None = None,
               tools: Sequence[Mapping[str, Any]] | None = None
               ) -> Generator[Generation, None, None]:
        """generate() streamed: the answer so far after each step; the last is finished."""
        with self._lock:
            (prepared,), (shard,) = self._prepare([(handle, messages)], sampling, mode, layout,
                                                  tools)
            yield from read_path.run_stream(self._runner, prepared, shard.rank, self.counters)

    def _prepare(self, requests: Sequence[tuple[MemoryHandle | None, Messages | str]],
                 sampling: Any, mode: str, layout: Layout | None,
                 tools: Sequence[Mapping[str, Any]] | None
                 ) -> tuple[list[Any], list[Shard]]:
        """Plans and prompts of a batch (under the lock), with the shard of each request."""
        sampling = check_request(mode, layout, sampling)
        self._check_open()
        shards = [self._shard_of(h) for h, _ in requests]
        return prepare_requests(shards, self._shards, requests, sampling, mode, layout,
                                self.config.layout, tools), shards

    def render_prompt(self, handle: MemoryHandle | None, messages: Messages | str, *,
                      layout: Layout | None = None,
                      tools: Sequence[Mapping[str, Any]] | None = None) -> MemoryPrompt:
        """The prompt generate() would send for this handle and layout (no plan, no KV)."""
        with self._lock:
            self._check_open()
            return self._shard_of(handle).render(handle, as_messages(messages),
                                                 layout or self.config.layout, tools)

    def prepare_request(self, handle: MemoryHandle, messages: Messages | str, *,
                        layout: Layout | None = None,
                        tools: Sequence[Mapping[str, Any]] | None = None
                        ) -> tuple[MemoryPrompt, InjectionPlan]:
        """The prompt and signed plan generate() would send in KV mode.

        For clients that talk to vLLM themselves: send prompt.token_ids() with
        cache_salt=plan.cache_salt and kv_transfer_params=plan.to_params().

        Raises:
            SlabFullError: the handle's facts do not fit in the slab.
        """
        with self._lock:
            self._check_open()
            return self._shard_of(handle).prepare(
                handle, layout, self.config.layout,
                lambda planner, injected, repaired, chosen: planner.build(
                    as_messages(messages), injected, repaired, chosen, tools))

    def parse_tool_calls(self, text: str, tools: Sequence[Mapping[str, Any]],
                         parser: str = "hermes") -> tuple[str, list[ToolCall]]:
        """The answer without its tool calls, and the calls, read by vLLM's tool parser.

        A bare JSON object naming an offered tool counts as a call too.
        """
        return parse_tool_calls(self.tokenizer, parser, text, tools)

    def prepare_completion(self, handle: MemoryHandle, prompt_token_ids: Sequence[int], *,
                           layout: Layout | None = None
                           ) -> tuple[MemoryPrompt, InjectionPlan]:
        """A raw completion prompt with the handle's facts in front of it, and its plan.

        [memory header][fact_1]..[fact_k][repaired facts][prompt]: there is no chat template,
        so the preamble is the configured system prompt's tokens alone.
        """
        preamble = self.prompts.encode(self.config.system_prompt)
        with self._lock:
            self._check_open()
            return self._shard_of(handle).prepare(
                handle, layout, self.config.layout,
                lambda _, injected, repaired, __: MemoryPrompt(
                    preamble, tuple(r.fact.token_ids for r in injected), tuple(prompt_token_ids),
                    tuple(r.fact.token_ids for r in repaired)))

    def text_pieces(self, generation: Generation) -> list[str]:
        """The answer as per-token text pieces whose concatenation is exactly its text."""
        return text_pieces(self.tokenizer, generation)

    # ---- management --------------------------------------------------------------------
    def get_facts(self, user_id: str) -> list[Fact]:
        """All facts of a user, oldest first."""
        user_id, _ = self._user(user_id)
        with self._lock:
            return [r.fact for r in self._facts.values() if r.fact.user_id == user_id]

    def is_resident(self, fact_id: FactId) -> bool:
        """True if the fact's KV is in the slab now."""
        with self._lock:
            if (record := self._facts.get(fact_id)) is None:
                raise FactNotFoundError(f"fact {fact_id} does not exist")
            return record.resident

    def tiers_of(self, fact_ids: Sequence[FactId]) -> dict[FactId, tuple[str, ...]]:
        """Where each fact's KV is now, of 'slab', 'host', 'disk' (ids unknown: left out)."""
        with self._lock:
            return {f: self._shard(r.fact.user_id).writer.tiers_of(r, self.prompts.preamble())
                    for f in fact_ids if (r := self._facts.get(f)) is not None}

    def pin(self, user_id: str, fact_ids: Sequence[FactId]) -> None:
        """Pin the user's facts: first in every prompt that names them, KV never evicted.

        Their KV is made resident now (if the slab cannot take it, on their next request).
        Pinning a pinned fact again changes nothing.

        Raises:
            FactNotFoundError / HandleError: an id is unknown or another user's.
            InvalidRequestError: over a cap (pins.py); nothing is pinned.
        """
        user_id, shard = self._user(user_id)
        with self._lock:
            self._check_open()
            records = [r for r in shard.planner.resolve(MemoryHandle(user_id, tuple(
                dict.fromkeys(fact_ids)))) if r.fact.fact_id not in self._pins]
            self._pins.check(user_id, shard.rank, [len(r.fact.token_ids) for r in records],
                             shard.residency.num_pages)
            self._pins.add(user_id, shard.rank,
                           [(r.fact.fact_id, len(r.fact.token_ids)) for r in records])
            try:
                shard.writer.make_resident(records, self.prompts.preamble(), set())
            except SlabFullError:
                self.counters["pinned_not_resident"] += len(records)

    def unpin(self, user_id: str, fact_ids: Sequence[FactId]) -> list[FactId]:
        """Unpin the user's facts (evictable again); returns those that were pinned.

        Raises:
            FactNotFoundError / HandleError: an id is unknown or another user's.
        """
        user_id, shard = self._user(user_id)
        with self._lock:
            self._check_open()
            shard.planner.resolve(MemoryHandle(user_id, tuple(fact_ids)))
            return self._pins.discard(user_id, shard.rank, fact_ids)

    def pinned_facts(self, user_id: str) -> list[FactId]:
        """The user's pinned facts, in the order they were added."""
        user_id, _ = self._user(user_id)
        with self._lock:
            return self._pins.of(user_id)

    def check_pins(self, user_id: str, token_counts: Sequence[int],
                   replacing: Sequence[FactId] = ()) -> None:
        """Refuse pinning more facts of these lengths for the user (before storing them).

        replacing: pinned facts these replace (an update's): their tokens are not counted.

        Raises:
            InvalidRequestError: the user's or the slab's cap would be passed (pins.py).
        """
        user_id, shard = self._user(user_id)
        with self._lock:
            self._pins.check(user_id, shard.rank, token_counts, shard.residency.num_pages,
                             replacing)

    def delete(self, user_id: str, fact_ids: Sequence[FactId], keep_disk: bool = False) -> None:
        """Delete facts, their KV in every tier (keep_disk: not their disk entries).

        Raises:
            FactNotFoundError / HandleError: an id is unknown or another user's; nothing is
                deleted.
        """
        user_id, shard = self._user(user_id)
        with self._lock:
            self._check_open()
            records = shard.planner.resolve(MemoryHandle(user_id, tuple(fact_ids)))
            self._pins.discard(user_id, shard.rank, [r.fact.fact_id for r in records])
            shard.writer.forget(records, self.prompts.preamble(), keep_disk)
            for record in records:
                del self._facts[record.fact.fact_id]

    def stats(self) -> EngineStats:
        """App-side and per-worker counters."""
        with self._lock:
            self._check_open()
            return engine_stats(self._shards, len(self._facts), self.counters)

    @property
    def workers(self) -> WorkerClient:
        """Typed control calls on every vLLM worker of every engine, in that order."""
        return self._runner.workers

    def rank_of(self, user_id: str) -> int:
        """The data-parallel engine that serves a user (0 without data parallelism)."""
        return self._user(user_id)[1].rank

    @property
    def llm(self) -> Any:
        """The underlying vllm.LLM (for advanced use and tests)."""
        return self._runner.llm

    def close(self) -> None:
        """Shut the vLLM engine down and free its memory; the object is unusable afterwards."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._runner.close()

    @property
    def closed(self) -> bool:
        """True once close() was called."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the engine was closed; build a new Engine")

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

