"""The worker's lower tiers of fact KV: pinned host RAM (warm) and local disk (cold).

The GPU slab (slab.py) is the hot tier. The app decides what moves where (runtime/tiers.py,
deterministic so every tensor-parallel rank agrees) and calls these through the worker
extension (control.py); each rank moves its own KV heads.

- Host tier: a second KVSlab in pinned host memory with pages the app allocates. Demoting an
  entry copies its rows out of the GPU slab; promoting copies them back into new slab pages on
  a CUDA stream of its own (on the CPU build a plain copy). Tiers are exclusive: an entry is
  in the slab or in host RAM, never both.
- Disk tier: one safetensors file per fact and rank, written through when a fact is encoded
  (by a background thread: the copy out of the slab is synchronous, the write is not), named
  by the app's content key. The file's metadata holds what the KV was computed from (model
  fingerprint, preamble, context and fact token digests, key scale, origin) and a checksum of
  its bytes; a load checks all of them against what the app expects and refuses any mismatch,
  a truncated or corrupt file (the app then re-encodes, counted).
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from inferscale_engine.config import disk_entry_path
from inferscale_engine.connector.slab import KVSlab, SlabEntry

logger = logging.getLogger(__name__)

DISK_FORMAT = "inferscale-kv-1"
"""Version of the disk entries' layout and metadata."""


@dataclass(frozen=True, slots=True)
class DiskRecord:
    """What a disk entry must have been computed from (the app's expectation on load)."""

    name: str
    """File stem: the app's content key (hex)."""
    owner: str
    meta: dict[str, str]
    """Model fingerprint and digests of the preamble, context and fact ids, key scale."""


def checksum(keys: torch.Tensor, values: torch.Tensor) -> str:
    """BLAKE2b of an entry's raw K and V bytes (hex)."""
    digest = hashlib.blake2b(digest_size=16)
    for tensor in (keys, values):
        digest.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class HostTier:
    """Demoted entries in pinned host memory (a KVSlab on the CPU)."""

    def __init__(self, like: KVSlab, num_pages: int) -> None:
        layers, _, heads, dim = like.keys.shape
        self.slab = KVSlab(layers, num_pages, like.page_tokens, heads, dim, like.keys.dtype,
                           torch.device("cpu"), pin_memory=like.keys.is_cuda)
        self._stream = torch.cuda.Stream(like.keys.device) if like.keys.is_cuda else None

    def demote(self, gpu: KVSlab, slab_key: int, host_key: int, host_pages: list[int]) -> int:
        """Move one slab entry into host pages; its tokens (0: not in the slab, or stale)."""
        entry = gpu.entries.get(slab_key)
        if entry is None or self.slab.claim_pages(host_key, host_pages) is None:
            return 0
        rows = self.slab.rows_for(host_pages, entry.num_tokens)
        index = entry.rows.to(gpu.keys.device)
        self.slab.keys[:, rows] = gpu.keys[:, index].cpu()
        self.slab.values[:, rows] = gpu.values[:, index].cpu()
        self.slab.entries[host_key] = SlabEntry(entry.owner, rows, entry.num_tokens, entry.origin)
        del gpu.entries[slab_key]
        return entry.num_tokens

    def promote(self, gpu: KVSlab, host_key: int, slab_key: int, pages: list[int]) -> int:
        """Move one host entry into slab pages; its tokens (0: not here, or stale pages)."""
        entry = self.slab.entries.get(host_key)
        if entry is None or gpu.claim_pages(slab_key, pages) is None:
            return 0
        rows = gpu.rows_for(pages, entry.num_tokens)
        copy_rows(gpu, rows, self.slab.keys[:, entry.rows], self.slab.values[:, entry.rows],
                  self._stream)
        gpu.entries[slab_key] = SlabEntry(entry.owner, rows, entry.num_tokens, entry.origin)
        del self.slab.entries[host_key]
        return entry.num_tokens

    def drop(self, host_keys: list[int]) -> int:
        """Forget host entries; how many existed."""
        return sum(self.slab.entries.pop(k, None) is not None for k in host_keys)


def copy_rows(gpu: KVSlab, rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
              stream: torch.cuda.Stream | None) -> None:
    """Write [L, n, H, D] keys and values into slab `rows`; on CUDA on `stream`, then wait."""
    index = rows.to(gpu.keys.device)
    if stream is None:
        gpu.keys[:, index] = keys.to(gpu.keys.device)
        gpu.values[:, index] = values.to(gpu.keys.device)
        return
    stream.wait_stream(torch.cuda.current_stream(gpu.keys.device))
    with torch.cuda.stream(stream):
        gpu.keys[:, index] = keys.to(gpu.keys.device, non_blocking=True)
        gpu.values[:, index] = values.to(gpu.keys.device, non_blocking=True)
    stream.synchronize()


class DiskTier:
    """Fact KV files of this rank under `folder`, written by a background thread."""

    def __init__(self, folder: str, rank: int, counters: Counter[str]) -> None:
        self.folder = Path(folder)
        self._rank = rank
        self._counters = counters
        self._queue: queue.Queue[tuple[Path, dict[str, torch.Tensor], dict[str, str]] | None] = (
            queue.Queue(maxsize=256))
        self._thread = threading.Thread(target=self._write_loop, name="inferscale-disk-tier",
                                        daemon=True)
        self._thread.start()

    def path(self, name: str) -> Path:
        """The file of content key `name` on this rank."""
        return disk_entry_path(self.folder, name, self._rank)

    def persist(self, gpu: KVSlab, slab_key: int, record: DiskRecord) -> bool:
        """Copy one slab entry out and queue its file; False if it is not in the slab."""
        entry = gpu.entries.get(slab_key)
        if entry is None:
            return False
        index = entry.rows.to(gpu.keys.device)
        keys, values = gpu.keys[:, index].cpu(), gpu.values[:, index].cpu()
        meta = {**record.meta, "format": DISK_FORMAT, "owner": record.owner,
                "origin": str(entry.origin), "num_tokens": str(entry.num_tokens),
                "checksum": checksum(keys, values)}
        self._queue.put((self.path(record.name), {"keys": keys, "values": values}, meta))
        return True

    def load(self, gpu: KVSlab, record: DiskRecord, slab_key: int, pages: list[int],
             stream: torch.cuda.Stream | None) -> str:
        """Read, check and copy one entry into slab pages: '' or why it was refused."""
        from safetensors import safe_open

        path = self.path(record.name)
        if not path.exists():
            return "missing"
        try:
            with safe_open(str(path), framework="pt") as handle:
                meta = handle.metadata() or {}
                keys, values = handle.get_tensor("keys"), handle.get_tensor("values")
        except Exception:  # noqa: BLE001 - truncated or not a safetensors file
            return "corrupt"
        expected = {**record.meta, "format": DISK_FORMAT, "owner": record.owner}
        if any(meta.get(k) != v for k, v in expected.items()):
            return "mismatch"
        layers, _, heads, dim = gpu.keys.shape
        num_tokens = int(meta.get("num_tokens", -1))
        shape = (layers, num_tokens, heads, dim)
        if (tuple(keys.shape) != shape or tuple(values.shape) != shape
                or keys.dtype != gpu.keys.dtype or values.dtype != gpu.keys.dtype):
            return "mismatch"
        if meta.get("checksum") != checksum(keys, values):
            return "corrupt"
        if gpu.claim_pages(slab_key, pages) is None:
            return "stale"
        rows = gpu.rows_for(pages, num_tokens)
        copy_rows(gpu, rows, keys, values, stream)
        gpu.entries[slab_key] = SlabEntry(record.owner, rows, num_tokens, int(meta["origin"]))
        self._counters["disk_bytes_read"] += keys.nbytes + values.nbytes
        return ""

    def forget(self, names: list[str]) -> int:
        """Delete the files of these content keys (after pending writes); how many existed."""
        self.flush()
        removed = 0
        for name in names:
            try:
                self.path(name).unlink()
                removed += 1
            except FileNotFoundError:
                pass
        return removed

    def flush(self) -> None:
        """Wait until every queued file is written."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued, then stop the writer thread."""
        self.flush()
        self._queue.put(None)

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(*item)  # never raises: a failed write is counted
            finally:
                self._queue.task_done()

    def _write(self, path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]
               ) -> None:
        from safetensors.torch import save_file

        partial = path.with_suffix(".partial")
        try:
            save_file(tensors, str(partial), metadata=meta)
            os.replace(partial, path)  # a crash never leaves a half-written entry in place
            self._counters["disk_bytes_written"] += path.stat().st_size
            self._counters["disk_writes"] += 1
        except Exception as exc:  # noqa: BLE001 - full disk, lost folder (safetensors raises
            # its own error type): counted; the fact stays in the upper tiers, the writer lives
            self._counters["disk_write_errors"] += 1
            logger.warning("InferScale: disk tier cannot write %s: %s", path, exc)
            try:
                partial.unlink(missing_ok=True)
            except OSError:
                pass
