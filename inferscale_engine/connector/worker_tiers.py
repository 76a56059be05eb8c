"""The worker's lower tiers of fact KV: pinned host RAM (warm) and local disk (cold).

The GPU slab (slab.py) is the hot tier. The app decides what moves where (runtime/tier_manager.py,
deterministic so every tensor-parallel rank agrees) and calls these through the worker
extension (control.py); each rank moves its own KV heads.

- Host tier: pinned host pages the app allocates, page-major so that an entry moves as whole
  pages. Demoting copies an entry's rows out of the GPU slab, promoting copies them back into
  new slab pages; each call moves all its entries together on a CUDA stream of its own (on
  the CPU build, plain copies). Tiers are exclusive: an entry is in the slab or in host RAM,
  never both.
- Disk tier: one safetensors file per fact and rank, written through when a fact is encoded
  (the copy out of the slab is synchronous; the MAC and the write run on a background
  thread), named by the app's content key. The file's metadata holds what the KV was
  computed from (model fingerprint, preamble, context and fact token digests, key scale,
  origin) and a keyed MAC (BLAKE3 with the tier's key) over that metadata and
  the KV bytes; a load checks all of it against what the app expects and refuses any
  mismatch, a truncated, corrupt or forged file (the app then re-encodes, counted).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inferscale_engine.config import DISK_MAC_KEY_ENV
from inferscale_engine.connector.slab import KVSlab, SlabEntry, claim_pages
from inferscale_engine.protocol.tier_control import DiskRead, DiskWrite, Move, disk_entry_path

logger = logging.getLogger(__name__)

DISK_FORMAT = "inferscale-kv-2"
"""Version of the disk entries' layout and metadata (2: keyed MAC instead of a checksum)."""


def entry_mac(key: bytes, meta: dict[str, str], keys: torch.Tensor, values: torch.Tensor
              ) -> str:
    """Keyed BLAKE3 (hex) of an entry's metadata (all but the MAC) and raw K and V bytes."""
    import blake3

    header = json.dumps({k: v for k, v in meta.items() if k != "mac"}, sort_keys=True)
    digest = blake3.blake3(key=key, max_threads=blake3.blake3.AUTO)
    digest.update(len(header).to_bytes(8, "little") + header.encode())
    for tensor in (keys, values):
        digest.update(tensor.contiguous().view(torch.uint8).numpy().data)
    return digest.hexdigest()


def disk_key() -> bytes:
    """The disk tier's MAC key, which the app puts in DISK_MAC_KEY_ENV before vLLM starts."""
    try:
        key = bytes.fromhex(os.environ.get(DISK_MAC_KEY_ENV, ""))
    except ValueError:
        key = b""
    if len(key) != 32:
        raise RuntimeError(f"{DISK_MAC_KEY_ENV} must hold a 32-byte hex key; start vLLM through "
                           "inferscale_engine.Engine")
    return key


@dataclass(slots=True, eq=False)
class HostEntry:
    """One demoted fact in host RAM."""

    owner: str
    pages: list[int]
    """Host pages in token order (page i holds tokens i * page_tokens ...)."""
    num_tokens: int
    origin: int


class HostTier:
    """Demoted entries in pinned host memory, page-major.

    Each host page holds the keys and values of every layer for its `page_tokens` tokens as
    one contiguous block ([2, L, page_tokens, H, D]), so moving an entry between the tiers is
    a few large copies of whole pages (a run of consecutive pages is one copy) between pinned
    host memory and a device buffer; the re-layout to and from the slab's [L, rows, H, D] is a
    gather or scatter on the device. A call moves all its entries with one synchronization per
    `MOVE_CHUNK_BYTES` of pages.
    """

    MOVE_CHUNK_BYTES = 256 * 2**20
    """Device buffer of one move step (bounds the memory a move takes beside the slab)."""

    def __init__(self, like: KVSlab, num_pages: int) -> None:
        layers, _, heads, dim = like.keys.shape
        self.page_tokens = like.page_tokens
        self.num_pages = num_pages
        self.pages = torch.zeros(num_pages, 2, layers, like.page_tokens, heads, dim,
                                 dtype=like.keys.dtype, pin_memory=like.keys.is_cuda)
        """[num_pages, 2 (keys, values), L, page_tokens, H, D], pinned beside a CUDA slab."""
        self.entries: dict[int, HostEntry] = {}
        self.page_keys = np.zeros(num_pages, dtype=np.int64)
        """Host key of the last demotion into each page (0: never written)."""
        self._stream = torch.cuda.Stream(like.keys.device) if like.keys.is_cuda else None

    @property
    def page_bytes(self) -> int:
        """Bytes of one host page (keys and values of every layer)."""
        return self.pages[0].numel() * self.pages.element_size()

    def demote(self, gpu: KVSlab, moves: list[Move]) -> list[int]:
        """Move slab entries (slab key -> host key, host pages) into host RAM.

        Returns:
            Per move, the tokens moved (0: the entry is not in the slab, or a page has been
            given to a newer demotion).
        """
        tokens = [0] * len(moves)
        batch: list[tuple[int, SlabEntry, list[int]]] = []
        for i, (slab_key, host_key, host_pages) in enumerate(
                (m.source_key, m.dest_key, list(m.pages)) for m in moves):
            entry = gpu.entries.get(slab_key)
            if entry is None or len(host_pages) * self.page_tokens < entry.num_tokens or (
                    claim_pages(self.entries, self.page_keys, host_key, host_pages) is None):
                continue
            batch.append((i, entry, host_pages))
            self.entries[host_key] = HostEntry(entry.owner, list(host_pages), entry.num_tokens,
                                               entry.origin)
            del gpu.entries[slab_key]
            tokens[i] = entry.num_tokens
        for chunk in self._chunks(batch):
            self._to_host(gpu, [(entry.rows, pages) for _, entry, pages in chunk])
        return tokens

    def promote(self, gpu: KVSlab, moves: list[Move]) -> list[int]:
        """Move host entries (host key -> slab key, slab pages) back into the slab.

        Returns:
            Per move, the tokens moved (0: not in host RAM, or the slab pages were given to a
            newer allocation).
        """
        tokens = [0] * len(moves)
        batch: list[tuple[int, torch.Tensor, list[int]]] = []
        for i, (host_key, slab_key, pages) in enumerate(
                (m.source_key, m.dest_key, list(m.pages)) for m in moves):
            entry = self.entries.get(host_key)
            if entry is None or gpu.claim_pages(slab_key, pages) is None:
                continue
            rows = gpu.rows_for(pages, entry.num_tokens)
            gpu.entries[slab_key] = SlabEntry(entry.owner, rows, entry.num_tokens, entry.origin)
            del self.entries[host_key]
            batch.append((i, rows, entry.pages))
            tokens[i] = entry.num_tokens
        for chunk in self._chunks(batch):
            self._to_slab(gpu, [(rows, pages) for _, rows, pages in chunk])
        return tokens

    def drop(self, host_keys: list[int]) -> int:
        """Forget host entries; how many existed."""
        return sum(self.entries.pop(k, None) is not None for k in host_keys)

    def stats(self) -> dict[str, int]:
        """Entries, tokens and bytes held, under the names KVSlab.stats uses."""
        capacity = self.num_pages * self.page_tokens
        return {"num_entries": len(self.entries),
                "num_tokens": sum(e.num_tokens for e in self.entries.values()),
                "capacity_tokens": capacity,
                "bytes_per_token": self.page_bytes // self.page_tokens,
                "capacity_bytes": self.num_pages * self.page_bytes}

    def _chunks(self, batch: list[Any]) -> Iterator[list[Any]]:
        """Consecutive pieces of `batch` whose host pages fit one move step."""
        limit = max(1, self.MOVE_CHUNK_BYTES // self.page_bytes)
        chunk: list[Any] = []
        pages = 0
        for item in batch:
            if chunk and pages + len(item[2]) > limit:
                yield chunk
                chunk, pages = [], 0
            chunk.append(item)
            pages += len(item[2])
        if chunk:
            yield chunk

    def _layout(self, items: list[tuple[torch.Tensor, list[int]]], device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int, int]]]:
        """Slab rows, their rows in a page-major device buffer, and the copy runs.

        Returns:
            slab rows [n] and buffer rows [n] (int64, on `device`) of every token, and
            (host page, buffer page, count) runs of consecutive pages.
        """
        runs: list[tuple[int, int, int]] = []
        buffer_rows = []
        start = 0
        for rows, pages in items:
            buffer_rows.append(torch.arange(len(rows), dtype=torch.int64)
                               + start * self.page_tokens)
            for offset, page in enumerate(pages):
                last = runs[-1] if runs else None
                if last is not None and last[0] + last[2] == page and (
                        last[1] + last[2] == start + offset):
                    runs[-1] = (last[0], last[1], last[2] + 1)
                else:
                    runs.append((page, start + offset, 1))
            start += len(pages)
        slab_rows = torch.cat([rows for rows, _ in items]).to(device, non_blocking=True)
        return slab_rows, torch.cat(buffer_rows).to(device, non_blocking=True), runs

    def _to_slab(self, gpu: KVSlab, items: list[tuple[torch.Tensor, list[int]]]) -> None:
        """Copy host pages into a device buffer, then scatter their tokens into slab rows."""
        device = gpu.keys.device
        with _on(self._stream, device):
            slab_rows, buffer_rows, runs = self._layout(items, device)
            count = sum(len(pages) for _, pages in items)
            buffer = torch.empty((count, *self.pages.shape[1:]), dtype=self.pages.dtype,
                                 device=device)
            for host, at, n in runs:
                buffer[at:at + n].copy_(self.pages[host:host + n], non_blocking=True)
            # [count, 2, L, page, H, D] -> [2, L, count * page, H, D]: tokens in buffer order
            flat = buffer.permute(1, 2, 0, 3, 4, 5).flatten(2, 3)
            gpu.keys[:, slab_rows] = flat[0][:, buffer_rows]
            gpu.values[:, slab_rows] = flat[1][:, buffer_rows]

    def _to_host(self, gpu: KVSlab, items: list[tuple[torch.Tensor, list[int]]]) -> None:
        """Gather slab rows into a page-major device buffer, then copy its pages to host RAM."""
        device = gpu.keys.device
        with _on(self._stream, device):
            slab_rows, buffer_rows, runs = self._layout(items, device)
            count = sum(len(pages) for _, pages in items)
            layers, _, heads, dim = gpu.keys.shape
            flat = torch.zeros(2, layers, count * self.page_tokens, heads, dim,
                               dtype=gpu.keys.dtype, device=device)
            flat[0][:, buffer_rows] = gpu.keys[:, slab_rows]
            flat[1][:, buffer_rows] = gpu.values[:, slab_rows]
            buffer = flat.unflatten(2, (count, self.page_tokens)).permute(2, 0, 1, 3, 4, 5)
            buffer = buffer.contiguous()
            for host, at, n in runs:
                self.pages[host:host + n].copy_(buffer[at:at + n], non_blocking=True)


@contextlib.contextmanager
def _on(stream: torch.cuda.Stream | None, device: torch.device) -> Iterator[None]:
    """Run the block on `stream` after the device's current work, and wait for it at the end.

    vLLM computes on the current stream; waiting for it first orders a move after the steps
    that wrote the slab, and the synchronize at the end makes the moved KV visible to the next
    step (and keeps the temporary buffers alive until their copies finished).
    """
    if stream is None:
        yield
        return
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield
    stream.synchronize()


class DiskTier:
    """Fact KV files of this rank under `folder`, written by a background thread."""

    def __init__(self, folder: str, rank: int, counters: Counter[str]) -> None:
        self.folder = Path(folder)
        self._rank = rank
        self._counters = counters
        self._key = disk_key()
        self._queue: queue.Queue[tuple[Path, dict[str, torch.Tensor], dict[str, str]] | None] = (
            queue.Queue(maxsize=256))
        self._thread = threading.Thread(target=self._write_loop, name="inferscale-disk-tier",
                                        daemon=True)
        self._thread.start()

    def path(self, name: str) -> Path:
        """The file of content key `name` on this rank."""
        return disk_entry_path(self.folder, name, self._rank)

    def persist(self, gpu: KVSlab, record: DiskWrite) -> bool:
        """Copy one slab entry out and queue its file; False if it is not in the slab."""
        entry = gpu.entries.get(record.slab_key)
        if entry is None:
            return False
        index = entry.rows.to(gpu.keys.device)
        keys, values = gpu.keys[:, index].cpu(), gpu.values[:, index].cpu()
        meta = {**record.meta, "format": DISK_FORMAT, "owner": record.owner,
                "origin": str(entry.origin), "num_tokens": str(entry.num_tokens)}
        self._queue.put((self.path(record.name), {"keys": keys, "values": values}, meta))
        return True

    def load(self, gpu: KVSlab, record: DiskRead, stream: torch.cuda.Stream | None) -> str:
        """Read, check and copy one entry into slab pages: '' or why it was refused.

        Never raises for what a file holds: anything unreadable or inconsistent is 'corrupt'.
        """
        try:
            return self._load(gpu, record, stream)
        except Exception as exc:  # noqa: BLE001 - a file that breaks any step is refused
            logger.warning("InferScale: disk entry %s refused: %s", record.name, exc)
            return "corrupt"

    def _load(self, gpu: KVSlab, record: DiskRead, stream: torch.cuda.Stream | None) -> str:
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
        slab_key, pages = record.slab_key, list(record.pages)
        num_tokens = int(meta.get("num_tokens", -1))
        shape = (layers, num_tokens, heads, dim)
        if (not 0 < num_tokens <= len(pages) * gpu.page_tokens
                or tuple(keys.shape) != shape or tuple(values.shape) != shape
                or keys.dtype != gpu.keys.dtype or values.dtype != gpu.keys.dtype):
            return "mismatch"
        if meta.get("mac") != entry_mac(self._key, meta, keys, values):
            return "corrupt"
        if gpu.claim_pages(slab_key, pages) is None:
            return "stale"
        rows = gpu.rows_for(pages, num_tokens)
        with _on(stream, gpu.keys.device):
            index = rows.to(gpu.keys.device)
            gpu.keys[:, index] = keys.to(gpu.keys.device, non_blocking=True)
            gpu.values[:, index] = values.to(gpu.keys.device, non_blocking=True)
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
            meta = {**meta, "mac": entry_mac(self._key, meta, tensors["keys"], tensors["values"])}
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
