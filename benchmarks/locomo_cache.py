"""Cache of text-arm answers, so each kv arm (each repair, each window) pays only for itself.

A text answer depends only on the model, the numerics (dtype, device, vLLM version), the exact
prompt token ids and the sampling settings. The key hashes all of those, plus the question id,
k, the layout name, the arm's engine options and the system prompt (already inside the token
ids; kept explicit so a key never collides across prompt variants). One JSON object per line:
{"key": ..., "generation": {...}, "about": {...}} ("about" is for people, not part of the key).
Question texts are not stored (the LoCoMo data is never copied).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import open_text

CACHE_VERSION = 1
"""Bump when what a cached generation holds changes."""


def text_cache_key(*, model: Mapping[str, Any], question_id: str, k: int,
                   prompt_token_ids: Sequence[int], layout: str, options: Mapping[str, Any],
                   system_prompt: str, sampling: Mapping[str, Any]) -> str:
    """sha256 of everything a text answer depends on.

    Args:
        model: what fixes the weights and numerics, e.g. name, weights digest, dtype, device,
            vLLM version.
        question_id: 'conv-26/17'.
        prompt_token_ids: the exact prompt vLLM is sent.
        options: the arm's engine call options.
        sampling: every SamplingParams field set (max_tokens, temperature, logprobs, ...).
    """
    payload = {"version": CACHE_VERSION, "model": dict(model), "question": question_id,
               "k": k, "prompt": [int(t) for t in prompt_token_ids], "layout": layout,
               "options": dict(options), "system_prompt": system_prompt,
               "sampling": dict(sampling)}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


class TextAnswerCache:
    """An append-only JSONL file of generations by key; None path = no cache (all misses)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._entries: dict[str, dict[str, Any]] = {}
        self.hits = 0
        self.misses = 0
        if path is not None and path.exists():
            with open_text(path) as lines:
                for line in lines:
                    try:
                        entry = json.loads(line)
                    except json.JSONDecodeError:  # a line cut short by a killed run
                        continue
                    self._entries[entry["key"]] = entry["generation"]

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, *aliases: str) -> dict[str, Any] | None:
        """The cached generation under `key` (or the first of `aliases` found: keys an earlier
        version wrote for the same answer), or None (counted as a hit or a miss)."""
        found = next((self._entries[k] for k in (key, *aliases) if k in self._entries), None)
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    def put(self, key: str, generation: Mapping[str, Any],
            about: Mapping[str, Any] | None = None) -> None:
        """Store (and append to the file) one generation."""
        self._entries[key] = dict(generation)
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open_text(self.path, "a") as out:
            out.write(json.dumps({"key": key, "generation": dict(generation),
                                  "about": dict(about or {})}) + "\n")
