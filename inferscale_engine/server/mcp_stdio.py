"""`inferscale mcp`: the memory tools over stdio, for one user (Claude Desktop, Cursor, VS Code).

    inferscale mcp --user-id ID [--model small|FOLDER] [--db PATH|URL] [--window 256]
                   [--slab-mib 256] [--kv-cache-mib N] [--max-model-len 4096]
                   [--embedding-model NAME|DIR]
    inferscale mcp --user-id ID --base-url URL [--api-key KEY]

A stdio server is one user's session: --user-id is fixed at start and no tool argument changes
it. With --base-url the tools call a running `inferscale serve` (MemoryClient; the key, or
$INFERSCALE_API_KEY, must reach the user). Otherwise a Memory with its own engine runs in this
process, on the model `inferscale serve` and `inferscale demo` would serve. The MCP handshake is
answered at once and the Memory opens in a worker thread; the first tool call waits for it.
stdout carries MCP messages only: while serving, whatever else is written to it (vLLM's log
included) goes to stderr (the SDK's stdio_server).
"""

from __future__ import annotations

import argparse
import os
from functools import partial

import anyio

from inferscale_engine.checks import check_user_id
from inferscale_engine.errors import InferScaleError
from inferscale_engine.server.mcp_backends import LocalMemory, MemoryVerbs, Opening
from inferscale_engine.server.mcp_tools import build_server

DEFAULT_DB = "~/.inferscale/memory.db"
"""The embedded Memory's database (Memory's own default)."""


def parser() -> argparse.ArgumentParser:
    """The options of `inferscale mcp`."""
    parser = argparse.ArgumentParser(prog="inferscale mcp", allow_abbrev=False, description=(
        "Serve one user's memory to an MCP client over stdio."))
    parser.add_argument("--user-id", required=True,
                        help="the user whose memories every tool reads and writes")
    remote = parser.add_argument_group("a running `inferscale serve`")
    remote.add_argument("--base-url", default=None, help="e.g. http://127.0.0.1:8000")
    remote.add_argument("--api-key", default=None,
                        help="a key of the server's --api-keys file (default: "
                             "$INFERSCALE_API_KEY)")
    local = parser.add_argument_group("an embedded memory (without --base-url)")
    local.add_argument("--model", default=None, help="small (the default) | a model folder")
    local.add_argument("--db", default=None,
                       help=f"a SQLite file or a postgresql:// URL (default: {DEFAULT_DB})")
    local.add_argument("--window", type=int, default=256, help="context window W (tokens)")
    local.add_argument("--slab-mib", type=int, default=256, help="fact KV (MiB)")
    local.add_argument("--kv-cache-mib", type=int, default=None,
                       help="vLLM's paged KV cache (MiB; default: 1 GiB on CPU)")
    local.add_argument("--max-model-len", type=int, default=4096)
    local.add_argument("--embedding-model", default=None,
                       help="sentence-transformers name or folder (default: offline MiniLM)")
    local.add_argument("--verbose", action="store_true", help="vLLM's INFO log (on stderr)")
    return parser


def main(argv: list[str]) -> int:
    """Parse, then serve over stdio until the client closes the connection."""
    cli = parser()
    args = cli.parse_args(argv)
    try:
        user_id = check_user_id(args.user_id)
    except InferScaleError as exc:
        cli.error(f"--user-id: {exc}")
    embedded = [f"--{name.replace('_', '-')}" for name in ("model", "db", "kv_cache_mib",
                                                           "embedding_model")
                if getattr(args, name) is not None]
    if args.base_url is not None and embedded:
        cli.error(f"{', '.join(embedded)} configure an embedded memory; with --base-url the "
                  "server has its own")
    if args.base_url is None and args.api_key is not None:
        cli.error("--api-key goes with --base-url (a server's key)")
    if not args.verbose:  # vLLM reads it when first imported
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    opening = Opening(partial(open_remote, args.base_url, args.api_key) if args.base_url
                      else partial(open_embedded, args))
    server = build_server(opening, lambda _ctx: user_id)
    try:
        anyio.run(server.run_stdio_async)
    finally:
        opening.close()
    return 0


def open_remote(base_url: str, api_key: str | None) -> MemoryVerbs:
    """A MemoryClient of the server at base_url."""
    from inferscale_integrations.client import MemoryClient

    return MemoryClient(base_url, api_key)


def open_embedded(args: argparse.Namespace) -> MemoryVerbs:
    """A Memory with its own engine (called in a worker thread: loading takes a while)."""
    from inferscale_engine.config import EngineConfig
    from inferscale_engine.memory import Memory, MemoryConfig
    from inferscale_engine.memory.config import DEFAULT_EMBEDDING_MODEL
    from inferscale_engine.model.resolve import resolve_model

    model, dtype = resolve_model(args.model or "small")
    engine = EngineConfig(model=str(model), dtype=dtype, max_model_len=args.max_model_len,
                          context_window_tokens=args.window,
                          slab_capacity_bytes=args.slab_mib * 2**20,
                          kv_cache_memory_bytes=None if args.kv_cache_mib is None
                          else args.kv_cache_mib * 2**20)
    # One user's session: each fact is encoded on first use, not every stored user's now.
    memory = Memory.from_config(MemoryConfig(
        engine=engine, db_path=args.db or DEFAULT_DB, startup="lazy",
        embedding_model=args.embedding_model or DEFAULT_EMBEDDING_MODEL))
    return LocalMemory(memory, owns_memory=True)
