"""The worker's lower tiers of fact KV: pinned host RAM (warm) and local disk (cold).

The GPU slab (slab.py) is the hot tier. The app decides what moves where (runtime/tier_manager.py,
deterministic so every tensor-parallel rank agrees) and calls these through the worker
extension (control.py); each rank moves its own KV heads.

- Host tier: pinned host pages the app allocates, page-major so that an entry moves as whole
  pages, one host page to one slab page. Demoting copies an entry's pages out of the GPU slab,
  promoting copies them back into new slab pages; each call moves all its entries together
  on a CUDA stream of its own (on the CPU build, plain copies). The tier is inclusive: a
  promoted entry stays in host RAM until the app drops it.
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
    one contiguous block ([2, L, page_tokens, H, D]); an entry's host pages and slab pages
    pair up one to one, in token order. A promotion copies host pages into a device buffer
    (a run of consecutive pages is one copy, issued as soon as its entry is checked, so the
    copies overlap the bookkeeping of the next entries), then writes the buffer's pages into
    their slab pages with one indexed copy per keys and values. A demotion is the reverse. A
    call synchronizes once per `MOVE_CHUNK_BYTES` of pages.
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
        """Copy slab entries (slab key -> host key, host pages) into host RAM.

        The slab entries are dropped (the app frees their pages).

        Returns:
            Per move, the tokens moved (0: the entry is not in the slab, or a page has been
            given to a newer demotion).
        """
        tokens = [0] * len(moves)
        batch: list[tuple[list[int], list[int]]] = []
        for i, move in enumerate(moves):
            entry = gpu.entries.get(move.source_key)
            host_pages = list(move.pages)
            if entry is None or len(host_pages) != -(-entry.num_tokens // self.page_tokens) or (
                    claim_pages(self.entries, self.page_keys, move.dest_key, host_pages)
                    is None):
                continue
            slab_pages = (entry.rows[::self.page_tokens] // self.page_tokens).tolist()
            batch.append((slab_pages, host_pages))
            self.entries[move.dest_key] = HostEntry(entry.owner, host_pages, entry.num_tokens,
                                                    entry.origin)
            del gpu.entries[move.source_key]
            tokens[i] = entry.num_tokens
        with _on(self._stream, gpu.keys.device):
            for chunk in self._chunks(batch):
                self._to_host(gpu, chunk)
        return tokens

    def promote(self, gpu: KVSlab, moves: list[Move]) -> list[int]:
        """Copy host entries (host key -> slab key, slab pages) back into the slab.

        The host entry stays (the tier is inclusive) until the app drops it.

        Returns:
            Per move, the tokens moved (0: not in host RAM, or the slab pages were given to a
            newer allocation).
        """
        tokens = [0] * len(moves)
        device = gpu.keys.device
        limit = max(1, self.MOVE_CHUNK_BYTES // self.page_bytes)
        with _on(self._stream, device):
            step = _Step(self, device, min(limit, sum(len(m.pages) for m in moves)))
            for i, move in enumerate(moves):
                entry = self.entries.get(move.source_key)
                pages = list(move.pages)
                if entry is None or len(pages) != len(entry.pages) or (
                        gpu.claim_pages(move.dest_key, pages) is None):
                    continue
                rows = gpu.rows_for(pages, entry.num_tokens)
                gpu.entries[move.dest_key] = SlabEntry(entry.owner, rows, entry.num_tokens,
                                                       entry.origin)
                if step.used + len(pages) > step.capacity:
                    step.to_slab(gpu)
                    step = _Step(self, device, max(len(pages), min(limit, sum(
                        len(m.pages) for m in moves[i:]))))
                step.fetch(entry.pages, pages)
                tokens[i] = entry.num_tokens
            step.to_slab(gpu)
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

    def _chunks(self, batch: list[tuple[list[int], list[int]]]
                ) -> Iterator[list[tuple[list[int], list[int]]]]:
        """Consecutive pieces of `batch` whose pages fit one move step."""
        limit = max(1, self.MOVE_CHUNK_BYTES // self.page_bytes)
        chunk: list[tuple[list[int], list[int]]] = []
        pages = 0
        for item in batch:
            if chunk and pages + len(item[1]) > limit:
                yield chunk
                chunk, pages = [], 0
            chunk.append(item)
            pages += len(item[1])
        if chunk:
            yield chunk

    def _to_host(self, gpu: KVSlab, items: list[tuple[list[int], list[int]]]) -> None:
        """Gather slab pages into a page-major device buffer, then copy it to host pages."""
        slab_pages = [p for pages, _ in items for p in pages]
        index = torch.tensor(slab_pages, dtype=torch.int64).to(gpu.keys.device)
        buffer = torch.empty((len(slab_pages), *self.pages.shape[1:]), dtype=self.pages.dtype,
                             device=gpu.keys.device)
        for side, slab in enumerate((gpu.keys, gpu.values)):
            paged = slab.view(slab.shape[0], -1, self.page_tokens, *slab.shape[2:])
            buffer[:, side] = paged.index_select(1, index).transpose(0, 1)
        at = 0
        for start, count in _runs([p for _, pages in items for p in pages]):
            self.pages[start:start + count].copy_(buffer[at:at + count], non_blocking=True)
            at += count


class _Step:
    """A promotion's move step: host pages copied into a device buffer, then into slab pages."""

    def __init__(self, tier: HostTier, device: torch.device, capacity: int) -> None:
        self.tier = tier
        self.capacity = capacity
        self.used = 0
        self.buffer = torch.empty((capacity, *tier.pages.shape[1:]), dtype=tier.pages.dtype,
                                  device=device)
        self.slab_pages: list[int] = []

    def fetch(self, host_pages: list[int], slab_pages: list[int]) -> None:
        """Copy an entry's host pages into the buffer (asynchronously on a CUDA stream)."""
        for start, count in _runs(host_pages):
            self.buffer[self.used:self.used + count].copy_(self.tier.pages[start:start + count],
                                                           non_blocking=True)
            self.used += count
        self.slab_pages += slab_pages

    def to_slab(self, gpu: KVSlab) -> None:
        """Write the buffer's pages into their slab pages (one indexed copy per side)."""
        if not self.used:
            return
        index = torch.tensor(self.slab_pages, dtype=torch.int64).to(gpu.keys.device)
        for side, slab in enumerate((gpu.keys, gpu.values)):
            paged = slab.view(slab.shape[0], -1, self.tier.page_tokens, *slab.shape[2:])
            paged.index_copy_(1, index, self.buffer[:self.used, side].transpose(0, 1))


def _runs(pages: list[int]) -> Iterator[tuple[int, int]]:
    """(first page, count) of each run of consecutive pages, in order."""
    start, count = pages[0], 1
    for page in pages[1:]:
        if page == start + count:
            count += 1
            continue
        yield start, count
        start, count = page, 1
    yield start, count


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
