"""Generation and EngineStats: what the engine returns (plain data, no vLLM or torch import)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inferscale_engine.protocol.plan import PARAMS_KEY

RESULT_KEY = PARAMS_KEY + "_result"
"""Key of the connector's per-request verdict in RequestOutput.kv_transfer_params."""


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
    num_repaired_facts: int = 0
    """Facts of the handle prefilled as text after the injected ones (suffix repair)."""
    num_repaired_tokens: int = 0
    """Prompt tokens of those repaired facts."""
    fallback: str = ""
    """Why a kv request was served otherwise: '' (it was not), 'evicted' (facts could not be
    made resident: text mode), 'injection_error' (injection raised: answered as text),
    or the connector's verdict ('mismatch', 'rejected': vLLM prefilled the facts)."""
    num_stale_facts: int = 0
    """Facts of the handle deleted before it was served (left out)."""
    engine_times: tuple[float, float, float, float] | None = None
    """vLLM's engine-core clock (time.monotonic(), seconds; one clock for every process of a
    host) when the request was queued, first scheduled, produced its first token and its last
    one (needs disable_log_stats=False; None otherwise)."""
    finished: bool = True
    """False for the partial answers a stream yields before its last."""


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counters of the app side and of every worker's slab."""

    num_facts: int
    num_resident_facts: int
    num_free_pages: int
    workers: list[dict[str, int]] = field(default_factory=list)
    """One dict per worker: engine by engine (data parallelism), tensor-parallel ranks in
    order within an engine."""
    counters: dict[str, int] = field(default_factory=dict)
    data_parallel_size: int = 1
    """Engines the workers belong to (each holds its own users' facts)."""
    num_host_facts: int = 0
    """Facts whose KV waits in the host-RAM tier."""

    @property
    def worker_totals(self) -> dict[str, int]:
        """Worker counters over every engine and tensor-parallel rank.

        Within an engine errors are summed (a failure on any rank counts) and the rest is the
        least any rank reports (each rank holds its own KV heads of the same facts, so a fact
        or a token counts once it is on every rank); engines hold different facts, so their
        totals add up.
        """
        names = sorted({name for worker in self.workers for name in worker})
        size = max(1, len(self.workers) // max(1, self.data_parallel_size))
        engines = [self.workers[i:i + size] for i in range(0, len(self.workers), size)]
        return {name: sum((sum if name in _SUMMED else min)(w.get(name, 0) for w in engine)
                          for engine in engines) for name in names}


_SUMMED = frozenset({"load_errors", "capture_errors", "captures_refused_stale",
                     "disk_write_errors", "disk_corrupt", "disk_mismatch", "disk_stale"})


def from_output(out: Any, mode: str, num_prompt_tokens: int, latency_ms: float) -> Generation:
    """A Generation from one vLLM RequestOutput."""
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
    queued, scheduled, first_token, last_token = (
        float(getattr(metrics, name, 0.0) or 0.0)
        for name in ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts"))
    return Generation(completion.text, tuple(completion.token_ids), logprobs, first, mode,
                      num_prompt_tokens, injected, int(out.num_cached_tokens or 0), status,
                      latency_ms, first_token_s * 1e3 if first_token_s else None,
                      engine_times=(queued, scheduled, first_token, last_token)
                      if queued and scheduled and first_token and last_token else None,
                      finished=bool(getattr(out, "finished", True)))


def text_pieces(tokenizer: Any, generation: Generation) -> list[str]:
    """The answer as per-token text pieces whose concatenation is exactly its text.

    For streaming replays: vLLM's offline engine returns whole answers.
    """
    pieces, emitted = [], ""
    for end in range(1, len(generation.token_ids) + 1):
        prefix = tokenizer.decode(generation.token_ids[:end], skip_special_tokens=True)
        if prefix.endswith("\ufffd") or not generation.text.startswith(prefix):
            continue  # a partial UTF-8 sequence, or a stop string vLLM cut off
        if len(prefix) > len(emitted):
            pieces.append(prefix[len(emitted):])
            emitted = prefix
    if len(generation.text) > len(emitted):
        pieces.append(generation.text[len(emitted):])
    return pieces
