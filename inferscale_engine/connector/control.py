"""Worker extension: control calls the app makes on every worker via LLM.collective_rpc.

vLLM mixes this class into its worker (`worker_extension_cls`), so the methods run in the
process that owns the slab, with MP=0 and MP=1 alike. Arguments and results are plain types.
"""

from __future__ import annotations

from typing import Any

import torch

from inferscale_engine.protocol.tier_control import DiskRead, DiskWrite, Move


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

    def inferscale_demote(self, moves: list[Any]) -> list[bool]:
        """Move entries from the slab to the host tier (protocol/tier_control.Move)."""
        return _worker_half().demote([Move.from_wire(m) for m in moves])

    def inferscale_promote(self, moves: list[Any]) -> list[bool]:
        """Move host entries back into the slab (protocol/tier_control.Move)."""
        return _worker_half().promote([Move.from_wire(m) for m in moves])

    def inferscale_persist(self, items: list[Any]) -> list[bool]:
        """Queue entries for the disk tier (protocol/tier_control.DiskWrite)."""
        return _worker_half().persist([DiskWrite.from_wire(i) for i in items])

    def inferscale_load(self, items: list[Any]) -> list[str]:
        """Read entries from the disk tier (protocol/tier_control.DiskRead)."""
        return _worker_half().load([DiskRead.from_wire(i) for i in items])

    def inferscale_forget(self, host_keys: list[int], names: list[str]) -> int:
        """Drop host entries and delete disk files of deleted facts."""
        return int(_worker_half().forget([int(k) for k in host_keys], [str(n) for n in names]))

    def inferscale_flush_disk(self) -> None:
        """Wait until queued disk writes are done."""
        _worker_half().flush_disk()

    def inferscale_recent_loads(self) -> list[tuple[str, list[int]]]:
        """(request id, paged slots written) of the worker's last few injections."""
        return [(rid, slots.tolist()) for rid, slots in _worker_half().recent_loads]
