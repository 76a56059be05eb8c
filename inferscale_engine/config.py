"""EngineConfig (what the app sets) and ConnectorConfig (what the connector is told)."""

from __future__ import annotations

import os
import secrets
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from inferscale_engine.errors import ConfigError
from inferscale_engine.prompting.layout import QUALITY_LAYOUT, USER_BLOCK_HEADER, Layout

_DTYPES = ("auto", "float32", "bfloat16", "float16")
DEFAULT_SYSTEM_PROMPT = "Memory (facts about the user, from earlier conversations):\n"
"""Heads the memory block, after the app's own system message if it has one. Only a header: an
instruction such as "answer in a few words" made Qwen2.5-0.5B answer with the wrong fact
("What am I allergic to?" -> "Pepper"); this header answered all four demo questions."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How to build an Engine. Every field has a safe default except the model."""

    model: str
    """Local model folder (a Hugging Face layout) or a name vLLM can resolve."""
    tokenizer: str | None = None
    """Tokenizer folder; defaults to `model`."""
    dtype: str = "auto"
    """Model and KV dtype: auto, float32, bfloat16 or float16."""
    kv_cache_dtype: str = "auto"
    """vLLM's paged KV cache: 'auto' (the model dtype) or fp8 ('fp8' = 'fp8_e4m3', 'fp8_e5m2'
    where the backend has it): twice the tokens per GiB. The slab keeps the model dtype;
    injected KV is quantized by vLLM's own cache write, as the model's own is."""
    max_model_len: int = 4096
    """Longest prompt + answer, in tokens."""
    slab_capacity_bytes: int = 256 * 2**20
    """Bytes of fact KV kept by each worker (all layers, keys + values)."""
    slab_page_tokens: int = 16
    """Tokens per slab page (allocation granularity)."""
    context_window_tokens: int = 256
    """W: tokens of preceding conversation each fact is encoded after (0 = encode alone).
    More context per fact is the strongest quality lever (docs/benchmarks.md: the defaults'
    figures); with runs (context_run_tokens) it costs little at ingest."""
    context_run_tokens: int = 512
    """R: facts added together (Memory.add(texts=[...])) are encoded in runs of up to R fact
    tokens, one save request per run: a run's first fact sees the W tokens before it, every
    later one those and the run's facts before it (W to W + R tokens of context). 0: each
    fact is encoded on its own after exactly its last W tokens (prompting/contexts.py). Runs
    ingest several times faster than facts encoded alone (docs/benchmarks.md)."""
    context_source: str = "similar"
    """What a fact added as text (Memory.add(texts=[...])) is encoded after: 'similar', the
    user's earlier facts most similar to it (by embedding, up to W tokens, in the order they
    were added; one save request per fact), or 'recent', the facts right before it (in runs of
    R). A fact served next to other retrieved facts is closest to its text-mode self after
    facts like them, at a higher ingest cost (docs/benchmarks.md: the defaults' figures).
    Facts of a conversation's turns are encoded after the session's turns either way."""
    max_fact_tokens: int = 256
    """Longest fact accepted, in tokens."""
    max_pinned_tokens: int = 512
    """Tokens of one user's pinned facts (Memory.add(pinned=True), Engine.pin), at most; also
    at most half of max_model_len. Every prompt of the user carries them. 0: no pinning."""
    max_pinned_slab_fraction: float = 0.5
    """Share of each engine's slab pages that pinned facts (of all its users) may hold: their
    KV is never evicted, so the rest stays for retrieved facts."""
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    """System text that precedes the memory block; its KV is the preamble."""
    user_block_header: str = USER_BLOCK_HEADER
    """First line of the repaired facts' block in the user turn (Layout placement 'user');
    word it to continue system_prompt (a small model reads a block it cannot place as facts
    about somebody else)."""
    kv_cache_memory_bytes: int | None = None
    """vLLM paged KV cache size; None = 1 GiB on CPU, gpu_memory_utilization on GPU."""
    gpu_memory_utilization: float = 0.85
    """Fraction of GPU memory vLLM may use (GPU only)."""
    block_size: int | None = None
    """Paged KV block size; None = vLLM's default for the platform."""
    max_num_batched_tokens: int | None = None
    """Chunked-prefill budget per step; None = vLLM's default."""
    max_num_seqs: int | None = None
    """Concurrent sequences per step; None = vLLM's default."""
    enforce_eager: bool | None = None
    """Disable torch.compile / CUDA graphs; None = eager on CPU, compiled on GPU."""
    multiprocessing: bool = False
    """Run vLLM's EngineCore in its own process (VLLM_ENABLE_V1_MULTIPROCESSING=1)."""
    plan_handoff: bool = True
    """With EngineCore in this process, hand plans to the connector by reference instead of
    signing and encoding them (inferscale_engine.protocol.handoff; the prompt is still checked)."""
    enable_prefix_caching: bool = True
    """vLLM prefix caching (text mode uses it; injected prompts carry a cache_salt)."""
    tensor_parallel_size: int = 1
    """Tensor parallel ranks; each holds its own KV heads in its slab."""
    data_parallel_size: int = 1
    """vLLM engines (data parallelism; `inferscale serve --data-parallel-size`, vLLM's
    AsyncLLM): each user is pinned to one engine by a stable hash of the user id, and that
    engine's slab holds the user's facts (inferscale_engine.runtime.shards)."""
    load_format: str = "auto"
    """vLLM load format; 'dummy' for timing runs without weights."""
    seed: int = 0
    """Sampling seed of the engine."""
    save_batch_size: int = 256
    """Facts encoded per vLLM generate call on the write path."""
    key_origin: str = "encoded"
    """Stored keys keep the rotation of their encoding positions ('encoded', default) or are
    rotated to canonical positions 0..n-1 at capture ('zero': one more rounding per token)."""
    on_slab_full: str = "evict"
    """'evict': make room by evicting the least recently used facts' KV (facts stay known and
    are re-encoded when needed); 'error': raise SlabFullError."""
    on_evicted: str = "reencode"
    """A request names facts whose KV left the slab: bring it back first (from host RAM or
    disk, else by encoding them again: 'reencode'), or serve the request in 'text' mode."""
    host_tier_bytes: int | None = None
    """Pinned host RAM per worker for fact KV evicted from the slab (the warm tier): a fact
    there comes back by a copy, not a prefill. None: a quarter of the RAM available at start,
    at most 4x slab_capacity_bytes; 0: no host tier."""
    disk_tier_path: str | None = None
    """Folder of the cold tier: every encoded fact's KV is written there (one safetensors file
    per fact and tensor-parallel rank) and loaded instead of re-encoded, after eviction and
    after a restart. None: no disk tier."""
    key_scale: float | tuple[float, ...] = 1.0
    """Key temperature: stored fact keys are scaled by this (one value, or one per layer) when
    encoded; 1.0 keeps them exact. Fit one with `inferscale calibrate`."""
    calibration: str | None = None
    """A file from `inferscale calibrate`: its key_scale is used (refused if it was fitted
    for another model). Give this or key_scale, not both."""
    layout: Layout = QUALITY_LAYOUT
    """Where facts go in prompts and which are repaired as text (see layout.Layout); a
    request may pass its own. Default: the 2 facts most relevant to the query are prefilled
    as text right before the question, the rest injected (layout.QUALITY_LAYOUT);
    Layout() injects every fact (fastest, lower answer quality)."""
    vllm_overrides: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for vllm.LLM (for settings not covered above)."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError("EngineConfig.model must be a model folder or name, got "
                              f"{self.model!r}")
        if self.dtype not in _DTYPES:
            raise ConfigError(f"dtype {self.dtype!r} is not supported; use one of {_DTYPES}")
        _positive(self, "max_model_len", "slab_capacity_bytes", "slab_page_tokens",
                  "max_fact_tokens", "save_batch_size", "tensor_parallel_size",
                  "data_parallel_size")
        for name in ("context_window_tokens", "context_run_tokens", "host_tier_bytes",
                     "max_pinned_tokens"):
            value = getattr(self, name)
            if name == "host_tier_bytes" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be an int >= 0, got {value!r}")
        if self.disk_tier_path is not None and (not isinstance(self.disk_tier_path, str)
                                                or not self.disk_tier_path.strip()):
            raise ConfigError(f"disk_tier_path must be a folder path or None, got "
                              f"{self.disk_tier_path!r}")
        if isinstance(self.max_pinned_slab_fraction, bool) or not isinstance(
                self.max_pinned_slab_fraction, int | float) or not (
                0.0 <= self.max_pinned_slab_fraction <= 1.0):
            raise ConfigError(f"max_pinned_slab_fraction must be a number in [0, 1], got "
                              f"{self.max_pinned_slab_fraction!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got "
                              f"{self.gpu_memory_utilization}")
        if (self.max_fact_tokens + self.context_window_tokens + self.context_run_tokens
                >= self.max_model_len):
            raise ConfigError(
                f"max_fact_tokens + context_window_tokens + context_run_tokens ("
                f"{self.max_fact_tokens} + {self.context_window_tokens} + "
                f"{self.context_run_tokens}) must be below max_model_len ({self.max_model_len}): "
                "a save prompt holds them all; lower one of them")
        for name, allowed in (("kv_cache_dtype", ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")),
                              ("key_origin", ("encoded", "zero")),
                              ("context_source", ("similar", "recent")),
                              ("on_slab_full", ("evict", "error")),
                              ("on_evicted", ("reencode", "text"))):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        scales = self.key_scale if isinstance(self.key_scale, tuple) else (self.key_scale,)
        if not scales or not all(isinstance(v, int | float) and not isinstance(v, bool)
                                 and 0 < v < 100 for v in scales):
            raise ConfigError(f"key_scale={self.key_scale!r} must be a positive number or a "
                              "tuple of one per layer")
        if self.calibration is not None and self.key_scale != 1.0:
            raise ConfigError("give calibration (a fitted key scale) or key_scale, not both")
        if not isinstance(self.user_block_header, str) or not self.user_block_header.strip():
            raise ConfigError(f"user_block_header must be a non-empty string, got "
                              f"{self.user_block_header!r}")
        if not isinstance(self.layout, Layout):
            raise ConfigError(f"layout must be an inferscale_engine.prompting.layout.Layout, got "
                              f"{type(self.layout).__name__}")
        reserved = {"model", "tokenizer", "kv_transfer_config", "worker_extension_cls"}
        if clash := reserved & set(self.vllm_overrides):
            raise ConfigError(f"vllm_overrides may not set {sorted(clash)}: the engine owns them")


SECRET_ENV = "INFERSCALE_PLAN_SECRET"
"""Environment variable holding the plans' MAC key (hex). Kept out of vLLM's config, which is
logged; inherited by vLLM's worker processes."""

DISK_KEY_ENV = "INFERSCALE_DISK_KEY"
"""Environment variable holding the disk tier's MAC key (64 hex digits). Set it to share one
key between hosts; otherwise the engine keeps the key in the tier's folder (DISK_KEY_FILE)
and puts it here for vLLM's workers."""

DISK_MAC_KEY_ENV = "INFERSCALE_DISK_MAC_KEY"
"""The key the engine resolved (DISK_KEY_ENV or the key file), as vLLM's workers read it."""

DISK_KEY_FILE = ".inferscale-disk-key"
"""The disk tier's key file (0600, in its 0700 folder) when DISK_KEY_ENV is not set."""


@dataclass(frozen=True, slots=True)
class ConnectorConfig:
    """What the connector needs, sent through kv_connector_extra_config (JSON types only)."""

    slab_pages: int
    """Slab capacity in pages."""
    page_tokens: int
    """Tokens per slab page."""
    max_positions: int
    """Size of the RoPE tables (max_model_len)."""
    key_origin: str = "encoded"
    """Rotation stored keys keep: 'encoded' (the positions they were encoded at: one rounding
    when moved, bit-exact when not) or 'zero' (rotated to 0..n-1 at capture)."""
    host_pages: int = 0
    """Pages of the host-RAM tier (0: none)."""
    disk_path: str | None = None
    """Folder of the disk tier (None: none)."""

    def __post_init__(self) -> None:
        _positive(self, "slab_pages", "page_tokens", "max_positions")
        if isinstance(self.host_pages, bool) or not isinstance(self.host_pages, int) or (
                self.host_pages < 0):
            raise ConfigError(f"host_pages must be an int >= 0, got {self.host_pages!r}")
        if self.key_origin not in ("encoded", "zero"):
            raise ConfigError(f"key_origin must be 'encoded' or 'zero', got {self.key_origin!r}")

    @property
    def secret(self) -> bytes:
        """MAC key of plans, from the environment (see SECRET_ENV)."""
        value = os.environ.get(SECRET_ENV, "")
        try:
            secret = bytes.fromhex(value)
        except ValueError:
            secret = b""
        if len(secret) < 16:
            raise ConfigError(f"{SECRET_ENV} must hold a hex key of at least 16 bytes; start "
                              "vLLM through inferscale_engine.Engine, or set it to the same "
                              "value in the app and in vLLM's environment")
        return secret

    def to_dict(self) -> dict[str, Any]:
        """As kv_connector_extra_config."""
        return {"inferscale": asdict(self)}

    @classmethod
    def from_dict(cls, extra: dict[str, Any]) -> ConnectorConfig:
        """Parse kv_connector_extra_config; unknown keys are an error."""
        raw = extra.get("inferscale")
        if not isinstance(raw, dict):
            raise ConfigError("kv_connector_extra_config needs an 'inferscale' mapping; build "
                              "the engine with inferscale_engine.Engine")
        known = {f.name for f in fields(cls)}
        if unknown := set(raw) - known:
            raise ConfigError(f"unknown connector options {sorted(unknown)}; known: "
                              f"{sorted(known)}")
        try:
            return cls(**raw)
        except TypeError as exc:
            raise ConfigError(f"connector options incomplete: {exc}") from None


def _positive(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{type(obj).__name__}.{name} must be a positive int, got {value!r}")


def plan_secret() -> bytes:
    """The process's plan MAC key: taken from SECRET_ENV, or generated and put there."""
    if not os.environ.get(SECRET_ENV):
        os.environ[SECRET_ENV] = secrets.token_hex(32)
    return bytes.fromhex(os.environ[SECRET_ENV])
