"""Engine: a co-located vLLM whose prompts start with injected fact KV.

Write path: add_facts() encodes facts through batched vLLM "save" requests
([preamble][<= W context tokens][fact], max_tokens=1); the connector keeps only the fact's KV.
Read path: generate() assembles [preamble][fact_1]..[fact_k][rest] from token ids, signs an
InjectionPlan and salts the prompt; the connector verifies and injects. Text mode sends the same
token ids with no plan: the baseline of every benchmark and the fallback.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferscale_engine.checks import check_text, check_user_id
from inferscale_engine.config import ConnectorConfig, EngineConfig, plan_secret
from inferscale_engine.connector.slab import SlabAllocator
from inferscale_engine.errors import (
    EngineClosedError,
    FactNotFoundError,
    HandleError,
    InvalidFactError,
    InvalidRequestError,
    SlabFullError,
    UnsupportedModelError,
)
from inferscale_engine.facts import Fact, FactId, MemoryHandle
from inferscale_engine.plan import (
    SYSTEM_OWNER,
    InjectionPlan,
    SavePlan,
    Segment,
    cache_salt,
    token_digest,
)
from inferscale_engine.prompt import MemoryPrompt, PromptBuilder
from inferscale_engine.residency import FactRecord, Residency
from inferscale_engine.rope import RopeSpec
from inferscale_engine.runner import RESULT_KEY, VllmRunner

Messages = Sequence[dict[str, str]]


@dataclass(frozen=True, slots=True)
class Generation:
    """One generated answer and how its prompt was served."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    """Log-probability of each sampled token (empty unless SamplingParams.logprobs is set)."""
    first_token_logprobs: dict[int, float]
    """Top-N log-probabilities of the first answer token (N = SamplingParams.logprobs)."""
    mode: str
    """'kv' (facts injected) or 'text' (facts prefilled as text)."""
    num_prompt_tokens: int
    num_injected_tokens: int
    """Prompt tokens whose KV came from the slab (0 in text mode or after a fallback)."""
    num_cached_tokens: int
    """Prompt tokens vLLM did not compute (injected + prefix-cache hits)."""
    plan_status: str
    """Connector verdict: inject, mismatch, rejected, or none (text mode / fallback)."""
    latency_ms: float
    """Wall time of the whole generate call (all requests of a batch)."""
    ttft_ms: float | None = None
    """vLLM's own arrival-to-first-token time (needs vllm_overrides disable_log_stats=False)."""


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counters of the app side and of every worker's slab."""

    num_facts: int
    num_resident_facts: int
    num_free_pages: int
    workers: list[dict[str, int]] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)


class Engine:
    """A vLLM engine with InferScale's KV connector and fact index. Thread-safe."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._lock = threading.RLock()
        self._closed = False
        hf_config, self.rope = _check_model(config)
        self.tokenizer = _load_tokenizer(config)
        self.prompts = PromptBuilder(self.tokenizer, config.system_prompt)
        self._secret = plan_secret()
        bytes_per_token = _kv_bytes_per_token(hf_config, config)
        num_pages = config.slab_capacity_bytes // (config.slab_page_tokens * bytes_per_token)
        if num_pages < 1:
            raise UnsupportedModelError(
                f"slab_capacity_bytes={config.slab_capacity_bytes} cannot hold one page of "
                f"{config.slab_page_tokens} tokens ({bytes_per_token} bytes each); raise it")
        self._residency = Residency(SlabAllocator(num_pages, config.slab_page_tokens))
        self._runner = VllmRunner(config, ConnectorConfig(
            num_pages, config.slab_page_tokens, config.max_model_len, config.key_origin))
        self._facts: dict[FactId, FactRecord] = {}
        self._preambles: OrderedDict[str, tuple[int, tuple[int, ...]]] = OrderedDict()
        self._batch_preambles: set[str] = set()
        self._next_fact_id = 1
        self.counters: Counter[str] = Counter()
        self._default_preamble = token_digest(self.prompts.preamble())
        self._preamble_key(self.prompts.preamble())  # fail now, not on the first request

    # ---- write path --------------------------------------------------------------------
    def add_facts(self, user_id: str, texts: Sequence[str],
                  contexts: Sequence[str | None] | None = None, *,
                  fact_ids: Sequence[FactId] | None = None, window: int | None = None,
                  encode: bool = True) -> list[FactId]:
        """Register facts and encode their KV once (batched); returns their ids, in order.

        Args:
            user_id: owner of the facts.
            texts: fact texts.
            contexts: per fact, the conversation text that preceded it (Context-Window
                Encoding keeps its last `window` tokens before the fact), or None.
            fact_ids: ids to use (e.g. a durable store's); default: the engine numbers them.
            window: tokens of context to keep (default EngineConfig.context_window_tokens).
            encode: False registers the facts only; their KV is built on first use.

        Raises:
            InvalidFactError: a text is empty, not a string, or too long. Nothing is stored.
            SlabFullError: the facts do not fit even after eviction. Nothing is stored.
        """
        user_id = check_user_id(user_id)
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise InvalidFactError(f"texts must be a list of strings, got {type(texts).__name__}")
        contexts = list(contexts) if contexts is not None else [None] * len(texts)
        if len(contexts) != len(texts):
            raise InvalidFactError(f"{len(contexts)} contexts for {len(texts)} facts; pass one "
                                   "context (or None) per fact")
        window = self.config.context_window_tokens if window is None else window
        if not 0 <= window <= self.config.context_window_tokens:
            raise InvalidFactError(f"window must be in [0, {self.config.context_window_tokens}] "
                                   "(EngineConfig.context_window_tokens)")
        token_ids = [self._fact_tokens(t) for t in texts]
        context_ids = [self._context_tokens(c, window) for c in contexts]
        with self._lock:
            self._check_open()
            ids = self._new_fact_ids(fact_ids, len(texts))
            records = [FactRecord(Fact(fid, user_id, text.strip(), toks), ctx)
                       for fid, text, toks, ctx in zip(ids, texts, token_ids, context_ids)]
            if encode:
                self._make_resident(records, pinned={r.fact.fact_id for r in records})
            for record in records:
                self._facts[record.fact.fact_id] = record
        return ids

    def _new_fact_ids(self, fact_ids: Sequence[FactId] | None, count: int) -> list[FactId]:
        if fact_ids is None:
            ids = [FactId(self._next_fact_id + i) for i in range(count)]
        else:
            ids = [FactId(int(f)) for f in fact_ids]
            if len(ids) != count or len(set(ids)) != count:
                raise InvalidFactError("fact_ids must hold one distinct id per text")
            if clash := [f for f in ids if f in self._facts]:
                raise InvalidFactError(f"fact ids {clash[:5]} are already registered")
        self._next_fact_id = max([self._next_fact_id - 1, *ids]) + 1
        return ids

    def _fact_tokens(self, text: object) -> tuple[int, ...]:
        text = check_text(text, "a fact")
        ids = self.prompts.fact_ids(text)
        if len(ids) > self.config.max_fact_tokens:
            raise InvalidFactError(
                f"a fact has {len(ids)} tokens, over max_fact_tokens="
                f"{self.config.max_fact_tokens}; split it or raise the limit: {text[:60]!r}...")
        return ids

    def _context_tokens(self, context: object, window: int) -> tuple[int, ...]:
        if context is None or window == 0:
            return ()
        if not isinstance(context, str):
            raise InvalidFactError(f"a context must be a string or None, got "
                                   f"{type(context).__name__}")
        return self.prompts.encode(context)[-window:]

    def _make_resident(self, records: list[FactRecord], pinned: set[FactId]) -> None:
        """Give non-resident records slab pages (evicting LRU facts if allowed) and encode them.

        All or nothing: on failure no record becomes resident and no page stays allocated.
        """
        todo = [r for r in records if not r.resident]
        if not todo:
            return
        preamble = self.prompts.preamble()
        evict = self.config.on_slab_full == "evict"
        allocated: list[tuple[FactRecord, int, tuple[int, ...]]] = []
        try:
            for record in todo:
                pages, evicted = self._residency.allocate(len(record.fact.token_ids), pinned,
                                                          evict)
                self._free_entries(evicted)
                allocated.append((record, self._residency.next_slab_key(), pages))
            prompts = [list(preamble) + list(r.context_ids) + list(r.fact.token_ids)
                       for r, _, _ in allocated]
            plans = [SavePlan(r.fact.user_id, key, len(preamble) + len(r.context_ids),
                              len(r.fact.token_ids), pages).signed(self._secret, prompt)
                     for (r, key, pages), prompt in zip(allocated, prompts)]
            self._run_saves(plans, prompts)
        except BaseException:
            for _, _, pages in allocated:
                self._residency.free_pages(pages)
            self._runner.rpc("inferscale_free", [key for _, key, _ in allocated])
            raise
        for record, key, pages in allocated:
            self._residency.admit(record, key, pages)

    def _free_entries(self, records: Iterable[FactRecord]) -> None:
        keys = [r.slab_key for r in records if r.slab_key is not None]
        for record in records:
            self._residency.release(record)
        if keys:
            self._runner.rpc("inferscale_free", keys)
            self.counters["evicted_facts"] += len(keys)

    def _run_saves(self, plans: list[SavePlan], prompts: list[list[int]]) -> None:
        from vllm import SamplingParams, TokensPrompt

        batch = self.config.save_batch_size
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
        for rank, resident in enumerate(self._runner.rpc("inferscale_resident", keys)):
            if not all(resident):
                raise RuntimeError(f"worker {rank} did not capture {resident.count(False)} facts")
        self.counters["encoded_facts"] += len(plans)

    MAX_PREAMBLES = 16
    """Distinct system-prompt preambles kept in the slab (LRU; the configured one always stays).
    Agents and chat engines send one per tool set or per retrieved context, so they must not
    accumulate until the slab is full."""

    def _preamble_key(self, preamble: tuple[int, ...], pinned: set[FactId] | None = None) -> int:
        """Slab key of a preamble, encoded on first use.

        The configured preamble is never evicted; others are kept least recently used, at most
        MAX_PREAMBLES, and are the first to go when the slab is full. Preambles of the batch
        being built (and the batch's facts, `pinned`) are never evicted for another.
        """
        digest = token_digest(preamble)
        self._batch_preambles.add(digest)
        entry = self._preambles.get(digest)
        if entry is not None:
            self._preambles.move_to_end(digest)
            return entry[0]
        self._evict_preambles(self.MAX_PREAMBLES - 1)
        evict = self.config.on_slab_full == "evict"
        try:
            pages, evicted = self._residency.allocate(len(preamble), set(pinned or ()), evict)
        except SlabFullError:
            self._evict_preambles(0)
            pages, evicted = self._residency.allocate(len(preamble), set(pinned or ()), evict)
        self._free_entries(evicted)
        key = self._residency.next_slab_key()
        plan = SavePlan(SYSTEM_OWNER, key, 0, len(preamble), pages).signed(self._secret,
                                                                          preamble)
        try:
            self._run_saves([plan], [list(preamble)])
        except BaseException:
            self._residency.free_pages(pages)
            raise
        self._preambles[digest] = (key, pages)
        return key

    def _evict_preambles(self, keep: int) -> None:
        """Free least recently used preambles until at most `keep` evictable ones remain."""
        evictable = [d for d in self._preambles
                     if d != self._default_preamble and d not in self._batch_preambles]
        victims = evictable[:max(0, len(evictable) - keep)]
        if not victims:
            return
        keys = []
        for digest in victims:
            key, pages = self._preambles.pop(digest)
            self._residency.free_pages(pages)
            keys.append(key)
        self._runner.rpc("inferscale_free", keys)
        self.counters["evicted_preambles"] += len(keys)

    # ---- read path ---------------------------------------------------------------------
    def generate(self, handle: MemoryHandle | None, messages: Messages | str,
                 sampling: Any = None, mode: str = "kv") -> Generation:
        """Answer `messages` with the handle's facts in the memory block.

        Args:
            handle: facts to use (None: no memory).
            messages: chat messages (role/content dicts) or one user question.
            sampling: vllm.SamplingParams (default: greedy, 64 tokens).
            mode: 'kv' injects the facts' stored KV; 'text' prefills them as text.

        Raises:
            HandleError: the handle is not a MemoryHandle or references another user's facts.
            FactNotFoundError: a fact id is unknown.
        """
        return self.generate_many([(handle, messages)], sampling, mode)[0]

    def generate_many(self, requests: Sequence[tuple[MemoryHandle | None, Messages | str]],
                      sampling: Any = None, mode: str = "kv") -> list[Generation]:
        """generate() for many requests in one vLLM batch."""
        from vllm import SamplingParams

        if mode not in ("kv", "text"):
            raise InvalidRequestError(f"mode must be 'kv' or 'text', got {mode!r}")
        sampling = sampling or SamplingParams(max_tokens=64, temperature=0.0)
        if not isinstance(sampling, SamplingParams):
            raise InvalidRequestError("sampling must be a vllm.SamplingParams, got "
                                      f"{type(sampling).__name__}")
        with self._lock:  # held through the run: vllm.LLM is not thread-safe
            try:
                return self._generate_locked(requests, sampling, mode)
            finally:
                self._batch_preambles.clear()

    def _generate_locked(self, requests: Sequence[tuple[MemoryHandle | None, Messages | str]],
                         sampling: Any, mode: str) -> list[Generation]:
        from vllm import TokensPrompt

        self._check_open()
        resolved = [(self._resolve(h), _as_messages(m)) for h, m in requests]
        pinned = {r.fact.fact_id for records, _ in resolved for r in records}
        prompts, params, modes, lengths = [], [], [], []
        for (records, messages), (handle, _) in zip(resolved, requests):
            prompt = self.prompts.build(messages, [r.fact.token_ids for r in records])
            ids = prompt.token_ids()
            if len(ids) >= self.config.max_model_len:
                raise InvalidRequestError(
                    f"prompt of {len(ids)} tokens exceeds max_model_len="
                    f"{self.config.max_model_len}; retrieve fewer facts")
            request_mode = mode if handle is not None else "text"
            if request_mode == "kv" and not self._ready_for_kv(records, pinned):
                request_mode = "text"
            request_params = sampling.clone()
            plan = None
            if request_mode == "kv":
                try:
                    plan = self._plan(handle, prompt, records, pinned)
                except SlabFullError:  # not even the preamble fits: this one goes as text
                    request_mode = "text"
            if plan is not None:
                request_params.extra_args = {**(request_params.extra_args or {}),
                                             "kv_transfer_params": plan.to_params()}
                prompts.append(TokensPrompt(prompt_token_ids=ids, cache_salt=plan.cache_salt))
            else:
                prompts.append(TokensPrompt(prompt_token_ids=ids))
            self._residency.touch(records)
            params.append(request_params)
            modes.append(request_mode)
            lengths.append(len(ids))
        start = time.perf_counter()
        outputs = self._runner.run(prompts, params)
        latency_ms = (time.perf_counter() - start) * 1e3
        results = [_generation(out, m, n, latency_ms) for out, m, n in zip(outputs, modes, lengths)]
        for asked, g in zip((mode if h is not None else "text" for h, _ in requests), results):
            self.counters[f"requests_{g.mode}"] += 1
            if asked == "kv" and g.mode == "text":
                self.counters["fallback_text_evicted"] += 1
            elif g.mode == "kv" and g.plan_status != "inject":
                self.counters[f"fallback_{g.plan_status}"] += 1
        return results

    def prepare_request(self, handle: MemoryHandle, messages: Messages | str
                        ) -> tuple[MemoryPrompt, InjectionPlan]:
        """The prompt and signed plan generate() would send in KV mode.

        For clients that talk to vLLM themselves: send prompt.token_ids() with
        cache_salt=plan.cache_salt and kv_transfer_params=plan.to_params().
        """
        with self._lock:
            self._check_open()
            records = self._resolve(handle)
            if not self._ready_for_kv(records, {r.fact.fact_id for r in records}):
                raise SlabFullError("the handle's facts do not fit in the slab")
            prompt = self.prompts.build(_as_messages(messages), [r.fact.token_ids for r in records])
            try:
                return prompt, self._plan(handle, prompt, records)
            finally:
                self._batch_preambles.clear()

    def _ready_for_kv(self, records: list[FactRecord], pinned: set[FactId]) -> bool:
        """Make evicted facts resident again (or say the request must go as text)."""
        missing = [r for r in records if not r.resident]
        if not missing:
            return True
        if self.config.on_evicted == "text" or not self._residency.can_fit(
                [len(r.fact.token_ids) for r in missing], pinned,
                self.config.on_slab_full == "evict"):
            return False
        try:
            self._make_resident(missing, pinned)
        except SlabFullError:
            return False
        self.counters["reencoded_facts"] += len(missing)
        return True

    def _plan(self, handle: MemoryHandle, prompt: MemoryPrompt, records: list[FactRecord],
              pinned: set[FactId] | None = None) -> InjectionPlan:
        pinned = pinned if pinned is not None else {r.fact.fact_id for r in records}
        segments = [Segment(self._preamble_key(prompt.preamble, pinned), 0, prompt.preamble)]
        segments += [Segment(r.slab_key or 0, start, r.fact.token_ids)
                     for r, start in zip(records, prompt.fact_starts())]
        user_id = check_user_id(handle.user_id)
        salt = cache_salt(self._secret, user_id, [s.slab_key for s in segments])
        return InjectionPlan.from_segments(user_id, segments, salt).signed(self._secret)

    def _resolve(self, handle: MemoryHandle | None) -> list[FactRecord]:
        """Records of a handle, in handle order; refuses foreign or unknown facts."""
        if handle is None:
            return []
        if not isinstance(handle, MemoryHandle):
            raise HandleError(f"expected a MemoryHandle, got {type(handle).__name__}")
        user_id = check_user_id(handle.user_id)
        out = []
        for fact_id in handle.fact_ids:
            record = self._facts.get(fact_id)
            if record is None:
                raise FactNotFoundError(f"fact {fact_id} does not exist (deleted or never added)")
            if record.fact.user_id != user_id:
                self.counters["foreign_handles"] += 1
                raise HandleError(f"fact {fact_id} does not belong to user "
                                  f"{user_id!r}; a handle may only name its own user's "
                                  "facts")
            out.append(record)
        return out

    # ---- management --------------------------------------------------------------------
    def get_facts(self, user_id: str) -> list[Fact]:
        """All facts of a user, oldest first."""
        user_id = check_user_id(user_id)
        with self._lock:
            return [r.fact for r in self._facts.values() if r.fact.user_id == user_id]

    def is_resident(self, fact_id: FactId) -> bool:
        """True if the fact's KV is in the slab now."""
        with self._lock:
            record = self._facts.get(fact_id)
            if record is None:
                raise FactNotFoundError(f"fact {fact_id} does not exist")
            return record.resident

    def delete(self, user_id: str, fact_ids: Sequence[FactId]) -> None:
        """Delete facts and free their slab pages.

        Raises:
            FactNotFoundError / HandleError: an id is unknown or another user's; nothing is
                deleted.
        """
        with self._lock:
            self._check_open()
            records = self._resolve(MemoryHandle(user_id, tuple(fact_ids)))
            keys = [r.slab_key for r in records if r.slab_key is not None]
            if keys:
                self._runner.rpc("inferscale_free", keys)
            for record in records:
                self._residency.release(record)
                del self._facts[record.fact.fact_id]

    def stats(self) -> EngineStats:
        """App-side and per-worker counters."""
        with self._lock:
            self._check_open()
            return EngineStats(len(self._facts), self._residency.num_resident,
                               self._residency.num_free_pages, self._runner.rpc("inferscale_stats"),
                               dict(self.counters))

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

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the engine was closed; build a new Engine")

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _as_messages(messages: Messages | str) -> Messages:
    if isinstance(messages, str):
        return [{"role": "user", "content": check_text(messages, "the question",
                                                       InvalidRequestError)}]
    if not isinstance(messages, Sequence) or not messages:
        raise InvalidRequestError("messages must be a non-empty list of role/content dicts or "
                                  "a question string")
    return messages


def _generation(out: Any, mode: str, num_prompt_tokens: int, latency_ms: float) -> Generation:
    completion = out.outputs[0]
    logprobs: tuple[float, ...] = ()
    first: dict[int, float] = {}
    if completion.logprobs:
        logprobs = tuple(step[tok].logprob for step, tok in zip(completion.logprobs,
                                                                 completion.token_ids))
        first = {tok: lp.logprob for tok, lp in completion.logprobs[0].items()}
    result = (out.kv_transfer_params or {}).get(RESULT_KEY, {})
    status = result.get("status", "none")
    injected = int(result.get("claimed", 0)) if status == "inject" else 0
    metrics = getattr(out, "metrics", None)
    first_token_s = getattr(metrics, "first_token_latency", 0.0) if metrics else 0.0
    return Generation(completion.text, tuple(completion.token_ids), logprobs, first, mode,
                      num_prompt_tokens, injected, int(out.num_cached_tokens or 0), status,
                      latency_ms, first_token_s * 1e3 if first_token_s else None)


def _check_model(config: EngineConfig) -> tuple[Any, RopeSpec]:
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(config.model)
    rope = RopeSpec.from_hf_config(hf_config)
    text_config = getattr(hf_config, "get_text_config", lambda: hf_config)()
    if getattr(text_config, "sliding_window", None) and getattr(
            text_config, "use_sliding_window", True):
        raise UnsupportedModelError(
            f"model {config.model!r} uses sliding-window attention; injected facts would fall "
            "out of the window. Use a full-attention model.")
    return hf_config, rope


def _load_tokenizer(config: EngineConfig) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(config.tokenizer or config.model)


def _kv_bytes_per_token(hf_config: Any, config: EngineConfig) -> int:
    """Bytes one token takes in one worker's slab (keys + values, all layers)."""
    heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or (
        hf_config.hidden_size // hf_config.num_attention_heads)
    dtype = config.dtype
    if dtype == "auto":
        dtype = str(getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
                    or "bfloat16").replace("torch.", "")
    heads_per_rank = max(1, heads // config.tensor_parallel_size)
    return 2 * hf_config.num_hidden_layers * heads_per_rank * head_dim * (
        4 if dtype == "float32" else 2)
