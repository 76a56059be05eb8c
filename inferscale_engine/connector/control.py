"""Worker extension: control calls the app makes on every worker via LLM.collective_rpc.

vLLM mixes this class into its worker (`worker_extension_cls`), so the methods run in the
process that owns the slab, with MP=0 and MP=1 alike. Arguments and results are plain types.
"""

from __future__ import annotations

from typing import Any

import torch


def _worker_half() -> Any:
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    worker = getattr(get_kv_transfer_group(), "worker", None)  # InferScaleConnector's half
    if worker is None or worker.slab is None:
        raise RuntimeError("InferScale connector is not initialized in this worker")
    return worker


class SlabControl:
    """Methods vLLM adds to its worker class; called as llm.collective_rpc("inferscale_*")."""

    def inferscale_stats(self) -> dict[str, int]:
        """Slab occupancy and worker counters."""
        return dict(_worker_half().stats())

    def inferscale_free(self, slab_keys: list[int]) -> int:
        """Drop slab entries; returns how many were resident."""
        return int(_worker_half().free(list(slab_keys)))

    def inferscale_rank(self) -> int:
        """The tensor-parallel rank of this worker."""
        from vllm.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())

    def inferscale_free_on_rank(self, slab_keys: list[int], rank: int) -> int:
        """Drop slab entries on one tensor-parallel rank only; returns how many existed.

        For fault drills: a rank that lost a fact reports its blocks and vLLM recomputes them.
        """
        return int(_worker_half().free(list(slab_keys))) if self.inferscale_rank() == rank else 0

    def inferscale_resident(self, slab_keys: list[int]) -> list[bool]:
        """Whether each slab key has a captured entry."""
        entries = _worker_half().slab.entries
        return [k in entries for k in slab_keys]

    def inferscale_read_entry(self, slab_key: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Stored K and V of one entry ([L, n, H, D] each, on the CPU), and its origin.

        The origin is the position token 0's stored key is rotated for.
        """
        worker = _worker_half()
        entry = worker.slab.entries[slab_key]
        return (worker.slab.keys[:, entry.rows].cpu(), worker.slab.values[:, entry.rows].cpu(),
                entry.origin)

    def inferscale_read_slots(self, slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V currently in paged `slots` of every layer: [L, T, H, D] each, on the CPU."""
        paged = _worker_half().paged
        index = torch.tensor(slots, dtype=torch.int64)
        pairs = [paged.read(layer, index) for layer in range(paged.num_layers)]
        return (torch.stack([k for k, _ in pairs]).cpu(), torch.stack([v for _, v in pairs]).cpu())

    def inferscale_demote(self, moves: list[tuple[int, int, list[int]]]) -> list[bool]:
        """(slab key, host key, host pages): move entries to the host tier."""
        return _worker_half().demote([(int(a), int(b), list(c)) for a, b, c in moves])

    def inferscale_promote(self, moves: list[tuple[int, int, list[int]]]) -> list[bool]:
        """(host key, slab key, pages): move host entries back into the slab."""
        return _worker_half().promote([(int(a), int(b), list(c)) for a, b, c in moves])

    def inferscale_persist(self, items: list[tuple[int, str, str, dict[str, str]]]
                           ) -> list[bool]:
        """(slab key, name, owner, meta): write entries to the disk tier."""
        return _worker_half().persist([(int(k), str(n), str(o), dict(m))
                                       for k, n, o, m in items])

    def inferscale_load(self, items: list[tuple[str, str, dict[str, str], int, list[int]]]
                        ) -> list[str]:
        """(name, owner, meta, slab key, pages): read entries from the disk tier."""
        return _worker_half().load([(str(n), str(o), dict(m), int(k), list(p))
                                    for n, o, m, k, p in items])

    def inferscale_forget(self, host_keys: list[int], names: list[str]) -> int:
        """Drop host entries and delete disk files of deleted facts."""
        return int(_worker_half().forget([int(k) for k in host_keys], [str(n) for n in names]))

    def inferscale_flush_disk(self) -> None:
        """Wait until queued disk writes are done."""
        _worker_half().flush_disk()

    def inferscale_recent_loads(self) -> list[tuple[str, list[int]]]:
        """(request id, paged slots written) of the worker's last few injections."""
        return [(rid, slots.tolist()) for rid, slots in _worker_half().recent_loads]
