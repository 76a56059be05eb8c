"""The read path's "prepare" step: a handle and a chat become one vLLM request.

prepare() resolves the handle to fact records (refusing another user's facts), makes evicted
facts resident again (or decides on text mode), assembles [preamble][fact_1]..[fact_k][rest]
from token ids, signs the InjectionPlan (or, with an in-process scheduler, hands it over by
reference: handoff.py) and salts the prompt (a text prompt of a user with the user's
text_salt). The engine then runs the batch and collect() turns vLLM's outputs into
Generations, counting fallbacks.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter, is_
from typing import Any, cast

from inferscale_engine.checks import check_text, check_user_id
from inferscale_engine.config import EngineConfig
from inferscale_engine.errors import (
    FactNotFoundError,
    HandleError,
    InvalidRequestError,
    SlabFullError,
)
from inferscale_engine.facts import FactId, MemoryHandle
from inferscale_engine.prompting.layout import Layout, arrange
from inferscale_engine.prompting.prompt import MemoryPrompt, PromptBuilder
from inferscale_engine.protocol.handoff import PlanHandoff
from inferscale_engine.protocol.plan import InjectionPlan, text_salt
from inferscale_engine.runtime.generation import Generation, from_output
from inferscale_engine.runtime.preambles import PreambleCache
from inferscale_engine.runtime.residency import FactRecord, Residency
from inferscale_engine.runtime.runner import Runner
from inferscale_engine.runtime.write_path import FactWriter

Messages = Sequence[Mapping[str, str]]
_SLAB_KEY, _PACKED_IDS = attrgetter("slab_key"), attrgetter("packed_ids")
_PACKED_FROM = attrgetter("packed_from")


@dataclass(slots=True)
class PreparedRequest:
    """One request ready for vLLM, and what to report about it."""

    prompt: Any
    """vllm.TokensPrompt (salted when a plan rides on it)."""
    params: Any
    """vllm.SamplingParams (with the plan in extra_args in kv mode)."""
    asked_mode: str
    mode: str
    """'kv' or 'text': what was sent."""
    num_prompt_tokens: int
    fallback: str = ""
    num_repaired_facts: int = 0
    num_repaired_tokens: int = 0
    ref: str = ""
    """The plan's in-process reference (handoff.py), if it was handed over by one."""


class RequestPlanner:
    """Builds prompts and plans for handles of the engine's registered facts."""

    def __init__(self, config: EngineConfig, prompts: PromptBuilder,
                 facts: dict[FactId, FactRecord], residency: Residency, writer: FactWriter,
                 preambles: PreambleCache, secret: bytes, counters: Counter[str],
                 handoff: PlanHandoff | None = None) -> None:
        self._config = config
        self._prompts = prompts
        self._facts = facts
        self._residency = residency
        self._writer = writer
        self._preambles = preambles
        self._secret = secret
        self._counters = counters
        self.handoff = handoff
        """Hands prepare()'s plans to an in-process scheduler by reference (None: signed)."""

    def resolve(self, handle: MemoryHandle | None) -> list[FactRecord]:
        """Records of a handle, in handle order.

        Raises:
            HandleError: not a MemoryHandle, or it names another user's fact.
            FactNotFoundError: a fact id is unknown.
        """
        if handle is None:
            return []
        if not isinstance(handle, MemoryHandle):
            raise HandleError(f"expected a MemoryHandle, got {type(handle).__name__}")
        user_id = owner_of(handle)
        out = []
        for fact_id in handle.fact_ids:
            record = self._facts.get(fact_id)
            if record is None:
                raise FactNotFoundError(f"fact {fact_id} does not exist (deleted or never added)")
            if record.fact.user_id != user_id:
                self._counters["foreign_handles"] += 1
                raise HandleError(f"fact {fact_id} does not belong to user {user_id!r}; a "
                                  "handle may only name its own user's facts")
            out.append(record)
        return out

    def prepare(self, handle: MemoryHandle | None, records: list[FactRecord],
                messages: Messages, sampling: Any, mode: str, pinned: set[FactId],
                layout: Layout, tools: Sequence[Mapping[str, Any]] | None = None
                ) -> PreparedRequest:
        """The vLLM request for one (handle, messages).

        The layout decides which facts are injected and which are repaired as text (in text
        mode the same layout is prefilled whole). kv mode falls back to text when the facts to
        inject cannot be made resident.
        """
        return self.prepare_many([(handle, records, messages)], sampling, mode, pinned, layout,
                                 tools)[0]

    def prepare_many(self, requests: Sequence[tuple[MemoryHandle | None, list[FactRecord],
                                                    Messages]],
                     sampling: Any, mode: str, pinned: set[FactId], layout: Layout,
                     tools: Sequence[Mapping[str, Any]] | None = None
                     ) -> list[PreparedRequest]:
        """prepare() for each (handle, records, messages) of a batch, phase by phase.

        First every prompt, then every plan: each phase's code and data stay in the CPU's
        caches across the batch instead of being evicted by the other's (docs/benchmarks.md:
        the defaults' figures).
        """
        built = [self._build_request(handle, records, messages, sampling, layout, tools)
                 for handle, records, messages in requests]
        prepared: list[PreparedRequest] = []
        try:
            for (handle, _, _), (prompt, ids, injected, num_repaired, params) in zip(
                    requests, built, strict=True):
                prepared.append(self._kv_or_text(handle, prompt, ids, injected, num_repaired,
                                                 params, mode, pinned))
        except BaseException:  # the batch is not sent: the references handed out go with it
            PlanHandoff.discard(p.ref for p in prepared if p.ref)
            raise
        return prepared

    def _kv_or_text(self, handle: MemoryHandle | None, prompt: MemoryPrompt, ids: list[int],
                    injected: list[FactRecord], num_repaired: tuple[int, int], params: Any,
                    mode: str, pinned: set[FactId]) -> PreparedRequest:
        """One built request with its plan (kv mode, facts resident) or as text."""
        asked = mode if handle is not None else "text"
        plan, fallback = None, ""
        if asked == "kv":
            try:
                if self.ready_for_kv(injected, pinned):
                    plan = self.plan(handle, prompt, injected, pinned,  # type: ignore[arg-type]
                                     signed=self.handoff is None)
                else:
                    fallback = "evicted"
            except SlabFullError:  # not even the preamble fits: this one goes as text
                fallback = "evicted"
        self._residency.touch(injected)
        # Handed over by reference, the prompt list itself vouches for its ids when the prompt
        # holds the very tuples the plan's runs were packed from (k identity tests, no ids).
        vouched = (plan is not None and self.handoff is not None
                   and all(map(is_, prompt.facts, map(_PACKED_FROM, injected))))
        salt = text_salt(self._secret, owner_of(handle)) if handle is not None else None
        return _request(ids, plan, params, asked, fallback, num_repaired, self.handoff,
                        vouched, salt)

    def _build_request(self, handle: MemoryHandle | None, records: list[FactRecord],
                       messages: Messages, sampling: Any, layout: Layout,
                       tools: Sequence[Mapping[str, Any]] | None
                       ) -> tuple[MemoryPrompt, list[int], list[FactRecord], tuple[int, int],
                                  Any]:
        """The prompt, its ids, the records to inject, (repaired facts, tokens), own params."""
        injected, repaired = self.arrange(handle, records, layout)
        prompt = self.build(messages, injected, repaired, layout, tools)
        ids = prompt.token_ids()
        if len(ids) >= self._config.max_model_len:
            raise InvalidRequestError(f"prompt of {len(ids)} tokens exceeds max_model_len="
                                      f"{self._config.max_model_len}; retrieve fewer facts")
        params = sampling.clone()
        if hasattr(params, "skip_clone"):  # a copy of its own: vLLM need not deep-copy it again
            params.skip_clone = True
        if tools:  # some models mark their tool-call tags special (vLLM does the same)
            params.skip_special_tokens = False
        return (prompt, ids, injected,
                (len(repaired), sum(len(r.fact.token_ids) for r in repaired)), params)

    def arrange(self, handle: MemoryHandle | None, records: list[FactRecord], layout: Layout
                ) -> tuple[list[FactRecord], list[FactRecord]]:
        """The records to inject (memory-block order) and to repair as text (written order).

        The user's pinned facts come first, in handle order, and are never repaired; the
        layout arranges the others.
        """
        if handle is None or not records:
            return records, []
        held = self._residency.held
        first = [r for r in records if r.fact.fact_id in held]
        if not first:
            injected, repaired = arrange(layout, [r.fact.fact_id for r in records],
                                         [len(r.fact.token_ids) for r in records], handle.scores)
            return [records[i] for i in injected], [records[i] for i in repaired]
        rest = [i for i, r in enumerate(records) if r.fact.fact_id not in held]
        scores = [handle.scores[i] for i in rest] if handle.scores else []
        injected, repaired = arrange(layout, [records[i].fact.fact_id for i in rest],
                                     [len(records[i].fact.token_ids) for i in rest], scores)
        return ([*first, *(records[rest[i]] for i in injected)],
                [records[rest[i]] for i in repaired])

    def build(self, messages: Messages, injected: list[FactRecord],
              repaired: list[FactRecord], layout: Layout,
              tools: Sequence[Mapping[str, Any]] | None = None) -> MemoryPrompt:
        """The prompt: injected facts in the memory block, repaired ones where the layout says."""
        facts = [r.fact.token_ids for r in injected]
        if layout.repair_placement == "user":
            return self._prompts.build(messages, facts, user_block=[r.fact.text for r in repaired],
                                       tools=tools)
        return self._prompts.build(messages, facts, repaired=[r.fact.token_ids for r in repaired],
                                   tools=tools)

    def ready_for_kv(self, records: list[FactRecord], pinned: set[FactId]) -> bool:
        """Make evicted facts resident again (or say the request must go as text)."""
        if None not in map(_SLAB_KEY, records):  # all resident (C-level scan)
            return True
        missing = [r for r in records if not r.resident]
        if self._config.on_evicted == "text" or not self._residency.can_fit(
                [len(r.fact.token_ids) for r in missing], pinned,
                self._config.on_slab_full == "evict"):
            return False
        encoded = self._counters["encoded_facts"]
        try:
            self._writer.make_resident(missing, self._prompts.preamble(), pinned)
        except SlabFullError:
            return False
        self._counters["returned_facts"] += len(missing)  # from host RAM, disk or encoded
        self._counters["reencoded_facts"] += self._counters["encoded_facts"] - encoded
        return True

    def plan(self, handle: MemoryHandle, prompt: MemoryPrompt, records: list[FactRecord],
             pinned: set[FactId] | None = None, signed: bool = True) -> InjectionPlan:
        """The plan of a prompt whose facts are resident; signed unless handed over by reference."""
        pinned = pinned if pinned is not None else {r.fact.fact_id for r in records}
        if len(records) != len(prompt.facts):
            raise ValueError(f"{len(records)} records for a prompt of {len(prompt.facts)} facts")
        # The runs are the stored token ids (the prompt was built from them; the connector
        # checks that it still holds exactly these), packed when each fact was added.
        slab_keys = list(map(_SLAB_KEY, records))
        if None in slab_keys:
            raise ValueError("plan() needs resident records (ready_for_kv first)")
        keys = [self._preambles.key(prompt.preamble, pinned), *slab_keys]
        runs = [self._preambles.run(prompt.preamble), *map(_PACKED_IDS, records)]
        user_id = owner_of(handle)
        plan = InjectionPlan.from_runs(user_id, keys, runs, secret=self._secret)
        return plan.signed(self._secret) if signed else plan


def prepare_batch(planners: Sequence[RequestPlanner],
                  requests: Sequence[tuple[MemoryHandle | None, list[FactRecord], Messages]],
                  sampling: Any, mode: str, pinned: set[FactId], layout: Layout,
                  tools: Sequence[Mapping[str, Any]] | None = None) -> list[PreparedRequest]:
    """A batch's requests, each through its shard's planner (prepare_many), in batch order."""
    by_planner: dict[int, list[int]] = {}
    for i, planner in enumerate(planners):
        by_planner.setdefault(id(planner), []).append(i)
    prepared: list[PreparedRequest | None] = [None] * len(requests)
    for indices in by_planner.values():
        batch = planners[indices[0]].prepare_many([requests[i] for i in indices], sampling,
                                                  mode, pinned, layout, tools)
        for i, request in zip(indices, batch, strict=True):
            prepared[i] = request
    return cast(list[PreparedRequest], prepared)


def _request(ids: list[int], plan: InjectionPlan | None, params: Any, asked: str,
             fallback: str, num_repaired: tuple[int, int], handoff: PlanHandoff | None = None,
             vouched: bool = False, salt: str | None = None) -> PreparedRequest:
    """The vLLM request: the prompt, salted, with the plan in its params when there is one.

    The plan rides signed in the params, or by reference when `handoff` is given (with `ids`
    as the prompt the scheduler may recognize by identity when `vouched`: ids starts with
    exactly the plan's tokens). A text prompt of a handle's user goes with `salt` (its
    text_salt); one without a handle carries no user's data and goes unsalted.
    """
    from vllm import TokensPrompt

    if plan is None:
        prompt = (TokensPrompt(prompt_token_ids=ids, cache_salt=salt) if salt
                  else TokensPrompt(prompt_token_ids=ids))
        return PreparedRequest(prompt, params, asked, "text", len(ids), fallback, *num_repaired)
    ref, sent = (handoff.put(plan, ids if vouched else None) if handoff is not None
                 else ("", plan.to_params()))
    params.extra_args = {**(params.extra_args or {}), "kv_transfer_params": sent}
    return PreparedRequest(TokensPrompt(prompt_token_ids=ids, cache_salt=plan.cache_salt),
                           params, asked, "kv", len(ids), "", *num_repaired, ref)


def owner_of(handle: MemoryHandle) -> str:
    """The user a handle names, checked and normalized: the read path's one user-id check."""
    return check_user_id(handle.user_id)


def run_batch(runner: Runner, prepared: list[PreparedRequest], ranks: list[int],
              counters: Counter[str]) -> list[Generation]:
    """Run a prepared batch on vLLM and collect its Generations (under the Engine's lock)."""
    start = time.perf_counter()
    try:
        outputs = runner.run([p.prompt for p in prepared], [p.params for p in prepared],
                             ranks=ranks)
    finally:  # references the scheduler did not take (a refused or aborted request)
        PlanHandoff.discard(p.ref for p in prepared if p.ref)
    return collect(prepared, outputs, (time.perf_counter() - start) * 1e3, counters)


def run_stream(runner: Runner, prepared: PreparedRequest, rank: int, counters: Counter[str]
               ) -> Iterator[Generation]:
    """Stream one prepared request (stream_collect); its plan reference is dropped at the end."""
    try:
        yield from stream_collect(prepared, runner.stream(prepared.prompt, prepared.params, rank),
                                  counters)
    finally:
        PlanHandoff.discard([prepared.ref] if prepared.ref else [])


def collect(prepared: list[PreparedRequest], outputs: list[Any], latency_ms: float,
            counters: Counter[str]) -> list[Generation]:
    """Generations of a finished batch; counts requests per mode and every fallback."""
    results = []
    for request, out in zip(prepared, outputs, strict=True):
        generation = from_output(out, request.mode, request.num_prompt_tokens, latency_ms)
        counters[f"requests_{generation.mode}"] += 1
        fallback = request.fallback
        if request.mode == "kv" and generation.plan_status != "inject":
            fallback = generation.plan_status  # refused by the connector: vLLM prefilled
        if fallback:
            counters[f"fallback_text_{fallback}" if fallback == "evicted"
                     else f"fallback_{fallback}"] += 1
        if request.num_repaired_facts:
            counters["repaired_facts"] += request.num_repaired_facts
            counters["repaired_tokens"] += request.num_repaired_tokens
        results.append(replace(generation, fallback=fallback,
                               num_repaired_facts=request.num_repaired_facts,
                               num_repaired_tokens=request.num_repaired_tokens))
    return results


def stream_collect(request: PreparedRequest, outputs: Iterable[Any], counters: Counter[str]
                   ) -> Iterator[Generation]:
    """A Generation per RequestOutput of one streamed request; only the finished one counts."""
    start = time.perf_counter()
    for out in outputs:
        latency_ms = (time.perf_counter() - start) * 1e3
        yield collect([request], [out], latency_ms, counters if out.finished else Counter())[0]


def check_request(mode: str, layout: object, sampling: Any) -> Any:
    """The request's SamplingParams (default: greedy, 64 tokens), its mode and layout checked."""
    from vllm import SamplingParams

    if mode not in ("kv", "text"):
        raise InvalidRequestError(f"mode must be 'kv' or 'text', got {mode!r}")
    if layout is not None and not isinstance(layout, Layout):
        raise InvalidRequestError(f"layout must be a Layout, got {type(layout).__name__}")
    sampling = sampling or SamplingParams(max_tokens=64, temperature=0.0)
    if not isinstance(sampling, SamplingParams):
        raise InvalidRequestError("sampling must be a vllm.SamplingParams, got "
                                  f"{type(sampling).__name__}")
    return sampling


def as_messages(messages: Messages | str) -> Messages:
    """A chat (role/content dicts) from messages or one question string."""
    if isinstance(messages, str):
        return [{"role": "user", "content": check_text(messages, "the question",
                                                       InvalidRequestError)}]
    if not isinstance(messages, Sequence) or not messages:
        raise InvalidRequestError("messages must be a non-empty list of role/content dicts or "
                                  "a question string")
    return cast(Messages, messages)
