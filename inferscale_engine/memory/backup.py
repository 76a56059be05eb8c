"""Backup and restore of a Memory's store and its disk KV tier (docs/memory.md#backup-and-restore).

A backup is a folder, made while the server keeps serving:

  manifest.json   what it holds: the database kind, its facts and users, the schema version,
                  the disk tier's entries, when it was taken
  memory.db       a SQLite store, copied with SQLite's online backup API (one consistent
                  snapshot; writers carry on meanwhile), or
  memory.pgdump   a PostgreSQL store, as pg_dump's custom format (one snapshot too)
  disk/           the disk tier's entries (*.safetensors) and its key file, when one is given

A restore makes a new database (a SQLite file that must not exist yet, or an empty PostgreSQL
database, through pg_restore) and a new tier folder (0700, files 0600). Facts keep their ids,
token ids and contexts, so the disk entries, named by what their KV was computed from, load as
they are: a Memory opened on the restored store and tier encodes no fact whose entry was
carried. Without the tier, each current fact is encoded again (RestoreInfo says how many).
The tier's key file travels with it; with INFERSCALE_DISK_KEY set instead, the restored
server needs the same key, or it refuses the entries and encodes them again (counted).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from inferscale_engine.config import DISK_KEY_FILE
from inferscale_engine.errors import ConfigError, StoreError
from inferscale_engine.memory.expiry import unexpired
from inferscale_engine.memory.store import FactStore
from inferscale_engine.memory.store.sql import is_url
from inferscale_engine.memory.store.sql.postgres import redact
from inferscale_engine.memory.store.sql.sqlite import private_folder

MANIFEST, SQLITE_FILE, PG_FILE, DISK_FOLDER = "manifest.json", "memory.db", "memory.pgdump", "disk"
BACKUP_VERSION = 1
"""The manifest's version."""


@dataclass(frozen=True, slots=True)
class BackupInfo:
    """What a backup holds (its manifest.json), or what a restore brought back."""

    database: str
    """'sqlite' or 'postgresql'."""
    num_facts: int
    """Stored facts: current, superseded and expired ones."""
    num_current: int
    """Facts a Memory serves (current, unexpired): those encoded again without their entries."""
    num_users: int
    schema_version: int
    num_disk_entries: int | None
    """Disk tier entries carried (None: no disk tier in the backup)."""
    created_at: float
    """When the backup was taken (seconds since the epoch)."""
    version: int = BACKUP_VERSION


def backup(db: str, out: str | os.PathLike[str], disk_tier: str | None = None) -> BackupInfo:
    """Back up the store at `db` (a SQLite path or a postgresql:// URL), and a disk tier.

    Args:
        out: a new folder (created 0700; an existing one must be empty).
        disk_tier: the disk tier's folder (disk_tier_path, `--disk-tier`), copied after the
            database: entries of facts added meanwhile are unused, facts without one are
            encoded again after a restore.

    Raises:
        ConfigError: `out` is not empty, or `db` / `disk_tier` does not exist.
        StoreError: the copy failed (pg_dump's message, without the password).
    """
    folder = _new_folder(out)
    started = time.time()
    if is_url(db):
        info = _counts(db, "postgresql")  # read just before the dump's snapshot
        _pg("pg_dump", db, "--format=custom", "--no-owner", f"--file={folder / PG_FILE}")
    else:
        if not Path(db).expanduser().is_file():
            raise ConfigError(f"--db {db!r} is not a file; give the store's SQLite file")
        _sqlite_copy(str(Path(db).expanduser()), folder / SQLITE_FILE)
        info = _counts(str(folder / SQLITE_FILE), "sqlite")
    entries = None if disk_tier is None else copy_tier(disk_tier, folder / DISK_FOLDER)
    info = BackupInfo(**{**asdict(info), "num_disk_entries": entries, "created_at": started})
    manifest = folder / MANIFEST
    manifest.write_text(json.dumps(asdict(info), indent=2) + "\n")
    manifest.chmod(0o600)
    return info


def restore(source: str | os.PathLike[str], db: str,
            disk_tier: str | None = None) -> BackupInfo:
    """Restore a backup folder into a new store at `db` and, if given, a new tier folder.

    Returns:
        The restored store's counts; num_disk_entries is what was put in `disk_tier` (None:
        not restored, so a Memory encodes the num_current facts again).

    Raises:
        ConfigError: not a backup, a database of the other kind, a SQLite file that exists, a
            PostgreSQL database that has tables, or a tier folder that is not empty.
        StoreError: the restore failed.
    """
    folder = Path(source).expanduser()
    try:
        saved = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{str(folder)!r} is not an InferScale backup ({exc}); give the "
                          "folder `inferscale backup` wrote") from None
    if saved.get("database") != ("postgresql" if is_url(db) else "sqlite"):
        raise ConfigError(f"the backup holds a {saved.get('database')} store; restore it into "
                          "a store of that kind (a SQLite path, or a postgresql:// URL)")
    if is_url(db):
        _check_empty_postgres(db)
        _pg("pg_restore", db, "--no-owner", "--exit-on-error", str(folder / PG_FILE))
    else:
        target = Path(db).expanduser()
        if target.exists():
            raise ConfigError(f"--db {db!r} exists; restore into a new path (a restore never "
                              "overwrites a store)")
        private_folder(target.parent)
        _sqlite_copy(str(folder / SQLITE_FILE), target)
    entries = None
    if disk_tier is not None:
        if not (folder / DISK_FOLDER).is_dir():
            raise ConfigError(f"the backup {str(folder)!r} holds no disk tier; restore without "
                              "one (the facts are encoded again)")
        entries = copy_tier(folder / DISK_FOLDER, disk_tier)
    counts = _counts(db, saved["database"])
    return BackupInfo(**{**asdict(counts), "num_disk_entries": entries,
                         "created_at": float(saved.get("created_at", 0.0))})


def copy_tier(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> int:
    """Copy a disk tier's entries and key file into a new folder (0700); returns the entries.

    Entries being written (*.partial) are left out, and so are entries deleted meanwhile.
    """
    src, dst = Path(source).expanduser(), _new_folder(target)
    if not src.is_dir():
        raise ConfigError(f"disk tier {str(src)!r} is not a folder")
    copied = 0
    for path in sorted(src.iterdir()):
        if path.suffix != ".safetensors" and path.name != DISK_KEY_FILE:
            continue
        try:
            shutil.copyfile(path, dst / path.name)
        except FileNotFoundError:  # deleted since the listing: its fact is gone
            continue
        (dst / path.name).chmod(0o600)
        copied += path.suffix == ".safetensors"
    return copied


def _sqlite_copy(source: str, target: Path) -> None:
    """Copy a SQLite database with the online backup API into a new file (0600)."""
    try:
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        raise ConfigError(f"{str(target)!r} exists; give a new path") from None
    try:
        with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
            src.backup(dst)  # all pages in one step, from one read snapshot
    except sqlite3.Error as exc:
        target.unlink(missing_ok=True)
        raise StoreError(f"copying {source!r} failed: {exc}; nothing was written") from exc


def _counts(db: str, kind: str) -> BackupInfo:
    num_facts = num_current = 0
    now = time.time()
    with FactStore(db) as store:
        for batch in store.iter_all():
            num_facts += len(batch)
            num_current += len(unexpired([f for f in batch if f.valid_to is None], now))
        return BackupInfo(kind, num_facts, num_current, len(store.users()),
                          store.schema_version, None, now)


def _new_folder(path: str | os.PathLike[str]) -> Path:
    folder = Path(path).expanduser()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ConfigError(f"{str(folder)!r} exists and is not an empty folder; give a new one")
    private_folder(folder)
    return folder


def _pg(tool: str, url: str, *args: str) -> None:
    """Run pg_dump or pg_restore on `url`, its password passed in the environment."""
    binary = shutil.which(tool) or next(iter(sorted(
        Path("/usr/lib/postgresql").glob(f"*/bin/{tool}"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
        reverse=True)), None)
    if binary is None:
        raise ConfigError(f"{tool} is not installed (PostgreSQL's client tools); install them, "
                          "e.g. apt-get install postgresql-client")
    parts = urlsplit(url)
    env = dict(os.environ)
    if parts.password:
        env["PGPASSWORD"] = parts.password
        parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", "@", 1))
    run = subprocess.run([str(binary), *args, f"--dbname={urlunsplit(parts)}"], env=env,
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise StoreError(f"{tool} on {redact(url)!r} failed: {run.stderr.strip()[-2000:]}")


def _check_empty_postgres(url: str) -> None:
    import psycopg

    with psycopg.connect(url, connect_timeout=10) as conn:
        tables = conn.execute("SELECT count(*) FROM information_schema.tables WHERE "
                              "table_schema = 'public'").fetchone()
    if tables and tables[0]:
        raise ConfigError(f"{redact(url)!r} has tables; restore into an empty database "
                          "(createdb a new one)")
