"""Tier-control records: what the app asks every worker to move between its KV tiers.

The app decides every move (runtime/tier_manager.py, runtime/write_path.py); each worker carries it
out on its own KV heads (connector/worker_tiers.py). The records cross vLLM's collective_rpc, whose
serializer takes plain types only, so each goes as a tuple (`to_wire`) and is rebuilt on the
worker (`from_wire`); these are the only places the tuples' order is written.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Move:
    """One entry moved between the GPU slab and host RAM, into new pages under a new key.

    Demotion: slab key -> host key and host pages; promotion: host key -> slab key and slab
    pages. A key is written once: a claim with a key older than the pages' last writer is
    refused (the pages were given to a newer allocation).
    """

    source_key: int
    dest_key: int
    pages: tuple[int, ...]
    """Pages of the destination tier, in token order."""

    def to_wire(self) -> tuple[int, int, list[int]]:
        """As collective_rpc sends it."""
        return self.source_key, self.dest_key, list(self.pages)

    @classmethod
    def from_wire(cls, raw: Sequence[Any]) -> Move:
        """Rebuilt on the worker."""
        source, dest, pages = raw
        return cls(int(source), int(dest), tuple(int(p) for p in pages))


@dataclass(frozen=True, slots=True)
class DiskWrite:
    """Write one slab entry to the disk tier (queued; the worker's thread writes the file)."""

    slab_key: int
    name: str
    """File stem: the app's content key (runtime/tier_manager.py disk_identity)."""
    owner: str
    meta: Mapping[str, str]
    """What the KV was computed from; the file must carry it to be loaded again."""

    def to_wire(self) -> tuple[int, str, str, dict[str, str]]:
        """As collective_rpc sends it."""
        return self.slab_key, self.name, self.owner, dict(self.meta)

    @classmethod
    def from_wire(cls, raw: Sequence[Any]) -> DiskWrite:
        """Rebuilt on the worker."""
        key, name, owner, meta = raw
        return cls(int(key), str(name), str(owner), {str(k): str(v) for k, v in meta.items()})


@dataclass(frozen=True, slots=True)
class DiskRead:
    """Load one disk entry into slab pages, if it carries exactly `meta` for `owner`."""

    name: str
    owner: str
    meta: Mapping[str, str]
    slab_key: int
    pages: tuple[int, ...]

    def to_wire(self) -> tuple[str, str, dict[str, str], int, list[int]]:
        """As collective_rpc sends it."""
        return self.name, self.owner, dict(self.meta), self.slab_key, list(self.pages)

    @classmethod
    def from_wire(cls, raw: Sequence[Any]) -> DiskRead:
        """Rebuilt on the worker."""
        name, owner, meta, key, pages = raw
        return cls(str(name), str(owner), {str(k): str(v) for k, v in meta.items()}, int(key),
                   tuple(int(p) for p in pages))


def disk_entry_path(folder: str | os.PathLike[str], name: str, rank: int) -> Path:
    """The disk-tier file of content key `name` on tensor-parallel rank `rank`.

    The one naming rule the app side (runtime/write_path.py) and the workers share.
    """
    return Path(folder) / f"{name}.r{rank}.safetensors"
