"""The index's inputs: fact ids and embeddings checked, moved to the device, read back.

Every check raises RetrievalError naming what was wrong; a query's validity is read with the
search's one device transfer (fetch), not with a sync of its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from inferscale_engine.errors import RetrievalError


def index_fact_ids(fact_ids: object) -> list[int]:
    """Fact ids given to the index as a list of ints (RetrievalError otherwise)."""
    if hasattr(fact_ids, "tolist"):  # numpy array or torch tensor
        fact_ids = fact_ids.tolist()
    if isinstance(fact_ids, str | bytes) or not isinstance(fact_ids, Iterable):
        raise RetrievalError(f"fact_ids must be a list of ints, got {fact_ids!r:.80}")
    ids = []
    for fact_id in fact_ids:
        if isinstance(fact_id, bool) or not isinstance(fact_id, int | np.integer):
            raise RetrievalError(f"fact_ids hold {fact_id!r:.40}, not an int; pass the ids "
                                 "add_facts returned")
        ids.append(int(fact_id))
    return ids


def to_tensor(embeddings: Any, device: torch.device, what: str) -> torch.Tensor:
    """Embeddings (a tensor, array, list of vectors) as float32 on `device`."""
    try:
        if isinstance(embeddings, list | tuple) and embeddings and all(
                isinstance(e, torch.Tensor) for e in embeddings):
            embeddings = torch.stack([e.to(device, torch.float32) for e in embeddings])
        elif not isinstance(embeddings, torch.Tensor):
            embeddings = np.asarray(embeddings, dtype=np.float32)
        return torch.as_tensor(embeddings, dtype=torch.float32, device=device)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise RetrievalError(f"{what} is not a float matrix ({exc})") from None


def as_matrix(embeddings: Any, num_rows: int, dim: int, device: torch.device,
               what: str = "embeddings") -> torch.Tensor:
    """Validated, L2-normalized float32 [num_rows, dim] on `device`."""
    matrix = shaped(to_tensor(embeddings, device, what), (num_rows, dim), what)
    norms = matrix.norm(dim=1)
    raise_if_invalid(bool(torch.isfinite(norms).all() and (norms != 0).all()), what)
    return F.normalize(matrix, dim=1)


def query_vector(embedding: Any, dim: int, device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """A query [dim] (or [1, dim]) L2-normalized, and its norm, without a device sync.

    The norm (0-dim, on `device`) is read with the search's one transfer: the query is valid when
    it is finite and not 0 (is_valid_norm).
    """
    what = "query_embedding"
    matrix = to_tensor(embedding, device, what)
    vector = shaped(matrix.unsqueeze(0) if matrix.ndim == 1 else matrix, (1, dim), what)[0]
    norm = vector.norm()
    return vector / norm, norm


def is_valid_norm(norm: float) -> bool:
    """A query's norm: NaN or inf when a component is, 0 for the zero vector."""
    return math.isfinite(norm) and norm != 0


def shaped(matrix: torch.Tensor, shape: tuple[int, int], what: str) -> torch.Tensor:
    """`matrix`, if it has `shape` (RetrievalError otherwise)."""
    if tuple(matrix.shape) != shape:
        raise RetrievalError(f"{what} have shape {tuple(matrix.shape)}, expected {shape}; use "
                             "the embedder this index was built with")
    return matrix


def fetch(vectors: tuple[torch.Tensor, ...], *tail: torch.Tensor
           ) -> tuple[list[float], ...]:
    """Tensors as lists of floats, in one transfer.

    Each of `vectors` (1-d, equal lengths) as a list, then the values of the `tail` tensors
    (0-dim or not) in one list. The search's only device sync; float64 holds every row index
    exactly.
    """
    flat = torch.cat((*(v.double() for v in vectors), *(s.double().reshape(-1) for s in tail)))
    values = flat.tolist()
    n = len(vectors[0])
    return (*(values[i * n:(i + 1) * n] for i in range(len(vectors))), values[len(vectors) * n:])


def raise_if_invalid(valid: bool, what: str) -> None:
    """RetrievalError unless `valid` (the vectors were finite and not zero)."""
    if not valid:
        raise RetrievalError(f"{what} contain NaN, inf or an all-zero vector; check the embedder")
