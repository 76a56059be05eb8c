"""The one served model every arm of peers.py answers with, and how an answer is timed.

`inferscale serve` in a child process (tests/server/process.py), on 127.0.0.1 without keys.
Requests that name no user are served without memory: mem0's LLM calls and the answers of the
arms that paste their memories as text. InferScale's kv arm names its user and memory.k.
An answer is one streamed chat completion (greedy, the same max_tokens for every arm):
  ttft_s   request sent -> first SSE chunk with a choice (vLLM sends none before the first token)
  total_s  request sent -> the stream's end
  usage    prompt_tokens and prompt_tokens_details.cached_tokens (--enable-prompt-tokens-details)
The prefix cache is shared by all requests, so two arms pasting the same facts for the same
question would hit each other's blocks: flush() fills the whole KV cache with unique filler
between arms (the cache's LRU then evicts every earlier block).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


@dataclass(slots=True)
class Reply:
    """One streamed answer."""

    text: str = ""
    ttft_s: float | None = None
    total_s: float | None = None
    num_prompt_tokens: int | None = None
    num_cached_tokens: int | None = None
    num_answer_tokens: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    error: str | None = None


def bytes_per_token(model_folder: str, dtype: str) -> int:
    """KV cache bytes per token of a model (all layers, K and V)."""
    config = json.loads((Path(model_folder) / "config.json").read_text())
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads", heads)
    width = 4 if dtype == "float32" else 2
    return int(config["num_hidden_layers"] * 2 * kv_heads * head_dim * width)


def start_server(folder: str, dtype: str, workdir: Path, *, max_model_len: int,
                 kv_cache_bytes: int, slab_mib: int, extra: list[str], embedder: str,
                 gpu: dict[str, Any] | None = None) -> Any:
    """`inferscale serve` with a sized KV cache, its InferScale defaults kept: eager on the
    CPU; on a GPU (`gpu`: load_format, gpu_memory_utilization, cudagraph_sizes) with vLLM's
    CUDA graphs."""
    from benchmarks.common import compilation_overrides
    from tests.server.process import ServerProcess

    if gpu is None:
        device = ["--enforce-eager"]
    else:
        graphs = compilation_overrides(gpu["cudagraph_sizes"])["compilation_config"]
        device = ["--load-format", gpu["load_format"], "--gpu-memory-utilization",
                  str(gpu["gpu_memory_utilization"]), "--compilation-config",
                  json.dumps(graphs)]
    sizing = [*device, "--dtype", dtype, "--max-model-len", str(max_model_len),
              "--kv-cache-memory-bytes", str(kv_cache_bytes), "--slab-mib", str(slab_mib),
              "--embedding-model", embedder, "--enable-prompt-tokens-details", *extra]
    workdir.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(workdir / "server.db", workdir / "server.log", model=folder,
                           sizing_args=sizing)
    return server.start(timeout_s=1200)


def served_model(client: httpx.Client) -> str:
    """The name the server serves its model under."""
    return str(client.get("/v1/models").json()["data"][0]["id"])


def stream_chat(client: httpx.Client, body: dict[str, Any], timeout_s: float) -> Reply:
    """One streamed chat completion, timed; an HTTP error or timeout is returned, not raised."""
    reply, pieces = Reply(), []
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    try:
        with client.stream("POST", "/v1/chat/completions", json=body,
                           timeout=timeout_s) as response:
            reply.headers = {k: v for k, v in response.headers.items()
                             if k.lower().startswith("x-inferscale") or k.lower() ==
                             "server-timing"}
            if response.status_code != 200:
                response.read()
                reply.error = f"HTTP {response.status_code}: {response.text[:300]}"
                return reply
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices"):
                    if reply.ttft_s is None:
                        reply.ttft_s = time.perf_counter() - start
                    pieces.append(chunk["choices"][0].get("delta", {}).get("content") or "")
                if chunk.get("usage"):
                    usage = chunk["usage"]
                    reply.num_prompt_tokens = usage.get("prompt_tokens")
                    reply.num_answer_tokens = usage.get("completion_tokens")
                    details = usage.get("prompt_tokens_details") or {}
                    reply.num_cached_tokens = details.get("cached_tokens")
    except httpx.HTTPError as exc:
        reply.error = f"{type(exc).__name__}: {exc}"[:300]
    reply.total_s = time.perf_counter() - start
    reply.text = "".join(pieces)
    return reply


def flush(client: httpx.Client, model: str, capacity_tokens: int, max_model_len: int,
          seed: str) -> int:
    """Fill the KV cache with unique digits (one token each in byte-level BPE vocabularies
    that split numbers into digits, as Qwen2's does) until capacity_tokens are prefilled;
    the number of tokens sent."""
    rng, sent = random.Random(f"flush/{seed}"), 0
    while sent < capacity_tokens * 1.05:
        size = int(min(max_model_len - 64, capacity_tokens * 1.05 - sent + 64) * 0.9)
        digits = "".join(rng.choice("0123456789 ") for _ in range(max(size, 64)))
        reply = stream_chat(client, {"model": model, "max_tokens": 1, "temperature": 0.0,
                                     "messages": [{"role": "user", "content": digits}]},
                            timeout_s=1800)
        if reply.error or not reply.num_prompt_tokens:
            raise RuntimeError(f"prefix-cache flush failed: {reply.error}")
        sent += reply.num_prompt_tokens
    return sent
