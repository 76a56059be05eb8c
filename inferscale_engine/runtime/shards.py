"""Data parallelism: one shard of the engine per vLLM engine, each user pinned to one of them.

With EngineConfig.data_parallel_size = N, vLLM runs N engines (its own data parallelism, behind
one AsyncLLM), each with its own paged KV cache, scheduler-side connector and workers, so each
has its own slab. A user is pinned to engine rank_of(user_id, N) (a stable hash of the id): the
user's save requests and reads go there (vLLM's data_parallel_rank), its facts' KV lives only in
that engine's slab, and management calls reach only that engine's workers. A Shard is the
app-side state of one engine: slab pages and LRU (Residency), the preambles in its slab, the
save requests (FactWriter) and prompts and plans (RequestPlanner). With N = 1 there is one shard
and nothing is routed.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferscale_engine.config import ConnectorConfig, EngineConfig
from inferscale_engine.errors import SlabFullError
from inferscale_engine.facts import FactId, MemoryHandle
from inferscale_engine.prompting.layout import Layout
from inferscale_engine.prompting.prompt import MemoryPrompt, PromptBuilder
from inferscale_engine.protocol.handoff import PlanHandoff
from inferscale_engine.protocol.plan import InjectionPlan
from inferscale_engine.runtime.generation import EngineStats
from inferscale_engine.runtime.preambles import PreambleCache
from inferscale_engine.runtime.read_path import (
    Messages,
    PreparedRequest,
    RequestPlanner,
    as_messages,
    prepare_batch,
)
from inferscale_engine.runtime.residency import FactRecord, Residency, SlabAllocator
from inferscale_engine.runtime.runner import Runner, WorkerClient
from inferscale_engine.runtime.tier_manager import HostResidency
from inferscale_engine.runtime.write_path import FactWriter


def rank_of(user_id: str, num_ranks: int) -> int:
    """The engine a user is pinned to: stable across processes and restarts (not hash())."""
    if num_ranks == 1:
        return 0
    digest = hashlib.sha256(user_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "little") % num_ranks


class RankRunner:
    """The runner as one data-parallel rank sees it: every request pinned to that engine."""

    def __init__(self, runner: Runner, rank: int) -> None:
        self._runner = runner
        self.rank = rank
        self.llm = runner.llm
        self.in_process = False  # each data-parallel engine has a process of its own
        self.workers = runner.workers_for(rank)
        """Control calls on this engine's workers only."""

    def run(self, prompts: list[Any], params: list[Any], use_tqdm: bool = False,
            ranks: Sequence[int] | None = None) -> list[Any]:
        """Run on this rank (a rank other than its own is a bug)."""
        if ranks is not None and any(r != self.rank for r in ranks):
            raise ValueError(f"rank {self.rank}'s runner was asked to run on ranks {set(ranks)}")
        return self._runner.run(prompts, params, use_tqdm, ranks=[self.rank] * len(prompts))

    def stream(self, prompt: Any, params: Any, rank: int = 0) -> Iterator[Any]:
        """Stream on this rank (`rank` is this runner's own)."""
        if rank != self.rank:
            raise ValueError(f"rank {self.rank}'s runner was asked to stream on rank {rank}")
        return self._runner.stream(prompt, params, self.rank)

    def workers_for(self, rank: int) -> WorkerClient:
        if rank != self.rank:
            raise ValueError(f"rank {self.rank}'s runner has no workers of rank {rank}")
        return self.workers

    def close(self) -> None:
        """The engine closes the runner it shares."""


@dataclass(slots=True)
class Shard:
    """App-side state of one vLLM engine (see the module docstring)."""

    rank: int
    residency: Residency
    host: HostResidency
    writer: FactWriter
    preambles: PreambleCache
    planner: RequestPlanner
    workers: WorkerClient

    def render(self, handle: MemoryHandle | None, messages: Messages, layout: Layout,
               tools: Sequence[Mapping[str, Any]] | None) -> MemoryPrompt:
        """The prompt of a handle's facts and a chat, as a kv request would send it."""
        injected, repaired = self.planner.arrange(handle, self.planner.resolve(handle), layout)
        return self.planner.build(messages, injected, repaired, layout, tools)

    def prepare(self, handle: MemoryHandle, layout: Layout | None, default_layout: Layout,
                build: Callable[[RequestPlanner, list[FactRecord], list[FactRecord], Layout],
                                MemoryPrompt]) -> tuple[MemoryPrompt, InjectionPlan]:
        """A prompt `build` makes around the handle's facts, and its signed plan.

        The facts to inject are made resident first (SlabFullError if they do not fit);
        `build(planner, injected, repaired, layout)` makes the prompt.
        """
        records = self.planner.resolve(handle)
        if layout is not None:
            layout.check_handle_size(len(records))
        chosen = layout or default_layout
        injected, repaired = self.planner.arrange(handle, records, chosen)
        pinned = {r.fact.fact_id for r in records}
        if not self.planner.ready_for_kv(injected, pinned):
            raise SlabFullError("the handle's facts do not fit in the slab")
        prompt = build(self.planner, injected, repaired, chosen)
        try:
            return prompt, self.planner.plan(handle, prompt, injected, pinned)
        finally:
            self.preambles.end_batch()


def engine_stats(shards: Sequence[Shard], num_facts: int, counters: Counter[str]
                 ) -> EngineStats:
    """The Engine's stats: its facts, every shard's slab and host tier, every worker's counters."""
    return EngineStats(
        num_facts, sum(s.residency.num_resident for s in shards),
        sum(s.residency.num_free_pages for s in shards),
        [w for s in shards for w in s.workers.stats()], dict(counters), len(shards),
        sum(s.host.num_resident for s in shards))


def build_shards(config: EngineConfig, connector: ConnectorConfig, runner: Runner,
                 prompts: PromptBuilder, facts: dict[FactId, FactRecord], secret: bytes,
                 counters: Counter[str], disk_fingerprint: str | None = None,
                 pinned: Container[FactId] = frozenset()) -> list[Shard]:
    """One shard per engine, the configured preamble encoded into each engine's slab.

    Slab keys are drawn from one counter, so a key names one entry in the whole deployment.
    disk_fingerprint: the model's identity for disk-tier entries (None: no disk tier).
    pinned: the users' pinned facts, never evicted from any tier (pins.py).
    """
    keys = itertools.count(1)
    shards = []
    # Plans go to an in-process scheduler by reference (handoff.py), otherwise signed (data
    # parallelism runs on AsyncLLM, whose engines are never in this process).
    local = config.plan_handoff and getattr(runner, "in_process", False)
    for rank in range(config.data_parallel_size):
        view: Runner = RankRunner(runner, rank) if config.data_parallel_size > 1 else runner
        residency = Residency(SlabAllocator(connector.slab_pages, config.slab_page_tokens),
                              keys, pinned)
        host = HostResidency(connector.host_pages, config.slab_page_tokens, pinned)
        writer = FactWriter(config, view, residency, secret, counters, host, disk_fingerprint)
        preambles = PreambleCache(writer, residency, view.workers, counters, prompts.preamble())
        planner = RequestPlanner(config, prompts, facts, residency, writer, preambles, secret,
                                 counters, PlanHandoff(secret) if local else None)
        shards.append(Shard(rank, residency, host, writer, preambles, planner, view.workers))
    for shard in shards:  # fail now, not on the first request
        shard.preambles.key(prompts.preamble())
        shard.preambles.end_batch()
    return shards


def prepare_requests(shards: Sequence[Shard], all_shards: Sequence[Shard],
                     requests: Sequence[tuple[MemoryHandle | None, Messages | str]],
                     sampling: Any, mode: str, layout: Layout | None, default_layout: Layout,
                     tools: Sequence[Mapping[str, Any]] | None) -> list[PreparedRequest]:
    """Plans and prompts of a batch, each request through its shard (`shards`, in order)."""
    try:
        resolved = [(shard.planner.resolve(h), as_messages(m))
                    for shard, (h, m) in zip(shards, requests, strict=True)]
        if layout is not None:  # an explicit r must fit every handle
            for records, _ in resolved:
                layout.check_handle_size(len(records))
        pinned = {r.fact.fact_id for records, _ in resolved for r in records}
        return prepare_batch([s.planner for s in shards], [
            (handle, records, messages) for (handle, _), (records, messages) in zip(
                requests, resolved, strict=True)], sampling, mode, pinned,
            layout or default_layout, tools)
    finally:
        for shard in all_shards:
            shard.preambles.end_batch()
