"""The write path: encode facts once and keep their KV in the slab.

A fact is encoded by a vLLM "save" request, prompt [preamble][context tokens][fact],
max_tokens=1, salted per user (plan.save_salt: its blocks never serve another user's
prompt); its signed SavePlan names the slab pages to fill, and the worker-side connector
copies only the fact's K/V there (Context-Window Encoding). Facts whose contexts chain (each
fact's context is the previous fact's context followed by the previous fact, as a run of
facts added together has) share ONE save request: the last fact's prompt holds every earlier
fact's prompt as a prefix, and causal attention makes each fact's K/V there the same as in its
own request. Pages are allocated here, least recently used facts evicted when the slab is
full; a batch is all or nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from inferscale_engine.config import EngineConfig
from inferscale_engine.facts import FactId
from inferscale_engine.protocol.plan import save_salt
from inferscale_engine.protocol.save_plan import SavePlan, SaveSpan
from inferscale_engine.runtime.generation import RESULT_KEY
from inferscale_engine.runtime.residency import FactRecord, Residency
from inferscale_engine.runtime.runner import Runner


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
            prompts, plans = [], []
            for run in _runs(allocated):
                last = run[-1][0]
                prompt = [*preamble, *last.context_ids, *last.fact.token_ids]
                spans = tuple(SaveSpan(key, len(preamble) + len(r.context_ids),
                                       len(r.fact.token_ids), pages) for r, key, pages in run)
                plans.append(SavePlan(last.fact.user_id, spans, key_scale=last.key_scale
                                      ).signed(self._secret, prompt))
                prompts.append(prompt)
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
        plan = SavePlan.one(owner, key, 0, len(preamble), pages).signed(self._secret, preamble)
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


_Allocated = tuple[FactRecord, int, tuple[int, ...]]


def _runs(allocated: list[_Allocated]) -> list[list[_Allocated]]:
    """Consecutive records split into runs whose contexts chain (see the module docstring).

    A record joins the run before it when its context is exactly that run's last context
    followed by that run's last fact, with the same key scale: then the run's last prompt
    contains every earlier prompt of the run as a prefix.
    """
    runs: list[list[_Allocated]] = []
    for item in allocated:
        record = item[0]
        if runs:
            prev = runs[-1][-1][0]
            n = len(prev.context_ids)
            if (record.key_scale == prev.key_scale
                    and len(record.context_ids) == n + len(prev.fact.token_ids)
                    and record.context_ids[:n] == prev.context_ids
                    and record.context_ids[n:] == prev.fact.token_ids):
                runs[-1].append(item)
                continue
        runs.append([item])
    return runs
