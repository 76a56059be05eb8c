"""The write path: encode facts once and keep their KV in the slab.

A fact is encoded by a vLLM "save" request, prompt [preamble][<= W context tokens][fact],
max_tokens=1; its signed SavePlan names the slab pages to fill, and the worker-side connector
copies only the fact's K/V there (Context-Window Encoding). Pages are allocated here, least
recently used facts evicted when the slab is full; a batch is all or nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from inferscale_engine.config import EngineConfig
from inferscale_engine.facts import FactId
from inferscale_engine.generation import RESULT_KEY
from inferscale_engine.plan import SavePlan
from inferscale_engine.residency import FactRecord, Residency
from inferscale_engine.runner import Runner


class FactWriter:
    """Allocates slab pages and runs the save requests that fill them."""

    def __init__(self, config: EngineConfig, runner: Runner, residency: Residency,
                 secret: bytes, counters: Counter[str]) -> None:
        self._config = config
        self._runner = runner
        self._residency = residency
        self._secret = secret
        self._counters = counters

    def make_resident(self, records: Sequence[FactRecord], preamble: Sequence[int],
                      pinned: set[FactId]) -> None:
        """Give non-resident records slab pages (evicting LRU facts if allowed), encode them.

        All or nothing: on failure no record becomes resident and no page stays allocated.

        Args:
            records: facts to encode, each after `preamble` and its own context ids.
            pinned: facts that must not be evicted to make room (the batch being served).

        Raises:
            SlabFullError: they do not fit even after eviction.
        """
        todo = [r for r in records if not r.resident]
        if not todo:
            return
        evict = self._config.on_slab_full == "evict"
        allocated: list[tuple[FactRecord, int, tuple[int, ...]]] = []
        try:
            for record in todo:
                pages, evicted = self._residency.allocate(len(record.fact.token_ids), pinned,
                                                          evict)
                self.free_records(evicted)
                allocated.append((record, self._residency.next_slab_key(), pages))
            prompts = [[*preamble, *r.context_ids, *r.fact.token_ids] for r, _, _ in allocated]
            plans = [SavePlan(r.fact.user_id, key, len(preamble) + len(r.context_ids),
                              len(r.fact.token_ids), pages,
                              key_scale=r.key_scale).signed(self._secret, prompt)
                     for (r, key, pages), prompt in zip(allocated, prompts, strict=True)]
            self.run_saves(plans, prompts)
        except BaseException:
            for _, _, pages in allocated:
                self._residency.free_pages(pages)
            self._runner.workers.free([key for _, key, _ in allocated])
            raise
        for record, key, pages in allocated:
            self._residency.admit(record, key, pages)

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
        plan = SavePlan(owner, key, 0, len(preamble), pages).signed(self._secret, preamble)
        try:
            self.run_saves([plan], [list(preamble)])
        except BaseException:
            self._residency.free_pages(pages)
            raise
        return key, pages

    def free_records(self, records: Iterable[FactRecord]) -> None:
        """Forget where these records' KV is and free their worker entries (evictions)."""
        records = list(records)
        keys = [r.slab_key for r in records if r.slab_key is not None]
        for record in records:
            self._residency.release(record)
        if keys:
            self._runner.workers.free(keys)
            self._counters["evicted_facts"] += len(keys)

    def run_saves(self, plans: list[SavePlan], prompts: list[list[int]]) -> None:
        """Run save requests in batches and check that every worker captured every fact.

        Raises:
            RuntimeError: the connector refused a plan or a worker did not capture a fact.
        """
        from vllm import SamplingParams, TokensPrompt

        batch = self._config.save_batch_size
        for lo in range(0, len(plans), batch):
            chunk = slice(lo, lo + batch)
            params = [SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": p.to_params()})
                      for p in plans[chunk]]
            outputs = self._runner.run([TokensPrompt(prompt_token_ids=p) for p in prompts[chunk]],
                                       params, use_tqdm=len(plans) > batch)
            for out in outputs:
                result = (out.kv_transfer_params or {}).get(RESULT_KEY, {})
                if result.get("status") != "save":
                    raise RuntimeError(f"fact encoding was refused by the connector: {result}")
        keys = [p.slab_key for p in plans]
        for rank, resident in enumerate(self._runner.workers.resident(keys)):
            if not all(resident):
                raise RuntimeError(f"worker {rank} did not capture {resident.count(False)} facts")
        self._counters["encoded_facts"] += len(plans)
