"""Helpers of the Memory tests: a fast deterministic embedder, short facts, engine settings."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import torch
import torch.nn.functional as F

from inferscale_engine.memory.search.embedder import Embedder

SHORT_SYSTEM_PROMPT = "Memory:\n"
"""A short preamble: fewer tokens per save request, so big tests encode faster."""


class HashEmbedder(Embedder):
    """Bag of hashed words and character trigrams, L2-normalized: instant and deterministic.

    For tests where retrieval quality is not the subject (isolation, durability, eviction);
    identical texts embed identically, so duplicate detection still works.
    """

    def __init__(self, dim: int = 64) -> None:
        super().__init__(f"test-hash-embedder-{dim}", device="cpu")
        self._hash_dim = dim

    @property
    def dim(self) -> int:
        return self._hash_dim

    def encode(self, texts):
        vectors = torch.zeros(len(texts), self._hash_dim)
        for row, text in enumerate(texts):
            words = re.findall(r"\w+", text.lower()) or [text]
            grams = [text[i:i + 3] for i in range(max(1, len(text) - 2))]
            for feature in words + grams:
                digest = hashlib.blake2b(feature.encode("utf-8", "surrogatepass"),
                                         digest_size=8).digest()
                index = int.from_bytes(digest[:4], "little") % self._hash_dim
                vectors[row, index] += 1.0 if digest[4] & 1 else -1.0
            if not vectors[row].any():
                vectors[row, 0] = 1.0
        return F.normalize(vectors, dim=-1)


class TableEmbedder(Embedder):
    """Each text of a table a fixed 3-d direction (cosines chosen by the test); any other
    text the last axis."""

    def __init__(self, vectors: dict[str, list[float]]) -> None:
        super().__init__("test-table-embedder", device="cpu")
        self.vectors = vectors

    @property
    def dim(self) -> int:
        return 3

    def encode(self, texts):
        return F.normalize(torch.tensor([self.vectors.get(t, [0.0, 0.0, 1.0]) for t in texts]),
                           dim=-1)


def crash_texts(count: int) -> list[str]:
    """`count` distinct short facts (at most 16 tokens each, as formatted: one slab page)."""
    from tests.tiny_model import _NAMES, _PLACES, _THINGS

    return [f"{_NAMES[n % 10]} {_THINGS[n // 10 % 15]} {n} {_PLACES[n // 150 % 10]}."
            for n in range(count)]


def crash_engine_config(model: Any, num_facts: int):
    """Engine settings of the crash test: a slab that holds every fact, a short preamble."""
    from tests.conftest import engine_config

    return engine_config(model, system_prompt=SHORT_SYSTEM_PROMPT,
                         slab_capacity_bytes=(num_facts + 64) * 16 * 4096)
