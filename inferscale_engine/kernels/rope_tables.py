"""RopeTables: the one record of a model's RoPE that every KV mover takes.

The reference (reference.py), the Triton kernels (chunked_rope.py), the bound mover
(mover.py), the paged writers (connector/paged.py) and the worker (connector/worker.py) all
take one `RopeTables`, never its four parts as loose arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ROTATE_HALF = "rotate_half"
"""Pairs (i, i + R/2) rotate together (Llama, Qwen, most models)."""
INTERLEAVED = "interleaved"
"""Pairs (2i, 2i + 1) rotate together (GPT-J style)."""


@dataclass(frozen=True, slots=True)
class RopeTables:
    """fp32 cos/sin tables of a model's RoPE and how its dims pair up.

    One table for every layer: cos, sin [P, R // 2] and layer_tables None. Layers that rotate
    differently (Gemma 3's local and global layers): cos, sin [G, P, R // 2], one table per
    distinct RoPE, and layer_tables [L] int64 naming each layer's table. P table positions,
    R rotary_dim (<= head_dim). Built from the model's config by RopeSpec.tables
    (model/rope.py) or, per cache layer, by the worker.
    """

    cos: torch.Tensor
    sin: torch.Tensor
    style: str
    """ROTATE_HALF or INTERLEAVED."""
    layer_tables: torch.Tensor | None = None
    """[L] int64 index of each layer's table; only with [G, P, R // 2] tables."""

    @property
    def rotary_dim(self) -> int:
        """R: the leading dims of each head that rotate (the rest pass through)."""
        return 2 * self.cos.shape[-1]
