"""`inferscale export | import | backup | restore`: a user's memories out and in, a store kept.

    inferscale export --user U (--db PATH | --base-url URL [--api-key K]) [-o FILE]
    inferscale import FILE --user U (--db PATH [--model M] | --base-url URL) [--format F]
    inferscale backup --db PATH_OR_URL [--disk-tier DIR] OUT
    inferscale restore BACKUP --db PATH_OR_URL [--disk-tier DIR]

With --base-url the command goes through `inferscale serve`'s REST routes, so the key's tenant
decides which users it may reach; with --db it opens the store itself (export reads it with no
model; import needs the served model to tokenize the facts, and a SQLite store no server has
open). The formats and procedures: docs/memory.md#export-and-import, #backup-and-restore.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from inferscale_engine.errors import InferScaleError

COMMANDS = ("export", "import", "backup", "restore")
"""The subcommands of `inferscale` this module runs."""


def add_parsers(sub: Any) -> None:
    """The four commands, on the `inferscale` parser's subcommands."""
    out = sub.add_parser("export", help="write a user's memories as JSON Lines (with history)")
    _target(out, model=False)
    out.add_argument("-o", "--output", help="the file to write (0600; default: stdout)")
    out.set_defaults(func=export)
    into = sub.add_parser("import", help="import memories: an InferScale or mem0 export, or a "
                                         "LangGraph store dump")
    into.add_argument("file", help="the file (JSON Lines or one JSON document)")
    _target(into, model=True)
    into.add_argument("--format", choices=("inferscale", "mem0", "langgraph"),
                      help="the file's format (default: told from its content)")
    into.set_defaults(func=import_)
    save = sub.add_parser("backup", help="back up a store and its disk tier into a folder")
    save.add_argument("--db", required=True, help="the store: a SQLite file or postgresql:// URL")
    save.add_argument("--disk-tier", help="the disk tier's folder (--disk-tier of serve)")
    save.add_argument("out", help="a new folder for the backup")
    save.set_defaults(func=backup)
    load = sub.add_parser("restore", help="restore a backup into a new store (and disk tier)")
    load.add_argument("backup", help="the folder `inferscale backup` wrote")
    load.add_argument("--db", required=True,
                      help="the new store: a SQLite path that does not exist yet, or the URL "
                           "of an empty PostgreSQL database")
    load.add_argument("--disk-tier", help="a new folder for the disk tier's entries")
    load.set_defaults(func=restore)


def _target(parser: argparse.ArgumentParser, *, model: bool) -> None:
    parser.add_argument("--user", required=True, help="whose memories")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", help="the store: a SQLite file or a postgresql:// URL")
    where.add_argument("--base-url", help="an `inferscale serve`, e.g. http://127.0.0.1:8000")
    parser.add_argument("--api-key", help="with --base-url (default: $INFERSCALE_API_KEY)")
    if model:
        parser.add_argument("--model", default="small",
                            help="with --db: the model the store's server serves (small | a "
                                 "model folder): facts are stored with its token ids")


def export(args: argparse.Namespace) -> int:
    """Write the user's export to --output or stdout."""
    if args.base_url:
        from inferscale_integrations.client import MemoryClient

        with MemoryClient(args.base_url, args.api_key) as client:
            lines: Iterable[str] = client.export(user_id=args.user)
    else:
        from inferscale_engine.memory.exporting import export_store
        from inferscale_engine.memory.store import FactStore

        with FactStore(args.db) as store:
            lines = list(export_store(store, args.user))
    if args.output is None:
        sys.stdout.writelines(lines)
        return 0
    with os.fdopen(os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w",
                   encoding="utf-8") as file:
        file.writelines(lines)
    print(f"exported the memories of {args.user!r} to {args.output}", file=sys.stderr)
    return 0


def import_(args: argparse.Namespace) -> int:
    """Import a file into the user's memory; print what was added and skipped."""
    if args.base_url:
        from inferscale_integrations.client import MemoryClient

        text = Path(args.file).read_text(encoding="utf-8")
        with MemoryClient(args.base_url, args.api_key) as client:
            result = client.import_(user_id=args.user, text=text, format=args.format)
    else:
        from inferscale_engine.config import EngineConfig
        from inferscale_engine.memory import Memory, MemoryConfig
        from inferscale_engine.model.resolve import resolve_model

        model, dtype = resolve_model(args.model)
        config = MemoryConfig(EngineConfig(model=str(model), dtype=dtype), db_path=args.db,
                              startup="lazy", encode_on_add=False)
        with Memory.from_config(config) as memory:
            result = memory.import_(user_id=args.user, file=args.file, format=args.format)
    print(f"imported {len(result.fact_ids)} facts into {args.user!r} from a {result.format} "
          f"file of {result.num_records}; {result.num_skipped} skipped (the user has them)")
    return 0


def backup(args: argparse.Namespace) -> int:
    """Back up --db (and --disk-tier) into a new folder."""
    from inferscale_engine.memory.backup import backup as run

    info = run(args.db, args.out, args.disk_tier)
    tier = ("no disk tier" if info.num_disk_entries is None
            else f"{info.num_disk_entries} disk tier entries")
    print(f"backed up {info.num_facts} facts of {info.num_users} users ({info.database}, "
          f"schema {info.schema_version}) and {tier} into {args.out}")
    return 0


def restore(args: argparse.Namespace) -> int:
    """Restore a backup folder into a new store (and tier); say what will be encoded."""
    from inferscale_engine.memory.backup import restore as run

    info = run(args.backup, args.db, args.disk_tier)
    print(f"restored {info.num_facts} facts of {info.num_users} users into {args.db}")
    if info.num_disk_entries is not None:
        print(f"disk tier: {info.num_disk_entries} entries in {args.disk_tier}; serve with "
              f"--disk-tier {args.disk_tier}: facts with an entry load their KV from it, none "
              "is encoded again")
    else:
        print(f"no disk tier restored: the {info.num_current} current facts are encoded again "
              "when the store is opened (startup 'encode'), or each on first use ('lazy')")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run a command of this module; an InferScale error is one line on stderr, status 1."""
    try:
        return int(args.func(args))
    except (InferScaleError, OSError) as exc:
        print(f"inferscale {args.command}: {exc}", file=sys.stderr)
        return 1
