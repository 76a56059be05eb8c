"""The KV slab: fixed-capacity storage of fact KV inside each vLLM worker, and its allocator.

The slab is paged (`page_tokens` rows per page) so facts of any length pack without
fragmentation. Pages are allocated by the app (residency.SlabAllocator, deterministic, so every
tensor parallel rank agrees) and sent in the SavePlan; the worker only records who owns which
rows and which allocation last wrote each page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass(slots=True, eq=False)
class SlabEntry:
    """Where one fact's KV lives and who may read it (compared by identity: cheap lookups)."""

    owner: str
    rows: torch.Tensor
    """[num_tokens] int64 slab rows (CPU), token i of the fact in rows[i]."""
    num_tokens: int
    origin: int
    """Position whose rotation token 0's stored key carries (token i: origin + i)."""
    rows_bytes: bytes = field(init=False, repr=False, compare=False)
    """rows as int64 bytes, made once: a load joins its entries' bytes in one call."""
    canonical_bytes: bytes = field(init=False, repr=False, compare=False)
    """The position each token's stored key is rotated for (origin + i), as int64 bytes."""

    def __post_init__(self) -> None:
        self.rows_bytes = self.rows.numpy().astype(np.int64, copy=False).tobytes()
        self.canonical_bytes = np.arange(self.origin, self.origin + len(self.rows),
                                         dtype=np.int64).tobytes()


class KVSlab:
    """Per-worker storage: keys (canonical positions) and values of every attention layer."""

    def __init__(self, num_layers: int, num_pages: int, page_tokens: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device,
                 pin_memory: bool = False) -> None:
        """pin_memory: page-locked host memory (a host tier beside a CUDA slab)."""
        num_rows = num_pages * page_tokens
        self.page_tokens = page_tokens
        self.num_pages = num_pages
        self.keys = torch.zeros(num_layers, num_rows, num_kv_heads, head_dim, dtype=dtype,
                                device=device, pin_memory=pin_memory)
        """[L, num_rows, H, D]"""
        self.values = torch.zeros(num_layers, num_rows, num_kv_heads, head_dim, dtype=dtype,
                                  device=device, pin_memory=pin_memory)
        """[L, num_rows, H, D]"""
        self.entries: dict[int, SlabEntry] = {}
        self.page_keys = np.zeros(num_pages, dtype=np.int64)
        """Slab key of the last capture into each page (0: never written). Keys grow with every
        allocation, so a capture must carry a newer key than every page it writes."""

    def scale_keys_(self, rows: torch.Tensor, scale: list[float]) -> None:
        """Multiply the stored keys of `rows` by `scale` (one value, or one per layer).

        fp32 math, one rounding to the slab's dtype.
        """
        factor = torch.tensor(scale, dtype=torch.float32, device=self.keys.device)
        if factor.numel() not in (1, self.keys.shape[0]):
            raise ValueError(f"key_scale has {factor.numel()} values for {self.keys.shape[0]} "
                             "layers")
        index = rows.to(self.keys.device)
        scaled = self.keys[:, index].float() * factor.view(-1, 1, 1, 1)
        self.keys[:, index] = scaled.to(self.keys.dtype)

    def claim_pages(self, slab_key: int, pages: list[int]) -> list[int] | None:
        """Let `slab_key` write `pages` (claim_pages on this slab's entries)."""
        return claim_pages(self.entries, self.page_keys, slab_key, pages)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token takes across layers, keys and values."""
        k = self.keys
        return 2 * k.shape[0] * k.shape[2] * k.shape[3] * k.element_size()

    def rows_for(self, pages: list[int], num_tokens: int) -> torch.Tensor:
        """Rows of tokens 0..num_tokens-1 stored in `pages` ([num_tokens] int64, on the CPU)."""
        if len(pages) * self.page_tokens < num_tokens:
            raise ValueError(f"{len(pages)} pages cannot hold {num_tokens} tokens")
        if any(not 0 <= p < self.num_pages for p in pages):
            raise ValueError(f"page ids {pages} out of range [0, {self.num_pages})")
        page_ids = torch.tensor(pages, dtype=torch.int64)
        offsets = torch.arange(self.page_tokens, dtype=torch.int64)
        return (page_ids[:, None] * self.page_tokens + offsets[None, :]).flatten()[:num_tokens]

    def stats(self) -> dict[str, int]:
        """Entries, tokens and bytes stored."""
        tokens = sum(e.num_tokens for e in self.entries.values())
        return {
            "num_entries": len(self.entries),
            "num_tokens": tokens,
            "capacity_tokens": self.num_pages * self.page_tokens,
            "bytes_per_token": self.bytes_per_token,
            "capacity_bytes": self.num_pages * self.page_tokens * self.bytes_per_token,
        }


def claim_pages(entries: dict[int, Any], page_keys: np.ndarray, key: int, pages: list[int]
                ) -> list[int] | None:
    """Let allocation `key` write `pages` if it is newer than every page's last writer.

    Args:
        entries: key -> entry of the tier; entries whose pages are claimed are dropped.
        page_keys: [num_pages] int64, the key of the last allocation that wrote each page.

    Returns:
        The keys of entries those pages held (superseded: their rows are about to be
        overwritten, so they are dropped), or None if the claim must be refused: the key was
        written before, or a page has since been given to a newer allocation.
    """
    index = np.asarray(pages, dtype=np.int64)
    if key in entries or (page_keys[index] >= key).any():
        return None
    superseded = [int(k) for k in np.unique(page_keys[index]) if k in entries]
    for old in superseded:
        del entries[old]
    page_keys[index] = key
    return superseded
