"""App-side bookkeeping of the lower KV tiers: host-RAM pages and LRU, disk entry identities.

The GPU slab's pages and LRU are Residency's (residency.py). A fact evicted from the slab is
demoted to host RAM when the host tier has (or can make) room; a host entry evicted in turn is
dropped (with a disk tier its file remains). The host tier is inclusive: a fact promoted back
into the slab keeps its host copy (a fact's KV never changes), so evicting it again costs no
copy; only a fact that has never been in host RAM (or was dropped from it) is copied out. Disk
entries are named by a content key of what their KV was computed from, so an entry of another
model, preamble, context, fact or key scale is never loaded (connector/worker_tiers.py checks
the metadata again, and a keyed MAC). The worker side does the copies; this module only
decides, deterministically, so every rank agrees.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections import OrderedDict
from collections.abc import Container, Iterator, Sequence
from pathlib import Path

from inferscale_engine.config import DISK_KEY_ENV, DISK_KEY_FILE, DISK_MAC_KEY_ENV, EngineConfig
from inferscale_engine.facts import FactId
from inferscale_engine.protocol.plan import token_digest
from inferscale_engine.protocol.tier_control import Move
from inferscale_engine.runtime.residency import FactRecord, SlabAllocator


class HostResidency:
    """Host-RAM pages of demoted facts, least recently demoted or promoted dropped first.

    A held (pinned) fact's host copy is never dropped to make room: it is what brings the
    fact back first should its slab copy be missing.
    """

    def __init__(self, num_pages: int, page_tokens: int,
                 held: Container[FactId] = frozenset()) -> None:
        self._allocator = SlabAllocator(num_pages, page_tokens) if num_pages else None
        self._lru: OrderedDict[FactId, FactRecord] = OrderedDict()
        self._held = held

    @property
    def enabled(self) -> bool:
        """True if the host tier has pages."""
        return self._allocator is not None

    @property
    def num_resident(self) -> int:
        """Facts whose KV is in host RAM."""
        return len(self._lru)

    def demote(self, records: Sequence[FactRecord], keys: Iterator[int]
               ) -> tuple[list[Move], list[int]]:
        """Host pages for records leaving the slab (their slab_key still set).

        A record that still has its host copy (it was promoted from there) needs no move.

        Returns:
            The moves (slab key, host key, host pages), and the host keys of the entries
            dropped to make room (their worker entries must be dropped first). A record that
            does not fit even then gets no move: it leaves every tier but disk.
        """
        moves: list[Move] = []
        dropped: list[int] = []
        if self._allocator is None:
            return moves, dropped
        for record in records:
            if record.host_key is not None:
                self._lru.move_to_end(record.fact.fact_id)
                continue
            needed = self._allocator.pages_needed(len(record.fact.token_ids))
            if needed > self._allocator.num_free_pages:
                victims, room = [], self._allocator.num_free_pages
                for fact_id, oldest in self._lru.items():  # oldest first, until there is room
                    if room >= needed:
                        break
                    if fact_id not in self._held:
                        victims.append(oldest)
                        room += len(oldest.host_pages or ())
                if room < needed:
                    continue  # no room even after dropping every unheld copy
                for oldest in victims:
                    assert oldest.host_key is not None
                    del self._lru[oldest.fact.fact_id]
                    dropped.append(oldest.host_key)
                    self._free(oldest)
            assert record.slab_key is not None
            pages = self._allocator.allocate(len(record.fact.token_ids))
            host_key = next(keys)
            moves.append(Move(record.slab_key, host_key, tuple(pages)))
            record.host_key, record.host_pages = host_key, pages
            self._lru[record.fact.fact_id] = record
        return moves, dropped

    def touch(self, record: FactRecord) -> None:
        """Mark a record's host copy as just used (it was promoted and stays in host RAM)."""
        if record.host_key is not None:
            self._lru.move_to_end(record.fact.fact_id)

    def release(self, record: FactRecord) -> None:
        """Forget a record's host copy (deleted, or a move to or from it failed)."""
        if record.host_key is None:
            return
        self._lru.pop(record.fact.fact_id, None)
        self._free(record)

    def _free(self, record: FactRecord) -> None:
        assert self._allocator is not None
        self._allocator.free(record.host_pages or ())
        record.host_key, record.host_pages = None, None


def disk_identity(record: FactRecord, preamble: Sequence[int], fingerprint: str
                  ) -> tuple[str, dict[str, str]]:
    """The disk entry's name and the metadata it must carry to be loaded for this record.

    The name is a content key of the user, the model (weights included), the preamble, the
    context, the fact's ids and the key scale: the KV is a function of exactly these. The user
    is part of it so that no user's entry is ever another user's (no cross-user hit to time).
    """
    meta = {"model": fingerprint, "preamble": token_digest(preamble),
            "context": token_digest(record.context_ids),
            "fact": token_digest(record.fact.token_ids),
            "key_scale": ",".join(repr(s) for s in record.key_scale)}
    user = record.fact.user_id.encode("utf-8", "surrogatepass")
    blob = b"\0".join([user, *(f"{k}={v}".encode() for k, v in sorted(meta.items()))])
    # The user's digest first: one user's files share a prefix (what a user's removal globs).
    name = (hashlib.blake2b(user, digest_size=6).hexdigest() + "-"
            + hashlib.blake2b(blob, digest_size=20).hexdigest())
    return name, meta


def weights_fingerprint(model: str, load_format: str) -> str:
    """An identity of the model's weights, cheap to compute.

    Each weight file's name and size, and its first and last MiB ('dummy' weights: their load
    format).
    """
    if load_format == "dummy":
        return "dummy"
    folder = Path(model)
    if not folder.is_dir():
        return f"name:{model}"
    digest = hashlib.blake2b(digest_size=16)
    for path in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}".encode())
        with open(path, "rb") as handle:
            digest.update(handle.read(2**20))
            handle.seek(max(0, size - 2**20))
            digest.update(handle.read(2**20))
    return digest.hexdigest()


def disk_fingerprint(config: EngineConfig, model_fingerprint: str) -> str | None:
    """The identity disk entries are bound to (None: no disk tier), after checking the folder.

    The model (architecture, dtype, tokenizer, weights), the tensor-parallel size (a rank's
    file holds its heads) and where stored keys are rotated to.
    """
    if not config.disk_tier_path:
        return None
    check_disk_tier(config.disk_tier_path)
    return (f"{model_fingerprint}-{weights_fingerprint(config.model, config.load_format)}"
            f"-tp{config.tensor_parallel_size}-{config.key_origin}")


def check_disk_tier(path: str) -> None:
    """Create the disk tier's folder, check that files can be written there, and set its key.

    The entries' MAC key comes from DISK_KEY_ENV if the operator set it, else from the key
    file in the folder (created on first use). The folder is created 0700; a folder or key
    file other local users could write (or a key file they could read) is refused: whoever
    can replace the key can plant KV under any user's name.

    Raises:
        ConfigError: the folder cannot be created or written, or it or its key file is open
            to other users.
    """
    from inferscale_engine.errors import ConfigError

    folder = Path(path).expanduser()
    probe = folder / ".inferscale-write-check"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"disk_tier_path {path!r} cannot be written ({exc}); give a folder "
                          "this process may create files in, or None for no disk tier") from None
    if os.environ.get(DISK_KEY_ENV, "").strip():
        _check_key(os.environ[DISK_KEY_ENV], DISK_KEY_ENV)
        os.environ[DISK_MAC_KEY_ENV] = os.environ[DISK_KEY_ENV].strip()
        return
    _check_private(folder, 0o022, "folder")
    key_file = folder / DISK_KEY_FILE
    try:
        with os.fdopen(os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(secrets.token_hex(32))
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigError(f"cannot create the disk tier's key file {key_file} ({exc})") from None
    _check_private(key_file, 0o077, "key file")
    os.environ[DISK_MAC_KEY_ENV] = _check_key(key_file.read_text(), str(key_file))


def _check_key(value: str, source: str) -> str:
    from inferscale_engine.errors import ConfigError

    value = value.strip()
    try:
        if len(bytes.fromhex(value)) == 32:
            return value
    except ValueError:
        pass
    raise ConfigError(f"{source} must hold a 32-byte key as 64 hex digits; generate one with "
                      "`python -c \"import secrets; print(secrets.token_hex(32))\"`")


def _check_private(path: Path, forbidden: int, what: str) -> None:
    from inferscale_engine.errors import ConfigError

    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & forbidden:
        raise ConfigError(f"the disk tier's {what} {path} must belong to this user and not be "
                          f"open to others (mode {info.st_mode & 0o777:o}); run `chmod "
                          f"{'700' if what == 'folder' else '600'} {path}`, or set "
                          f"{DISK_KEY_ENV} to keep the key elsewhere")
