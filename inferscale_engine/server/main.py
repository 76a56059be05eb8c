"""`inferscale serve`: start vLLM's OpenAI server with InferScale's memory installed.

    inferscale serve [MODEL | --model MODEL] [--host 127.0.0.1] [--port 8000] [--db PATH|URL]
                     [--api-keys FILE] [--k 5] [--window 256] [--context-source similar|recent]
                     [--run-tokens 512] [--slab-mib 256] [--host-tier-mib N] [--disk-tier DIR]
                     [--embedding-model NAME|DIR] [--dedupe-threshold 0.95|none]
                     [--half-scan-min-rows N] [--max-add-facts 1000]
                     [--allowed-hosts NAME,...] [--max-served-users 10000]
                     [vLLM's own serve flags]

MODEL is 'small' (the default: the real 0.5B model) or a model folder, given first as with
`vllm serve MODEL`. Every flag not listed here is vLLM's and reaches vLLM's parser unchanged
(no abbreviations: vLLM's --api-key is not our --api-keys).

vLLM's engine (AsyncLLM) starts with InferScale's KV connector and worker extension forced;
the Memory runs on top of it in worker threads (AsyncRunner); vLLM's app is built as usual and
gets the seam (seam.py), the memory routes, the inspector (ui/), the MCP tools at /mcp
(mcp_http.py), the auth middleware and the metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from inferscale_engine.checks import check_half_scan_min_rows
from inferscale_engine.config import EngineConfig, plan_secret
from inferscale_engine.errors import ConfigError
from inferscale_engine.memory.config import (
    DEFAULT_EMBEDDING_MODEL,
    DEFAULT_EXPIRY_SWEEP_S,
    DEFAULT_MAX_QUEUED_FACTS,
    DEFAULT_MAX_SERVED_USERS,
    ON_EXPIRY,
    check_dedupe_threshold,
    check_expiry,
    check_max_served_users,
)
from inferscale_engine.memory.search.hybrid import DEFAULT_SEARCH_MODE, SEARCH_MODES
from inferscale_engine.memory.search.neighbors import DEFAULT_NEIGHBOR_SHARE, check_neighbor_share
from inferscale_engine.memory.search.versions import (
    DEFAULT_HIDE_OLDER_VERSIONS,
    HIDE_OLDER_VERSIONS,
)
from inferscale_engine.server.auth import (
    PUBLIC_PATHS,
    ApiKeys,
    HttpError,
    check_bind,
    tenant_route,
)
from inferscale_engine.server.hosts import AllowedHosts
from inferscale_engine.server.limits import (
    DEFAULT_MAX_ADD_FACTS,
    FILTER_PATHS,
    MAX_BODY_BYTES,
    MAX_FILTER_BODY_BYTES,
    BodyLimit,
    BoundedHeadProtocol,
    CountRefusals,
)

logger = logging.getLogger(__name__)


def our_parser() -> argparse.ArgumentParser:
    """InferScale's own options; everything else goes to vLLM's `serve` parser."""
    parser = argparse.ArgumentParser(prog="inferscale serve", add_help=False, allow_abbrev=False)
    parser.add_argument("--model", default=None, help="small | a model folder (or give it first)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--db", default="~/.inferscale/server.db",
                        help="the fact database: a SQLite file, or a postgresql:// URL that "
                             "replicas share")
    parser.add_argument("--api-keys", default=None, help="JSON file: keys -> tenant, users")
    parser.add_argument("--k", type=int, default=5, help="facts retrieved per request")
    parser.add_argument("--window", type=int, default=256, help="context window W (tokens)")
    parser.add_argument("--context-source", choices=("similar", "recent"), default="similar",
                        help="a fact added as text is encoded after the user's earlier facts "
                             "most similar to it, or after the facts right before it (runs)")
    parser.add_argument("--run-tokens", type=int, default=512,
                        help="R: with --context-source recent, facts added together are "
                             "encoded in runs of up to R tokens")
    parser.add_argument("--slab-mib", type=int, default=256, help="fact KV per worker (MiB)")
    parser.add_argument("--host-tier-mib", type=int, default=None,
                        help="pinned host RAM per worker for KV evicted from the slab (default: "
                             "a quarter of the available RAM, at most 4 slabs; 0 = none)")
    parser.add_argument("--disk-tier", default=None, metavar="FOLDER",
                        help="write every fact's KV to FOLDER and load it from there after "
                             "eviction or a restart instead of encoding it again")
    parser.add_argument("--embedding-model", default=DEFAULT_EMBEDDING_MODEL,
                        help="sentence-transformers name or folder (default: offline MiniLM)")
    parser.add_argument("--dedupe-threshold", type=_number_or_none, default=0.95,
                        help="cosine at which an added fact is a duplicate; 'none' stores all")
    parser.add_argument("--max-add-facts", type=int, default=DEFAULT_MAX_ADD_FACTS,
                        help="facts or turns one POST /v1/memories may add (larger: 413)")
    parser.add_argument("--replica-id", default=None,
                        help="a name for this server, reported in each response's memory "
                             "field (which replica behind a router answered)")
    parser.add_argument("--allowed-hosts", default=None, metavar="NAME,...",
                        help="Host names the server answers besides loopback ones, or '*' "
                             "(default: any with --api-keys, loopback only without: DNS "
                             "rebinding; server/hosts.py)")
    parser.add_argument("--max-served-users", type=int, default=DEFAULT_MAX_SERVED_USERS,
                        help="users of a shared store whose facts this server holds at once "
                             "(the least recently served beyond it are read again on use)")
    parser.add_argument("--half-scan-min-rows", type=int, default=None,
                        help="facts of one user from which searches scan float16 copies (1.5x "
                             "the index memory; default: the device's, 0 = never)")
    parser.add_argument("--sync-adds", action="store_true",
                        help="a chat's memory.add and write-back wait for the facts' "
                             "embedding and KV (default: stored at once, the rest queued)")
    parser.add_argument("--max-queued-facts", type=int, default=DEFAULT_MAX_QUEUED_FACTS,
                        help="facts of asynchronous adds that may wait at once (more: 429)")
    parser.add_argument("--search-mode", choices=SEARCH_MODES, default=DEFAULT_SEARCH_MODE,
                        help="how a request's facts are found: keywords and embeddings "
                             "(hybrid) or embeddings only (vector); a search may pass its own")
    parser.add_argument("--hide-older-versions", choices=HIDE_OLDER_VERSIONS,
                        default=DEFAULT_HIDE_OLDER_VERSIONS,
                        help="leave older versions of a found fact out of a request whose "
                             "question asks about the present (now), of every request "
                             "(always: facts that are profile slots), or of none (never)")
    parser.add_argument("--date-facts", action="store_true",
                        help="serve each fact with the day it became true ('[8 May 2023] ...'), "
                             "written into its KV and its text alike")
    parser.add_argument("--recency-weight", type=float, default=0.0,
                        help="newer facts get up to this much added to their relevance when a "
                             "request's facts are chosen (0: off)")
    parser.add_argument("--recency-half-life-days", type=float, default=30.0,
                        help="days over which the recency bonus halves")
    parser.add_argument("--neighbor-share", type=float, default=DEFAULT_NEIGHBOR_SHARE,
                        help="share of a request's k given to the facts added right beside its "
                             "best facts (the turns around a matching turn; 0: off)")
    parser.add_argument("--keyword-context", action="store_true",
                        help="a fact is also matched by the words of the facts of its session "
                             "added right before it (a reply by its question's words)")
    parser.add_argument("--on-expiry", choices=ON_EXPIRY, default="hide",
                        help="an expired fact is never served; its row is kept hidden (hide, "
                             "as mem0) or deleted by the sweeper (delete, as LangGraph's TTL)")
    parser.add_argument("--expiry-sweep-s", type=_number_or_none, default=DEFAULT_EXPIRY_SWEEP_S,
                        help="seconds between expiry sweeps ('none': expired facts leave "
                             "serving when their user is next read)")
    return parser



def _number_or_none(value: str) -> float | None:
    """--dedupe-threshold, --expiry-sweep-s: a float, or 'none' (main checks the range)."""
    return None if value.lower() == "none" else float(value)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our options (the model given first, as `vllm serve MODEL`, or by --model) and vLLM's.

    Raises:
        ConfigError: two different models.
    """
    argv = list(argv)
    first = argv.pop(0) if argv and not argv[0].startswith("-") else None
    ours, rest = our_parser().parse_known_args(argv)
    if first is not None and ours.model is not None and first != ours.model:
        raise ConfigError(f"two models: {first!r} and --model {ours.model!r}; give one")
    ours.model = first or ours.model or "small"
    return ours, rest


def main(argv: list[str]) -> int:
    """Parse, check and serve until stopped."""
    ours, rest = parse(argv)
    if os.environ.get("VLLM_SERVER_DEV_MODE", "0") not in ("", "0", "false", "False"):
        raise ConfigError("VLLM_SERVER_DEV_MODE exposes /collective_rpc (the slab's control "
                          "calls) to every client; unset it")
    check_dedupe_threshold(ours.dedupe_threshold)  # before vLLM starts, not after
    check_half_scan_min_rows(ours.half_scan_min_rows)
    check_max_served_users(ours.max_served_users)
    check_expiry(ours.on_expiry, ours.expiry_sweep_s)
    check_neighbor_share(ours.neighbor_share)
    if ours.max_add_facts < 1:
        raise ConfigError(f"--max-add-facts {ours.max_add_facts} must be at least 1")
    keys = ApiKeys.load(ours.api_keys) if ours.api_keys else None
    check_bind(ours.host, keys)
    ours.hosts = AllowedHosts.for_server(ours.allowed_hosts, keys is not None)
    plan_secret()  # in the environment before vLLM starts its processes: they inherit it
    args, config = vllm_args(ours, rest)
    # uvloop, as `vllm serve` runs: on asyncio's own loop every hop between vLLM's engine
    # client (ZMQ), the tokenizer threads and the HTTP stream waits longer, which cost a
    # streamed chat 4x its TTFT on the CPU backend (docs/benchmarks.md, the defaults' figures).
    try:
        import uvloop  # a dependency of vLLM (not on every platform)
    except ImportError:
        asyncio.run(run(args, config, keys, ours))
    else:
        uvloop.run(run(args, config, keys, ours))
    return 0


def vllm_args(ours: argparse.Namespace, rest: list[str]) -> tuple[argparse.Namespace,
                                                                   EngineConfig]:
    """VLLM's serve arguments with InferScale's connector forced, and the EngineConfig."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from inferscale_engine.model.check import check_model, connector_config
    from inferscale_engine.model.resolve import resolve_model
    from inferscale_engine.runtime.runner import engine_kwargs
    from inferscale_engine.server.vllm_compat import make_arg_parser, validate_parsed_serve_args

    model, dtype = resolve_model(ours.model)
    parser = make_arg_parser(FlexibleArgumentParser(prog="inferscale serve"))
    args = parser.parse_args(["--model", str(model), *rest])
    args.host, args.port = ours.host, ours.port
    if not args.served_model_name:  # clients name the model's folder, not its path
        args.served_model_name = [os.path.basename(os.path.normpath(str(model)))]
    config = EngineConfig(
        model=str(model), dtype=args.dtype if args.dtype != "auto" else dtype,
        kv_cache_dtype=args.kv_cache_dtype or "auto",
        max_model_len=args.max_model_len or 4096, context_window_tokens=ours.window,
        context_run_tokens=ours.run_tokens, context_source=ours.context_source,
        slab_capacity_bytes=ours.slab_mib * 2**20,
        host_tier_bytes=None if ours.host_tier_mib is None else ours.host_tier_mib * 2**20,
        disk_tier_path=ours.disk_tier,
        enable_prefix_caching=args.enable_prefix_caching is not False,
        tensor_parallel_size=args.tensor_parallel_size,
        data_parallel_size=getattr(args, "data_parallel_size", 1) or 1,
        load_format=args.load_format,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        enforce_eager=args.enforce_eager or None)
    hf_config, _ = check_model(config)
    forced = engine_kwargs(config, connector_config(config, hf_config))
    for name in ("dtype", "max_model_len", "enforce_eager", "kv_transfer_config",
                 "worker_extension_cls", "kv_cache_memory_bytes"):
        if name in forced:
            setattr(args, name, forced[name])
    validate_parsed_serve_args(args)
    return args, config


async def run(args: argparse.Namespace, config: EngineConfig, keys: ApiKeys | None,
              ours: argparse.Namespace) -> None:
    """Start vLLM's engine, the Memory over it, and serve HTTP until shutdown."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from inferscale_engine.server.vllm_compat import (
        build_app,
        build_async_engine_client_from_engine_args,
        init_app_state,
        serve_http,
        setup_server,
    )

    _, sock = setup_server(args, reuse_port=False)
    async with build_async_engine_client_from_engine_args(
            AsyncEngineArgs.from_cli_args(args)) as client:
        loop = asyncio.get_running_loop()
        memory = await asyncio.to_thread(open_memory, config, ours, client, loop)
        supported = await client.get_supported_tasks()
        app = build_app(args, supported, client.model_config)
        await init_app_state(client, app.state, args, supported)
        metrics = install(app, memory, keys, ours.k, ours.max_add_facts, ours.replica_id,
                          ours.hosts, not ours.sync_adds)
        try:
            shutdown = await serve_http(
                app, sock=sock, host=args.host, port=args.port,
                log_level=args.uvicorn_log_level,
                access_log=not args.disable_uvicorn_access_log,
                http=BoundedHeadProtocol.counting(app.state.inferscale.refusals))
        finally:
            metrics.stop()
            await app.state.inferscale.drain()
            app.state.inferscale.close()
            await asyncio.to_thread(memory.close)
    # vLLM's order (launchers/api_server/entry.py): await the HTTP server's shutdown, then
    # close the socket; closing first made every shutdown end in a ValueError traceback.
    try:
        await shutdown
    finally:
        sock.close()


def open_memory(config: EngineConfig, ours: argparse.Namespace, client: Any,
                loop: asyncio.AbstractEventLoop) -> Any:
    """The Memory over the server's AsyncLLM (called in a worker thread)."""
    from inferscale_engine.memory import Memory, MemoryConfig
    from inferscale_engine.memory.store.sql import is_postgres_url
    from inferscale_engine.runtime.runner import AsyncRunner

    # Replicas share a PostgreSQL store: each reads its users on first use, not every user of
    # the cluster at start; an embedded SQLite store is this server's alone and encoded at start.
    startup = "lazy" if is_postgres_url(str(ours.db)) else "encode"
    return Memory.from_config(MemoryConfig(engine=config, db_path=ours.db, startup=startup,
                                           embedding_model=ours.embedding_model,
                                           dedupe_threshold=ours.dedupe_threshold,
                                           half_scan_min_rows=ours.half_scan_min_rows,
                                           max_served_users=ours.max_served_users,
                                           max_queued_facts=ours.max_queued_facts,
                                           search_mode=ours.search_mode,
                                           hide_older_versions=ours.hide_older_versions,
                                           date_facts=ours.date_facts,
                                           recency_weight=ours.recency_weight,
                                           recency_half_life_days=ours.recency_half_life_days,
                                           neighbor_share=ours.neighbor_share,
                                           keyword_context=ours.keyword_context,
                                           on_expiry=ours.on_expiry,
                                           expiry_sweep_s=ours.expiry_sweep_s),
                              runner=lambda _config, _connector: AsyncRunner(client, loop))


def _mount_mcp(app: FastAPI, memory: Any, hosts: AllowedHosts, max_add_facts: int) -> None:
    """The MCP tools at /mcp (mcp_http.py), when the `mcp` SDK is installed."""
    try:
        from inferscale_engine.server import mcp_http
    except ImportError as exc:
        logger.warning("no MCP endpoint at /mcp: %s; install it with: pip install "
                       "'inferscale-kv[mcp]'", exc)
        return
    mcp_http.mount(app, memory, hosts, max_add_facts)


def install(app: FastAPI, memory: Any, keys: ApiKeys | None, default_k: int,
            max_add_facts: int = DEFAULT_MAX_ADD_FACTS, replica_id: str | None = None,
            hosts: AllowedHosts | None = None, async_adds: bool = True) -> Any:
    """The seam, routes, auth middleware and metrics on vLLM's app; returns the metrics.

    `hosts`: the Host names answered (default: AllowedHosts.for_server without the flag).
    `async_adds`: chat-borne adds return once stored (SeamState).
    """
    from inferscale_engine.server import mem0_api, routes, transfer_api, ui
    from inferscale_engine.server.metrics import MemoryMetrics
    from inferscale_engine.server.seam import (
        MemoryServingChat,
        MemoryServingCompletion,
        SeamState,
    )
    from inferscale_engine.server.ui import api, page

    state = SeamState(memory, default_k, max_add_facts, replica_id, async_adds)
    app.state.inferscale = state
    hosts = hosts or AllowedHosts.for_server(None, keys is not None)
    app.state.allowed_hosts = hosts
    for name, cls in (("openai_serving_chat", MemoryServingChat),
                      ("openai_serving_completion", MemoryServingCompletion)):
        base = getattr(app.state, name, None)
        if base is not None:
            setattr(app.state, name, cls.adopt(base, state))
    app.include_router(transfer_api.router)  # before routes': /v1/memories/{memory_id}
    app.include_router(routes.router)
    app.include_router(mem0_api.router)
    app.include_router(page.router)
    app.include_router(api.router)
    _mount_mcp(app, memory, hosts, max_add_facts)

    @app.exception_handler(HttpError)
    async def http_error(request: Request, exc: HttpError) -> JSONResponse:
        return routes.http_error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def framework_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI answers a body it cannot decode (invalid UTF-8) with a bare 400 "There was
        # an error parsing the body"; vLLM handles only fastapi's HTTPException subclass.
        message = str(exc.detail)
        if exc.status_code == 400 and "parsing the body" in message:
            message = ("the request body could not be decoded: send JSON encoded as UTF-8 "
                       "with Content-Type: application/json")
        return routes.http_error_response(HttpError(exc.status_code, message))

    # vLLM's app already built its middleware stack; Starlette rebuilds it on first use.
    app.middleware_stack = None

    @app.middleware("http")
    async def gate(request: Request, call_next: Any) -> Any:
        path = request.url.path
        try:  # every path, before the key: a rebinding page reaches them all
            hosts.check(request.headers.get("host"))
        except HttpError as exc:
            return ui.secured(path, routes.http_error_response(exc))
        if keys is not None and path not in PUBLIC_PATHS and not ui.public(path):
            try:
                principal = request.state.principal = keys.principal(request.headers)
                if not principal.admin and not tenant_route(path) and any(
                        route.matches(request.scope)[0] is Match.FULL for route in app.routes):
                    raise HttpError(403, f"{path} needs an admin API key", "permission_error")
            except HttpError as exc:
                return ui.secured(path, routes.http_error_response(exc))
        response = await call_next(request)
        for name, value in getattr(request.state, "inferscale_headers", {}).items():
            response.headers[name] = value
        return ui.secured(path, response)

    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES,  # before the key check
                       paths=dict.fromkeys(FILTER_PATHS, MAX_FILTER_BODY_BYTES))
    app.add_middleware(CountRefusals, counts=state.refusals)  # outermost: counts them all
    metrics = MemoryMetrics(memory, state.refusals)
    metrics.start()
    return metrics
