"""Runners: how the engine drives vLLM.

VllmRunner owns a co-located vllm.LLM (the embedded default); AsyncRunner drives the AsyncLLM
of `inferscale serve` (vLLM's own server) from worker threads. Both start vLLM with
InferScale's connector and worker extension (engine_kwargs).

WorkerClient is the one typed way to call the worker extension (connector/control.py) on every
worker: the method names vLLM's collective_rpc needs are spelled here only.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from inferscale_engine.config import ConnectorConfig, EngineConfig
from inferscale_engine.errors import ConfigError
from inferscale_engine.protocol.tier_control import DiskRead, DiskWrite, Move

logger = logging.getLogger(__name__)
_EXTENSION = "inferscale_engine.connector.control.SlabControl"


class WorkerClient:
    """Typed calls to SlabControl on every worker; each returns one result per worker."""

    def __init__(self, rpc: Callable[[str, tuple[Any, ...]], list[Any]]) -> None:
        self._rpc = rpc

    def _call(self, method: str, *args: Any) -> list[Any]:
        return list(self._rpc(method, args))

    def stats(self) -> list[dict[str, int]]:
        """Slab occupancy and connector counters of each worker."""
        return self._call("inferscale_stats")

    def free(self, slab_keys: list[int]) -> list[int]:
        """Drop slab entries; per worker, how many were resident."""
        return self._call("inferscale_free", list(slab_keys)) if slab_keys else []

    def resident(self, slab_keys: list[int]) -> list[list[bool]]:
        """Per worker, whether each slab key has a captured entry."""
        return self._call("inferscale_resident", list(slab_keys))

    def read_entry(self, slab_key: int) -> list[tuple[Any, Any, int]]:
        """Per worker, the stored K, V ([L, n, H, D] on the CPU) and origin of one entry."""
        return self._call("inferscale_read_entry", slab_key)

    def read_slots(self, slots: list[int]) -> list[tuple[Any, Any]]:
        """Per worker, K and V in paged `slots` of every layer ([L, T, H, D], CPU)."""
        return self._call("inferscale_read_slots", list(slots))

    def demote(self, moves: Sequence[Move]) -> list[list[bool]]:
        """Per worker, which moves from the slab to host RAM were done."""
        return self._call("inferscale_demote", _wire(moves)) if moves else []

    def promote(self, moves: Sequence[Move]) -> list[list[bool]]:
        """Per worker, which moves from host RAM back into the slab were done."""
        return self._call("inferscale_promote", _wire(moves)) if moves else []

    def persist(self, items: Sequence[DiskWrite]) -> list[list[bool]]:
        """Per worker, which entries were queued for disk."""
        return self._call("inferscale_persist", _wire(items)) if items else []

    def load(self, items: Sequence[DiskRead]) -> list[list[str]]:
        """Per worker, per entry: '' if loaded into the slab, else why not."""
        return self._call("inferscale_load", _wire(items)) if items else []

    def forget(self, host_keys: list[int], names: list[str]) -> list[int]:
        """Drop host entries and delete disk files; per worker, how many existed."""
        return self._call("inferscale_forget", host_keys, names) if host_keys or names else []

    def flush_disk(self) -> list[Any]:
        """Wait on every worker until its queued disk writes are done."""
        return self._call("inferscale_flush_disk")

    def recent_loads(self) -> list[list[tuple[str, list[int]]]]:
        """Per worker, (request id, paged slots written) of its last few injections."""
        return self._call("inferscale_recent_loads")


def _wire(records: Sequence[Move | DiskWrite | DiskRead]) -> list[Any]:
    return [r.to_wire() for r in records]


class Runner(Protocol):
    """What the engine needs from a runner (VllmRunner, AsyncRunner)."""

    llm: Any
    workers: WorkerClient
    """Control calls on every worker of every engine."""
    in_process: bool
    """vLLM's scheduler runs in this process (plans may be handed over by reference)."""

    def run(self, prompts: list[Any], params: list[Any], use_tqdm: bool = False,
            ranks: Sequence[int] | None = None) -> list[Any]:
        """The final RequestOutput of each prompt, in order.

        `ranks`: the data-parallel engine of each prompt (None: the only engine).
        """
        ...

    def stream(self, prompt: Any, params: Any, rank: int = 0) -> Iterator[Any]:
        """One request's cumulative RequestOutputs as vLLM produces them (the last finished).

        Closing the iterator early aborts the request.
        """
        ...

    def workers_for(self, rank: int) -> WorkerClient:
        """Control calls on the workers of one data-parallel engine."""
        ...

    def close(self) -> None:
        """Release what the runner owns."""
        ...


class VllmRunner:
    """Builds the engine, runs batches of prompts, reaches the workers, shuts down cleanly."""

    def __init__(self, config: EngineConfig, connector: ConnectorConfig) -> None:
        if config.data_parallel_size > 1:
            raise ConfigError(
                f"data_parallel_size={config.data_parallel_size} needs vLLM's AsyncLLM: run "
                f"`inferscale serve --data-parallel-size {config.data_parallel_size}` (the "
                "embedded vllm.LLM runs one engine per process)")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if config.multiprocessing else "0"
        from vllm import LLM

        self.llm = LLM(**engine_kwargs(config, connector))
        self.in_process = not config.multiprocessing
        self.workers = WorkerClient(lambda method, args: self.llm.collective_rpc(method,
                                                                                 args=args))

    def workers_for(self, rank: int) -> WorkerClient:
        """The workers of the one engine (rank 0)."""
        if rank != 0:
            raise ValueError(f"an embedded engine has no data-parallel rank {rank}")
        return self.workers

    def run(self, prompts: list[Any], params: list[Any], use_tqdm: bool = False,
            ranks: Sequence[int] | None = None) -> list[Any]:
        """llm.generate; if it fails, abort what it left in the engine so it keeps serving."""
        if ranks is not None and any(ranks):
            raise ValueError("an embedded engine has only data-parallel rank 0")
        try:
            return self.llm.generate(prompts, params, use_tqdm=use_tqdm)
        except BaseException:
            self._abort_all()
            raise

    def stream(self, prompt: Any, params: Any, rank: int = 0) -> Iterator[Any]:
        """One request stepped through vllm.LLM's engine, its outputs as they come."""
        if rank:
            raise ValueError("an embedded engine has only data-parallel rank 0")
        engine = self.llm.llm_engine
        request_id = f"inferscale-stream-{uuid.uuid4().hex}"  # outputs carry this id
        engine.add_request(request_id, prompt, _cumulative(params))
        finished = False
        try:
            while not finished and engine.has_unfinished_requests():
                for output in engine.step():
                    if output.request_id == request_id:
                        finished = output.finished
                        yield output
        finally:
            if not finished:  # failed, or closed early: abort it, keep serving
                self._abort_all()

    def _abort_all(self) -> None:
        """Abort every request the engine still tracks, then drain it.

        A request that failed on its way in (e.g. extra_args that cannot be serialized for the
        engine process) is registered with the output processor but never reached EngineCore;
        vLLM aborts the requests it added before it, not that one. The processor keys its
        states by vLLM's internal ids, hence internal=True; with them gone the engine has
        nothing to wait for, and the next call is served.
        """
        engine = self.llm.llm_engine
        states = getattr(getattr(engine, "output_processor", None), "request_states", {})
        if states:
            engine.abort_request(list(states), internal=True)
        while engine.has_unfinished_requests():
            engine.step()

    def close(self) -> None:
        """Finish queued disk writes, shut vLLM down, free what an in-process engine leaves."""
        _flush_disk(self.workers)
        engine = self.llm.llm_engine
        shutdown = getattr(engine, "shutdown", None) or getattr(
            getattr(engine, "engine_core", None), "shutdown", None)
        if shutdown is not None:
            shutdown()
        del self.llm, engine
        _release_vllm_process_state()


def _cumulative(params: Any) -> Any:
    """A copy of SamplingParams whose outputs carry everything so far, at every step."""
    from vllm.sampling_params import RequestOutputKind

    copy = params.clone()
    copy.output_kind = RequestOutputKind.CUMULATIVE
    return copy


def _release_vllm_process_state() -> None:
    """Free what an in-process (MP=0) vLLM engine leaves behind.

    vLLM freezes the garbage collector after start-up and keeps a process-global KV connector
    and distributed state; without this, GPU memory and the connector outlive the engine and
    the next in-process engine cannot start.
    """
    try:
        from vllm.distributed.kv_transfer import ensure_kv_transfer_shutdown
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    except ImportError:  # pragma: no cover - other vLLM layouts
        gc.unfreeze()
        gc.collect()
        return
    ensure_kv_transfer_shutdown()
    cleanup_dist_env_and_memory()


def engine_kwargs(config: EngineConfig, connector: ConnectorConfig) -> dict[str, Any]:
    """VLLM engine arguments (vllm.LLM / AsyncEngineArgs) with InferScale's connector."""
    from vllm.config import KVTransferConfig
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    if on_cpu:
        # Use every core (vLLM reserves one by default when it runs in this process).
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        if config.tensor_parallel_size > 1:
            _bind_cpu_ranks(config.tensor_parallel_size)
    kwargs: dict[str, Any] = dict(
        model=config.model,
        tokenizer=config.tokenizer or config.model,
        dtype=config.dtype,
        kv_cache_dtype=config.kv_cache_dtype,
        max_model_len=config.max_model_len,
        enforce_eager=on_cpu if config.enforce_eager is None else config.enforce_eager,
        enable_prefix_caching=config.enable_prefix_caching,
        tensor_parallel_size=config.tensor_parallel_size,
        data_parallel_size=config.data_parallel_size,
        load_format=config.load_format,
        seed=config.seed,
        kv_transfer_config=KVTransferConfig(
            kv_connector="InferScaleConnector",
            kv_connector_module_path="inferscale_engine.connector",
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config=connector.to_dict(),
        ),
        worker_extension_cls=_EXTENSION,
        # One KV cache group for all layers, so injected facts keep their blocks in sliding-
        # window layers too (Gemma 2 / 3; model/check.py). vLLM 0.26 and 0.32 already turn the
        # hybrid manager off for a connector without SupportsHMA; this does not depend on it.
        disable_hybrid_kv_cache_manager=True,
    )
    if on_cpu:
        kwargs["kv_cache_memory_bytes"] = config.kv_cache_memory_bytes or 2**30
    elif config.kv_cache_memory_bytes:
        kwargs["kv_cache_memory_bytes"] = config.kv_cache_memory_bytes
    else:
        kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization
    for name in ("block_size", "max_num_batched_tokens", "max_num_seqs"):
        if getattr(config, name) is not None:
            kwargs[name] = getattr(config, name)
    kwargs.update(config.vllm_overrides)
    return kwargs


class AsyncRunner:
    """Drives an AsyncLLM running on an event loop, from the engine's (worker) threads.

    `inferscale serve` runs vLLM's own OpenAI server; the Memory and Engine around it are
    synchronous and run in threads (asyncio.to_thread), and this runner hands their requests
    to the server's loop and waits for them. Never call it from the loop's own thread.
    """

    def __init__(self, engine_client: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.in_process = False  # AsyncLLM's EngineCore runs in a process of its own
        self.llm = engine_client
        self._loop = loop
        core = getattr(engine_client, "engine_core", None)
        self._engines: list[Any] = list(getattr(core, "core_engines", None) or [None])
        """vLLM's identities of its data-parallel engines (one entry without DP)."""
        self.workers = WorkerClient(lambda method, args: [
            result for rank in range(len(self._engines))
            for result in self._rpc(rank, method, args)])

    @property
    def data_parallel_size(self) -> int:
        """Engines behind the AsyncLLM."""
        return len(self._engines)

    def workers_for(self, rank: int) -> WorkerClient:
        """The workers of one data-parallel engine."""
        if not 0 <= rank < len(self._engines):
            raise ValueError(f"no data-parallel rank {rank} (of {len(self._engines)})")
        return WorkerClient(lambda method, args: self._rpc(rank, method, args))

    def _rpc(self, rank: int, method: str, args: tuple[Any, ...]) -> list[Any]:
        if len(self._engines) == 1:
            return list(self._wait(self.llm.collective_rpc(method, args=args)))
        # AsyncLLM.collective_rpc fans out to every engine but returns engine 0's results
        # only (vLLM 0.26 and 0.32, core_client.py): address the engine by its identity.
        core = self.llm.engine_core
        return list(self._wait(core._call_utility_async(  # noqa: SLF001
            "collective_rpc", method, None, args, None, engine=self._engines[rank])))

    def run(self, prompts: list[Any], params: list[Any], use_tqdm: bool = False,
            ranks: Sequence[int] | None = None) -> list[Any]:
        """The final RequestOutput of every prompt (submitted together, one batch)."""
        pinned = list(ranks) if ranks is not None and len(self._engines) > 1 else [None] * len(
            prompts)

        async def all_of() -> list[Any]:
            return await asyncio.gather(*(self._one(p, q, r) for p, q, r in zip(
                prompts, params, pinned, strict=True)))
        return list(self._wait(all_of()))

    async def _one(self, prompt: Any, params: Any, rank: int | None) -> Any:
        final = None
        async for output in self.llm.generate(prompt, params, f"inferscale-{uuid.uuid4().hex}",
                                              data_parallel_rank=rank):
            final = output
        return final

    def stream(self, prompt: Any, params: Any, rank: int = 0) -> Iterator[Any]:
        """One request on the AsyncLLM, each output handed to this thread as it comes."""
        outputs = self.llm.generate(prompt, _cumulative(params),
                                    f"inferscale-{uuid.uuid4().hex}",
                                    data_parallel_rank=rank if len(self._engines) > 1 else None)
        try:
            while True:
                try:
                    output = self._wait(outputs.__anext__())
                except StopAsyncIteration:
                    return
                yield output
        finally:  # closed early: closing the generator aborts the request in vLLM
            self._wait(outputs.aclose())

    def _wait(self, awaitable: Any) -> Any:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            raise RuntimeError("AsyncRunner was called on the server's event loop; call the "
                               "Memory/Engine through asyncio.to_thread")
        async def wrapped() -> Any:
            return await awaitable
        return asyncio.run_coroutine_threadsafe(wrapped(), self._loop).result()

    def close(self) -> None:
        """Finish queued disk writes; the server owns the AsyncLLM and shuts it down."""
        _flush_disk(self.workers)


def _bind_cpu_ranks(world_size: int) -> None:
    """Split this process's cores among vllm-cpu's tensor-parallel workers.

    vllm-cpu binds one NUMA node per worker unless VLLM_CPU_OMP_THREADS_BIND lists each rank's
    cores ('0|1'); a laptop or CI machine has one node, so without this TP > 1 cannot start.
    An explicit VLLM_CPU_OMP_THREADS_BIND is left alone.
    """
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < world_size:
        raise ConfigError(f"tensor_parallel_size={world_size} needs at least {world_size} CPU "
                          f"cores on the CPU backend; this process may use {len(cores)}")
    size = len(cores) // world_size
    groups = [cores[i * size:(i + 1) * size] for i in range(world_size)]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(",".join(map(str, g)) for g in groups)


def _flush_disk(workers: WorkerClient) -> None:
    """Let queued disk-tier writes finish before the workers go (a dead engine: nothing)."""
    try:
        workers.flush_disk()
    except Exception:  # noqa: BLE001 - shutting down: never mask the reason for closing
        logger.debug("disk tier flush at close failed", exc_info=True)
