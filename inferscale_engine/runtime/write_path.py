"""The write path: fill slab pages with facts' KV, from the lower tiers or by encoding them.

A fact is encoded by a vLLM "save" request, prompt [preamble][context tokens][fact],
max_tokens=1, salted per user (plan.save_salt: its blocks never serve another user's
prompt); its signed SavePlan names the slab pages to fill, and the worker-side connector
copies only the fact's K/V there (Context-Window Encoding). Facts whose contexts chain (each
fact's context is the previous fact's context followed by the previous fact, as a run of
facts added together has) share ONE save request: the last fact's prompt holds every earlier
fact's prompt as a prefix, and causal attention makes each fact's K/V there the same as in its
own request. With a disk tier every encoded fact is also written to disk.

A fact whose KV left the slab comes back by a copy when it can: from host RAM if it was
demoted there (the host copy stays: the host tier is inclusive), else from its disk entry; only
then is it encoded again (tier_manager.py). Pages are
allocated here, least recently used facts evicted (demoted) when the slab is full; a batch is
all or nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from inferscale_engine.config import EngineConfig
from inferscale_engine.facts import FactId
from inferscale_engine.protocol.plan import save_salt
from inferscale_engine.protocol.save_plan import SavePlan, SaveSpan
from inferscale_engine.protocol.tier_control import DiskRead, DiskWrite, Move, disk_entry_path
from inferscale_engine.runtime.generation import RESULT_KEY
from inferscale_engine.runtime.residency import FactRecord, Residency
from inferscale_engine.runtime.runner import Runner
from inferscale_engine.runtime.tier_manager import HostResidency, disk_identity


@dataclass(slots=True)
class _Fill:
    """A record on its way into the slab: its pages and the slab key that will name them."""

    record: FactRecord
    key: int
    pages: tuple[int, ...]


class FactWriter:
    """Allocates slab pages and fills them: from host RAM, from disk, else by save requests."""

    def __init__(self, config: EngineConfig, runner: Runner, residency: Residency,
                 secret: bytes, counters: Counter[str], host: HostResidency | None = None,
                 disk_fingerprint: str | None = None) -> None:
        """Keep what the write path needs.

        Args:
            host: the host tier's pages (None: no host tier).
            disk_fingerprint: the model's identity for disk entries (None: no disk tier).
        """
        self._config = config
        self._runner = runner
        self._residency = residency
        self._secret = secret
        self._counters = counters
        self._host = host or HostResidency(0, config.slab_page_tokens)
        self._fingerprint = disk_fingerprint

    def make_resident(self, records: Sequence[FactRecord], preamble: Sequence[int],
                      pinned: set[FactId], skip_on_disk: bool = False) -> None:
        """Give non-resident records slab pages (evicting LRU facts if allowed) and fill them.

        Each record comes back from host RAM if it waits there, else from its disk entry,
        else it is encoded (and written to disk). All or nothing: on failure no record becomes
        resident and no page stays allocated.

        Args:
            records: facts to make resident, each encoded after `preamble` and its context.
            pinned: facts that must not be evicted to make room (the batch being served).
            skip_on_disk: leave out records whose disk entries exist (registering stored facts
                at start-up: their KV is loaded on first use, nothing is encoded now).

        Raises:
            SlabFullError: they do not fit even after eviction.
        """
        todo = [r for r in records if not r.resident
                and not (skip_on_disk and self._on_disk(r, preamble))]
        if not todo:
            return
        evict = self._config.on_slab_full == "evict"
        fills: list[_Fill] = []
        try:
            evicted: list[FactRecord] = []
            for record in todo:
                pages, out = self._residency.allocate(len(record.fact.token_ids), pinned, evict)
                evicted += out
                fills.append(_Fill(record, self._residency.next_slab_key(), pages))
            self.free_records(evicted)  # moved out before anything is written to their pages
            empty = self._load(self._promote(fills), preamble)
            if empty:
                self._encode(empty, preamble)
        except BaseException:
            for fill in fills:
                self._residency.free_pages(fill.pages)
            self._runner.workers.free([fill.key for fill in fills])
            raise
        for fill in fills:
            self._residency.admit(fill.record, fill.key, fill.pages)

    def save_preamble(self, owner: str, preamble: Sequence[int], pinned: set[FactId]
                      ) -> tuple[int, tuple[int, ...]]:
        """Encode a shared preamble into new pages; returns its slab key and pages.

        Raises:
            SlabFullError: it does not fit even after eviction.
        """
        pages, evicted = self._residency.allocate(len(preamble), pinned,
                                                  self._config.on_slab_full == "evict")
        self.free_records(evicted)
        key = self._residency.next_slab_key()
        plan = SavePlan.one(owner, key, 0, len(preamble), pages).signed(self._secret, preamble)
        try:
            self.run_saves([plan], [list(preamble)])
        except BaseException:
            self._residency.free_pages(pages)
            raise
        return key, pages

    def free_records(self, records: Iterable[FactRecord]) -> None:
        """Move records evicted from the slab out of it.

        Their KV is demoted to host RAM where it fits (no copy for a record whose host copy
        remains from its promotion), else dropped (a disk entry stays); their slab pages are
        forgotten.
        """
        records = [r for r in records if r.slab_key is not None]
        if not records:
            return
        keys = [r.slab_key for r in records if r.slab_key is not None]
        moves, dropped = self._host.demote(records, iter(self._residency.next_slab_key, None))
        workers = self._runner.workers
        if dropped:
            workers.forget(dropped, [])
        done = _everywhere(workers.demote(moves), len(moves))
        demoted = {r.host_key: r for r in records if r.host_key is not None}
        for move, ok in zip(moves, done, strict=True):
            if not ok:  # some rank lacked the entry: drop what the others moved
                self._host.release(demoted[move.dest_key])
                workers.forget([move.dest_key], [])
        for record in records:
            self._residency.release(record)
        workers.free(keys)
        self._counters["evicted_facts"] += len(keys)
        self._counters["demoted_facts"] += sum(done)

    def forget(self, records: Sequence[FactRecord], preamble: Sequence[int],
               keep_disk: bool = False) -> None:
        """Deleted facts: free their slab entries, drop their host copies and disk files."""
        workers = self._runner.workers
        workers.free([r.slab_key for r in records if r.slab_key is not None])
        host_keys = [r.host_key for r in records if r.host_key is not None]
        names = ([disk_identity(r, preamble, self._fingerprint)[0] for r in records]
                 if self._fingerprint is not None and not keep_disk else [])
        for record in records:
            self._residency.release(record)
            self._host.release(record)
        workers.forget(host_keys, names)

    def tiers_of(self, record: FactRecord, preamble: Sequence[int]) -> tuple[str, ...]:
        """Where the record's KV is now, of 'slab', 'host' and 'disk' (() = in none)."""
        return tuple(name for name, here in (
            ("slab", record.slab_key is not None), ("host", record.host_key is not None),
            ("disk", self._on_disk(record, preamble))) if here)

    def run_saves(self, plans: list[SavePlan], prompts: list[list[int]]) -> None:
        """Run save requests in batches and check that every worker captured every fact.

        Raises:
            RuntimeError: the connector refused a plan or a worker did not capture a fact.
        """
        from vllm import SamplingParams, TokensPrompt

        batch = self._config.save_batch_size  # requests (each one fact or a run of facts)
        for lo in range(0, len(plans), batch):
            chunk = slice(lo, lo + batch)
            params = [SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": p.to_params()})
                      for p in plans[chunk]]
            salted = [TokensPrompt(prompt_token_ids=prompt,
                                   cache_salt=save_salt(self._secret, plan.user_id))
                      for plan, prompt in zip(plans[chunk], prompts[chunk], strict=True)]
            outputs = self._runner.run(salted, params, use_tqdm=len(plans) > batch)
            for out in outputs:
                result = (out.kv_transfer_params or {}).get(RESULT_KEY, {})
                if result.get("status") != "save":
                    raise RuntimeError(f"fact encoding was refused by the connector: {result}")
        keys = [span.slab_key for p in plans for span in p.spans]
        for rank, resident in enumerate(self._runner.workers.resident(keys)):
            if not all(resident):
                raise RuntimeError(f"worker {rank} did not capture {resident.count(False)} facts")
        self._counters["encoded_facts"] += len(keys)
        self._counters["save_requests"] += len(plans)

    # ---- filling pages ----------------------------------------------------------------
    def _on_disk(self, record: FactRecord, preamble: Sequence[int]) -> bool:
        """True if every tensor-parallel rank has the record's disk entry (loads check it)."""
        if self._fingerprint is None or self._config.disk_tier_path is None:
            return False
        name, _ = disk_identity(record, preamble, self._fingerprint)
        folder = Path(self._config.disk_tier_path).expanduser()
        return all(disk_entry_path(folder, name, rank).exists()
                   for rank in range(self._config.tensor_parallel_size))

    def _promote(self, fills: list[_Fill]) -> list[_Fill]:
        """Bring records waiting in host RAM back into their pages; returns the rest.

        A promotion that failed on some rank is undone everywhere, and its fill gets a fresh
        slab key (the pages' claim under the old one is spent).
        """
        waiting = [f for f in fills if f.record.host_key is not None]
        if not waiting:
            return fills
        moves = [Move(f.record.host_key or 0, f.key, tuple(f.pages)) for f in waiting]
        workers = self._runner.workers
        done = _everywhere(workers.promote(moves), len(moves))
        promoted = set()
        for fill, move, ok in zip(waiting, moves, done, strict=True):
            if ok:  # the host copy stays: evicting the fact again costs no copy
                self._host.touch(fill.record)
                self._counters["host_hits"] += 1
                promoted.add(id(fill))
                continue
            self._host.release(fill.record)
            workers.free([fill.key])
            workers.forget([move.source_key], [])
            fill.key = self._residency.next_slab_key()
        return [f for f in fills if id(f) not in promoted]

    def _load(self, fills: list[_Fill], preamble: Sequence[int]) -> list[_Fill]:
        """Load records from the disk tier into their pages; returns those still empty.

        A refused entry (missing, corrupt, of another model, preamble, context or key scale)
        is never served: its record is encoded again, under a fresh slab key (counted).
        """
        if not fills or self._fingerprint is None:
            return fills
        items: list[DiskRead] = []
        for fill in fills:
            name, meta = disk_identity(fill.record, preamble, self._fingerprint)
            items.append(DiskRead(name, fill.record.fact.user_id, meta, fill.key,
                                  tuple(fill.pages)))
        workers = self._runner.workers
        results = workers.load(items)
        empty = []
        for i, fill in enumerate(fills):
            reasons = {per_worker[i] for per_worker in results}
            if reasons == {""}:
                self._counters["disk_hits"] += 1
                continue
            self._counters["disk_misses"] += 1
            self._counters["disk_refused"] += bool(reasons - {"", "missing"})
            workers.free([fill.key])
            fill.key = self._residency.next_slab_key()
            empty.append(fill)
        return empty

    def _encode(self, fills: list[_Fill], preamble: Sequence[int]) -> None:
        """Save requests for the fills (runs of chained facts share one); then disk entries."""
        prompts, plans = [], []
        for run in _runs(fills):
            last = run[-1].record
            prompt = [*preamble, *last.context_ids, *last.fact.token_ids]
            spans = tuple(SaveSpan(f.key, len(preamble) + len(f.record.context_ids),
                                   len(f.record.fact.token_ids), f.pages) for f in run)
            plans.append(SavePlan(last.fact.user_id, spans, key_scale=last.key_scale
                                  ).signed(self._secret, prompt))
            prompts.append(prompt)
        self.run_saves(plans, prompts)
        if self._fingerprint is not None:
            items: list[DiskWrite] = []
            for fill in fills:
                name, meta = disk_identity(fill.record, preamble, self._fingerprint)
                items.append(DiskWrite(fill.key, name, fill.record.fact.user_id, meta))
            self._runner.workers.persist(items)


def _everywhere(per_worker: list[list[bool]], num_items: int) -> list[bool]:
    """Per item, True if every worker (tensor-parallel rank) did it."""
    if not per_worker:
        return [False] * num_items
    return [all(done[i] for done in per_worker) for i in range(num_items)]


def _runs(fills: list[_Fill]) -> list[list[_Fill]]:
    """Consecutive records split into runs whose contexts chain (see the module docstring).

    A record joins the run before it when its context is exactly that run's last context
    followed by that run's last fact, with the same key scale: then the run's last prompt
    contains every earlier prompt of the run as a prefix.
    """
    runs: list[list[_Fill]] = []
    for fill in fills:
        record = fill.record
        if runs:
            prev = runs[-1][-1].record
            n = len(prev.context_ids)
            if (record.key_scale == prev.key_scale
                    and len(record.context_ids) == n + len(prev.fact.token_ids)
                    and record.context_ids[:n] == prev.context_ids
                    and record.context_ids[n:] == prev.fact.token_ids):
                runs[-1].append(fill)
                continue
        runs.append([fill])
    return runs
