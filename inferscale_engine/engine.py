"""Engine: a co-located vLLM whose prompts start with injected fact KV.

Write path: add_facts() encodes facts through batched vLLM "save" requests
([preamble][<= W context tokens][fact], max_tokens=1); the connector keeps only the fact's KV.
Read path: generate() assembles [preamble][fact_1]..[fact_k][rest] from token ids, signs an
InjectionPlan and salts the prompt; the connector verifies and injects. Text mode sends the same
token ids with no plan: the baseline of every benchmark and the fallback.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from inferscale_engine.config import ConnectorConfig, EngineConfig, plan_secret
from inferscale_engine.connector.slab import SlabAllocator
from inferscale_engine.errors import (
    EngineClosedError,
    FactNotFoundError,
    HandleError,
    InvalidFactError,
    InvalidRequestError,
    UnsupportedModelError,
)
from inferscale_engine.facts import Fact, FactId, MemoryHandle
from inferscale_engine.plan import (
    PARAMS_KEY,
    SYSTEM_OWNER,
    InjectionPlan,
    SavePlan,
    Segment,
    token_digest,
)
from inferscale_engine.prompt import MemoryPrompt, PromptBuilder
from inferscale_engine.rope import RopeSpec

_RESULT_KEY = PARAMS_KEY + "_result"
Messages = Sequence[dict[str, str]]


@dataclass(slots=True)
class _Stored:
    fact: Fact
    slab_key: int
    pages: tuple[int, ...]


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
    """Connector verdict: inject, mismatch, rejected, or none (text mode)."""
    latency_ms: float


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counters of the app side and of every worker's slab."""

    num_facts: int
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
        self._allocator = SlabAllocator(num_pages, config.slab_page_tokens)
        self._llm = _build_llm(config, ConnectorConfig(
            num_pages, config.slab_page_tokens, config.max_model_len, config.key_origin))
        self._facts: dict[FactId, _Stored] = {}
        self._preambles: dict[str, int] = {}
        self._next_fact_id = 1
        self._next_slab_key = 1
        self.counters: Counter[str] = Counter()
        self._preamble_key(())  # fail now, not on the first request

    # ---- write path --------------------------------------------------------------------
    def add_facts(self, user_id: str, texts: Sequence[str],
                  contexts: Sequence[str | None] | None = None) -> list[FactId]:
        """Encode facts once (batched) and keep their KV; returns their ids, in order.

        Args:
            user_id: owner of the facts.
            texts: fact texts.
            contexts: per fact, the conversation text that preceded it (Context-Window
                Encoding keeps its last W tokens before the fact), or None.
        Raises:
            InvalidFactError: a text is empty, not a string, or too long. Nothing is stored.
            SlabFullError: the slab cannot hold all facts. Nothing is stored.
        """
        _check_user(user_id)
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise InvalidFactError("texts must be a list of strings, got "
                                   f"{type(texts).__name__}")
        contexts = list(contexts) if contexts is not None else [None] * len(texts)
        if len(contexts) != len(texts):
            raise InvalidFactError(f"{len(contexts)} contexts for {len(texts)} facts; pass one "
                                   "context (or None) per fact")
        token_ids = [self._fact_tokens(t) for t in texts]
        with self._lock:
            self._check_open()
            fact_ids = [FactId(self._next_fact_id + i) for i in range(len(texts))]
            stored = self._encode(user_id, fact_ids, list(texts), token_ids, contexts)
            self._next_fact_id += len(texts)
            for item in stored:
                self._facts[item.fact.fact_id] = item
        return fact_ids

    def _fact_tokens(self, text: object) -> tuple[int, ...]:
        if not isinstance(text, str):
            raise InvalidFactError(f"a fact must be a string, got {type(text).__name__}")
        if not text.strip():
            raise InvalidFactError("a fact is empty or whitespace; pass text with content")
        ids = self.prompts.fact_ids(text.strip())
        if len(ids) > self.config.max_fact_tokens:
            raise InvalidFactError(
                f"a fact has {len(ids)} tokens, over max_fact_tokens="
                f"{self.config.max_fact_tokens}; split it or raise the limit: {text[:60]!r}...")
        return ids

    def _encode(self, user_id: str, fact_ids: list[FactId], texts: list[str],
                token_ids: list[tuple[int, ...]], contexts: list[str | None]) -> list[_Stored]:
        """Allocate pages, run save requests, confirm residency. All or nothing."""
        preamble = self.prompts.preamble()
        window = self.config.context_window_tokens
        stored, plans, prompts = [], [], []
        try:
            for fact_id, text, ids, context in zip(fact_ids, texts, token_ids, contexts):
                pages = self._allocator.allocate(len(ids))
                slab_key, self._next_slab_key = self._next_slab_key, self._next_slab_key + 1
                ctx = self.prompts.encode(context)[-window:] if context and window else ()
                plan = SavePlan(user_id, slab_key, len(preamble) + len(ctx), ids, pages)
                plans.append(plan.signed(self._secret))
                prompts.append(list(preamble) + list(ctx) + list(ids))
                stored.append(_Stored(Fact(fact_id, user_id, text.strip(), ids), slab_key, pages))
            self._run_saves(plans, prompts)
        except BaseException:
            for item in stored:
                self._allocator.free(item.pages)
            self._llm.collective_rpc("inferscale_free", args=([s.slab_key for s in stored],))
            raise
        return stored

    def _run_saves(self, plans: list[SavePlan], prompts: list[list[int]]) -> None:
        from vllm import SamplingParams, TokensPrompt

        batch = self.config.save_batch_size
        for lo in range(0, len(plans), batch):
            chunk = slice(lo, lo + batch)
            params = [SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": p.to_params()})
                      for p in plans[chunk]]
            outputs = self._run([TokensPrompt(prompt_token_ids=p) for p in prompts[chunk]],
                                params, use_tqdm=len(plans) > batch)
            for out in outputs:
                result = (out.kv_transfer_params or {}).get(_RESULT_KEY, {})
                if result.get("status") != "save":
                    raise RuntimeError(f"fact encoding was refused by the connector: {result}")
        keys = [p.slab_key for p in plans]
        for rank, resident in enumerate(self._llm.collective_rpc("inferscale_resident",
                                                                 args=(keys,))):
            if not all(resident):
                raise RuntimeError(f"worker {rank} did not capture {resident.count(False)} facts")
        self.counters["encoded_facts"] += len(plans)

    def _preamble_key(self, messages: Messages) -> tuple[int, tuple[int, ...]]:
        """Slab key of the preamble for these messages' system prompt (encoded on first use)."""
        preamble = self.prompts.preamble(messages)
        digest = token_digest(preamble)
        key = self._preambles.get(digest)
        if key is None:
            key, self._next_slab_key = self._next_slab_key, self._next_slab_key + 1
            pages = self._allocator.allocate(len(preamble))
            plan = SavePlan(SYSTEM_OWNER, key, 0, preamble, pages).signed(self._secret)
            self._run_saves([plan], [list(preamble)])
            self._preambles[digest] = key
        return key, preamble

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
        from vllm import SamplingParams, TokensPrompt

        if mode not in ("kv", "text"):
            raise InvalidRequestError(f"mode must be 'kv' or 'text', got {mode!r}")
        sampling = sampling or SamplingParams(max_tokens=64, temperature=0.0)
        if not isinstance(sampling, SamplingParams):
            raise InvalidRequestError("sampling must be a vllm.SamplingParams, got "
                                      f"{type(sampling).__name__}")
        prompts, params, token_lists = [], [], []
        with self._lock:  # held through the run: vllm.LLM is not thread-safe
            self._check_open()
            for handle, messages in requests:
                prompt, plan = self._prepare(handle, _as_messages(messages))
                ids = prompt.token_ids()
                if len(ids) >= self.config.max_model_len:
                    raise InvalidRequestError(
                        f"prompt of {len(ids)} tokens exceeds max_model_len="
                        f"{self.config.max_model_len}; retrieve fewer facts")
                request_params = sampling.clone()
                if mode == "kv" and plan is not None:
                    request_params.extra_args = {**(request_params.extra_args or {}),
                                                 "kv_transfer_params": plan.to_params()}
                    prompts.append(TokensPrompt(prompt_token_ids=ids, cache_salt=plan.cache_salt))
                else:
                    prompts.append(TokensPrompt(prompt_token_ids=ids))
                params.append(request_params)
                token_lists.append(ids)
            start = time.perf_counter()
            outputs = self._run(prompts, params, use_tqdm=False)
            latency_ms = (time.perf_counter() - start) * 1e3
        results = [_generation(out, mode, len(ids), latency_ms)
                   for out, ids in zip(outputs, token_lists)]
        for g in results:
            self.counters[f"requests_{g.mode}"] += 1
            if g.mode == "kv" and g.plan_status not in ("inject", "none"):
                self.counters[f"fallback_{g.plan_status}"] += 1
        return results

    def _run(self, prompts: list[Any], params: list[Any], use_tqdm: bool) -> list[Any]:
        """llm.generate; if it fails, abort what it left in the engine so it keeps serving."""
        try:
            return self._llm.generate(prompts, params, use_tqdm=use_tqdm)
        except BaseException:
            engine = self._llm.llm_engine
            states = getattr(getattr(engine, "output_processor", None), "request_states", {})
            if states:
                engine.abort_request(list(states))
            while engine.has_unfinished_requests():
                engine.step()
            raise

    def _prepare(self, handle: MemoryHandle | None, messages: Messages
                 ) -> tuple[MemoryPrompt, InjectionPlan | None]:
        stored = self._resolve(handle)
        preamble_key, preamble = self._preamble_key(messages)
        prompt = self.prompts.build(messages, [s.fact.token_ids for s in stored])
        if prompt.preamble != preamble:
            raise UnsupportedModelError("the chat template renders the system message "
                                        "differently per conversation; KV mode is unavailable")
        if handle is None:
            return prompt, None
        segments = [Segment(preamble_key, 0, preamble)]
        segments += [Segment(s.slab_key, start, s.fact.token_ids)
                     for s, start in zip(stored, prompt.fact_starts())]
        salt = hashlib.sha256(
            f"{handle.user_id}|{[s.slab_key for s in segments]}".encode()).hexdigest()[:32]
        plan = InjectionPlan(handle.user_id, tuple(segments), salt).signed(self._secret)
        return prompt, plan

    def _resolve(self, handle: MemoryHandle | None) -> list[_Stored]:
        """Facts of a handle, in handle order; refuses foreign or unknown facts."""
        if handle is None:
            return []
        if not isinstance(handle, MemoryHandle):
            raise HandleError(f"expected a MemoryHandle, got {type(handle).__name__}")
        _check_user(handle.user_id)
        out = []
        for fact_id in handle.fact_ids:
            item = self._facts.get(fact_id)
            if item is None:
                raise FactNotFoundError(f"fact {fact_id} does not exist (deleted or never added)")
            if item.fact.user_id != handle.user_id:
                self.counters["foreign_handles"] += 1
                raise HandleError(f"fact {fact_id} does not belong to user "
                                  f"{handle.user_id!r}; a handle may only name its own user's "
                                  "facts")
            out.append(item)
        return out

    # ---- management --------------------------------------------------------------------
    def get_facts(self, user_id: str) -> list[Fact]:
        """All facts of a user, oldest first."""
        with self._lock:
            return [s.fact for s in self._facts.values() if s.fact.user_id == user_id]

    def delete(self, user_id: str, fact_ids: Sequence[FactId]) -> None:
        """Delete facts and free their slab pages.

        Raises:
            FactNotFoundError / HandleError: an id is unknown or another user's; nothing is
                deleted.
        """
        with self._lock:
            self._check_open()
            items = self._resolve(MemoryHandle(user_id, tuple(fact_ids)))
            self._llm.collective_rpc("inferscale_free", args=([s.slab_key for s in items],))
            for item in items:
                self._allocator.free(item.pages)
                del self._facts[item.fact.fact_id]

    def stats(self) -> EngineStats:
        """App-side and per-worker counters."""
        with self._lock:
            workers = self._llm.collective_rpc("inferscale_stats")
            return EngineStats(len(self._facts), self._allocator.num_free_pages, workers,
                               dict(self.counters))

    @property
    def llm(self) -> Any:
        """The underlying vllm.LLM (for advanced use and tests)."""
        return self._llm

    def close(self) -> None:
        """Shut the vLLM engine down and free its memory; the object is unusable afterwards."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            engine = self._llm.llm_engine
            shutdown = getattr(engine, "shutdown", None) or getattr(
                getattr(engine, "engine_core", None), "shutdown", None)
            if shutdown is not None:
                shutdown()
            del self._llm, engine
            _release_vllm_process_state()

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the engine was closed; build a new Engine")

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _release_vllm_process_state() -> None:
    """Free what an in-process (MP=0) vLLM engine leaves behind so another can start.

    vLLM freezes the garbage collector after start-up and keeps a process-global KV connector
    and distributed state; without this, GPU memory and the connector outlive the engine.
    """
    import gc

    try:
        from vllm.distributed.kv_transfer import ensure_kv_transfer_shutdown
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    except ImportError:  # pragma: no cover - other vLLM layouts
        gc.unfreeze()
        gc.collect()
        return
    ensure_kv_transfer_shutdown()
    cleanup_dist_env_and_memory()


def _as_messages(messages: Messages | str) -> Messages:
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    if not isinstance(messages, Sequence) or not messages:
        raise InvalidRequestError("messages must be a non-empty list of role/content dicts or "
                                  "a question string")
    return messages


def _check_user(user_id: object) -> None:
    if not isinstance(user_id, str) or not user_id.strip():
        raise HandleError(f"user_id must be a non-empty string, got {user_id!r}")


def _generation(out: Any, mode: str, num_prompt_tokens: int, latency_ms: float) -> Generation:
    completion = out.outputs[0]
    logprobs: tuple[float, ...] = ()
    first: dict[int, float] = {}
    if completion.logprobs:
        logprobs = tuple(step[tok].logprob for step, tok in zip(completion.logprobs,
                                                                 completion.token_ids))
        first = {tok: lp.logprob for tok, lp in completion.logprobs[0].items()}
    result = (out.kv_transfer_params or {}).get(_RESULT_KEY, {})
    status = result.get("status", "none")
    injected = int(result.get("claimed", 0)) if status == "inject" else 0
    return Generation(completion.text, tuple(completion.token_ids), logprobs, first, mode,
                      num_prompt_tokens, injected, int(out.num_cached_tokens or 0), status,
                      latency_ms)


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


def _dtype_size(hf_config: Any, config: EngineConfig) -> int:
    name = config.dtype
    if name == "auto":
        name = str(getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
                   or "bfloat16").replace("torch.", "")
    return 4 if name == "float32" else 2


def _kv_bytes_per_token(hf_config: Any, config: EngineConfig) -> int:
    """Bytes one token takes in one worker's slab (keys + values, all layers)."""
    heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or (
        hf_config.hidden_size // hf_config.num_attention_heads)
    heads_per_rank = max(1, heads // config.tensor_parallel_size)
    return 2 * hf_config.num_hidden_layers * heads_per_rank * head_dim * _dtype_size(
        hf_config, config)


def _build_llm(config: EngineConfig, connector: ConnectorConfig) -> Any:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if config.multiprocessing else "0"
    from vllm import LLM
    from vllm.config import KVTransferConfig
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    kwargs: dict[str, Any] = dict(
        model=config.model,
        tokenizer=config.tokenizer or config.model,
        dtype=config.dtype,
        max_model_len=config.max_model_len,
        enforce_eager=on_cpu if config.enforce_eager is None else config.enforce_eager,
        enable_prefix_caching=config.enable_prefix_caching,
        tensor_parallel_size=config.tensor_parallel_size,
        load_format=config.load_format,
        seed=config.seed,
        kv_transfer_config=KVTransferConfig(
            kv_connector="InferScaleConnector",
            kv_connector_module_path="inferscale_engine.connector",
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config=connector.to_dict(),
        ),
        worker_extension_cls="inferscale_engine.control.SlabControl",
    )
    if on_cpu:
        kwargs["kv_cache_memory_bytes"] = config.kv_cache_memory_bytes or 2**30
    elif config.kv_cache_memory_bytes:
        kwargs["kv_cache_memory_bytes"] = config.kv_cache_memory_bytes
    else:
        kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization
    for name in ("block_size", "max_num_batched_tokens", "max_num_seqs"):
        if getattr(config, name) is not None:
            kwargs[name] = getattr(config, name)
    kwargs.update(config.vllm_overrides)
    return LLM(**kwargs)
