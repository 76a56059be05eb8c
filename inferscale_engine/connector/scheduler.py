"""Scheduler-side half of the connector: checks plans against prompts and claims tokens.

Runs in vLLM's scheduler (EngineCore) process. It never trusts a plan: the plan must parse,
carry a valid MAC, match the prompt's token ids exactly and ride on a prompt salted with the
plan's cache_salt; otherwise it claims 0 tokens and vLLM prefills normally (counted, reported
back in the request's output kv_transfer_params). It also tracks the block table of save
requests until the fact span is computed, then asks the workers to capture it.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inferscale_engine.config import ConnectorConfig
from inferscale_engine.connector.metadata import CaptureSpec, InferScaleMetadata, LoadSpec
from inferscale_engine.errors import PlanError
from inferscale_engine.protocol.handoff import LOCAL_KIND, engine_tag, take
from inferscale_engine.protocol.plan import (
    PARAMS_KEY,
    InjectionPlan,
    Plan,
    SavePlan,
    from_params,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request


COMPUTE_BELOW_TOKENS = 16
"""A preamble-only plan with fewer uncached tokens than this is not loaded: vLLM computes them."""


@dataclass(slots=True)
class _Checked:
    """A request's plan after checking, and what to report when it finishes."""

    plan: Plan | None
    status: str
    """none | inject | save | rejected | mismatch"""
    reason: str = ""
    claimed: int = 0


@dataclass(slots=True)
class _SaveState:
    plan: SavePlan
    block_ids: list[int]
    captured: bool = False


class InferScaleScheduler:
    """Implements the scheduler-side hooks of InferScaleConnector."""

    def __init__(self, vllm_config: VllmConfig, config: ConnectorConfig) -> None:
        self._secret = config.secret
        self._tag = engine_tag(config.secret)
        self._checked: dict[str, _Checked] = {}
        self._pending_loads: dict[str, tuple[InjectionPlan, int]] = {}
        self._saves: dict[str, _SaveState] = {}
        self.counters: Counter[str] = Counter()
        self._unreported: Counter[str] = Counter()
        """Refused plans not yet sent to the workers (the step metadata carries them)."""

    # ---- hooks -------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int
                                   ) -> tuple[int, bool]:
        """Tokens of the plan not yet computed locally (side-effect free apart from a cache)."""
        checked = self._check(request)
        if checked.status != "inject":
            return 0, False
        assert isinstance(checked.plan, InjectionPlan)
        remaining = checked.plan.num_tokens - num_computed_tokens
        if remaining < COMPUTE_BELOW_TOKENS and len(checked.plan.lengths) == 1:
            # Only the preamble (no facts), cached but for its last few tokens: vLLM computes
            # them with the question (the same KV: the preamble's is a plain prefill's) instead
            # of a load whose fixed cost (indices, upload, launch) is worth more.
            return 0, False
        return max(0, remaining), False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        """Remember what the next step must load or capture for this request."""
        checked = self._check(request)
        rid = request.request_id
        if checked.status == "save" and rid not in self._saves:
            assert isinstance(checked.plan, SavePlan)
            self._saves[rid] = _SaveState(checked.plan, [])
        if num_external_tokens > 0 and checked.status == "inject":
            assert isinstance(checked.plan, InjectionPlan)
            self._pending_loads[rid] = (checked.plan, num_external_tokens)
            checked.claimed = max(checked.claimed, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> InferScaleMetadata:
        """Loads and captures for this step (cheap when nothing is pending)."""
        meta = InferScaleMetadata(num_rejected=self._unreported["rejected"],
                                  num_mismatched=self._unreported["mismatch"])
        self._unreported.clear()
        if not self._pending_loads and not self._saves:
            return meta
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            self._on_scheduled(meta, new.req_id, new.block_ids[0], True,
                               new.num_computed_tokens, scheduled.get(new.req_id, 0))
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            if rid not in self._pending_loads and rid not in self._saves:
                continue
            new_ids = cached.new_block_ids[i]
            resumed = rid in cached.resumed_req_ids
            self.counters["resumed"] += resumed
            self._on_scheduled(meta, rid, new_ids[0] if new_ids else [], resumed,
                               cached.num_computed_tokens[i], scheduled.get(rid, 0))
        if self._pending_loads:  # admitted but not scheduled: cannot happen in vLLM 0.26/0.32
            self.counters["orphan_loads"] += len(self._pending_loads)
            self._pending_loads.clear()
        return meta

    def request_finished(self, request: Request) -> dict[str, Any] | None:
        """Forget the request; report what happened to its plan in the output params."""
        rid = request.request_id
        self._pending_loads.pop(rid, None)
        self._saves.pop(rid, None)
        checked = self._checked.pop(rid, None)
        if checked is None or checked.status == "none":
            return None
        return {PARAMS_KEY + "_result": {"status": checked.status, "claimed": checked.claimed,
                                         "reason": checked.reason}}

    def num_tracked_requests(self) -> int:
        """Requests with state in this object (0 when idle: nothing leaks)."""
        return len(self._checked) + len(self._pending_loads) + len(self._saves)

    # ---- helpers -----------------------------------------------------------------------
    def _on_scheduled(self, meta: InferScaleMetadata, rid: str, block_ids: list[int],
                      replaces_blocks: bool, num_computed: int, num_scheduled: int) -> None:
        pending = self._pending_loads.pop(rid, None)
        if pending is not None:
            plan, num_external = pending
            # array('q') over the plan's tuples and vLLM's list: a third of numpy's cost each.
            meta.loads.append(LoadSpec(
                req_id=rid, user_id=plan.user_id, slab_keys=array("q", plan.slab_keys),
                lengths=array("q", plan.lengths), load_start=num_computed - num_external,
                load_end=num_computed, block_ids=array("q", block_ids),
            ))
            self.counters["loads"] += 1
            self.counters["loaded_tokens"] += num_external
        save = self._saves.get(rid)
        if save is None:
            return
        save.block_ids = list(block_ids) if replaces_blocks else save.block_ids + block_ids
        if not save.captured and num_computed + num_scheduled >= save.plan.end:
            # Every span is captured in the step that computes the prompt's last token: the
            # whole prompt's blocks are allocated then (chunked prefill included).
            save.captured = True
            saved = save.plan
            for span in saved.spans:
                meta.captures.append(CaptureSpec(
                    req_id=rid, user_id=saved.user_id, slab_key=span.slab_key,
                    start=span.start, num_tokens=span.num_tokens, pages=list(span.pages),
                    block_ids=list(save.block_ids), key_scale=list(saved.key_scale),
                ))
            self.counters["captures"] += len(saved.spans)

    def _check(self, request: Request) -> _Checked:
        rid = request.request_id
        checked = self._checked.get(rid)
        if checked is None:
            try:
                checked = self._verify(request)
            except Exception as exc:  # a plan must never take the scheduler down
                checked = _Checked(None, "rejected", f"plan could not be checked: {exc!r}")
            self._checked[rid] = checked
            self.counters[f"plans_{checked.status}"] += 1
            if checked.status in ("rejected", "mismatch"):
                self._unreported[checked.status] += 1
        return checked

    def _verify(self, request: Request) -> _Checked:
        prompt = request.prompt_token_ids or []
        params = request.kv_transfer_params
        entry = params.get(PARAMS_KEY) if type(params) is dict else None
        if type(entry) is dict and entry.get("kind") == LOCAL_KIND:  # handed over in-process
            local = take(self._tag, entry, prompt)
            if local is None:
                return _Checked(None, "rejected", "unknown in-process plan reference (it "
                                "reaches only the engine process that made it, once)")
            self.counters["prompts_by_identity"] += local[1]
            return self._checked_inject(request, *local, prompt=prompt)
        # The usual case: the MAC over the prompt's own ids (plan.py: the plan carries none).
        bound = InjectionPlan.bound(request.kv_transfer_params, prompt, self._secret)
        if bound is not None:
            return self._checked_inject(request, bound, True, prompt)
        # Everything else (saves, and inject plans that fail) is classified one check at a time.
        try:
            plan = from_params(request.kv_transfer_params)
        except PlanError as exc:
            return _Checked(None, "rejected", str(exc))
        if plan is None:
            return _Checked(None, "none")
        if isinstance(plan, SavePlan):
            if not plan.verify(self._secret, prompt):
                return _Checked(None, "rejected", "save plan MAC does not verify for this "
                                                  "prompt (forged, or replayed with another one)")
            return _Checked(plan, "save")
        return _Checked(None, "rejected", "inject plan MAC does not verify for this prompt "
                                          "(forged, stale, or sent with another prompt)")

    @staticmethod
    def _checked_inject(request: Request, plan: InjectionPlan, same_prompt: bool,
                        prompt: list[int]) -> _Checked:
        """An authentic inject plan, checked against the request's salt and token ids.

        same_prompt: the plan's ids are the prompt's (bound by its MAC, or the list the engine
        vouched for: handoff.take); otherwise they are compared.
        """
        if not plan.cache_salt or request.cache_salt != plan.cache_salt:
            return _Checked(None, "mismatch", "prompt is not salted with the plan's cache_salt")
        if plan.num_tokens > len(prompt) - 1:
            return _Checked(None, "mismatch", "plan covers the whole prompt; vLLM must compute "
                                              "at least one token")
        if not (same_prompt or plan.matches(prompt)):
            return _Checked(None, "mismatch", "prompt token ids differ from the plan's")
        return _Checked(plan, "inject")
