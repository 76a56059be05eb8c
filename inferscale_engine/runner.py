"""VllmRunner: the co-located vllm.LLM with InferScale's connector, and how to drive it.

WorkerClient is the one typed way to call the worker extension (connector/control.py) on every
worker: the method names vLLM's collective_rpc needs are spelled here only.
"""

from __future__ import annotations

import gc
import os
from typing import Any

from inferscale_engine.config import ConnectorConfig, EngineConfig

_EXTENSION = "inferscale_engine.connector.control.SlabControl"


class WorkerClient:
    """Typed calls to SlabControl on every worker; each returns one result per worker."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm

    def _call(self, method: str, *args: Any) -> list[Any]:
        return list(self._llm.collective_rpc(method, args=args))

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

    def recent_loads(self) -> list[list[tuple[str, list[int]]]]:
        """Per worker, (request id, paged slots written) of its last few injections."""
        return self._call("inferscale_recent_loads")


class VllmRunner:
    """Builds the engine, runs batches of prompts, reaches the workers, shuts down cleanly."""

    def __init__(self, config: EngineConfig, connector: ConnectorConfig) -> None:
        self.llm = _build_llm(config, connector)
        self.workers = WorkerClient(self.llm)

    def run(self, prompts: list[Any], params: list[Any], use_tqdm: bool = False) -> list[Any]:
        """llm.generate; if it fails, abort what it left in the engine so it keeps serving."""
        try:
            return self.llm.generate(prompts, params, use_tqdm=use_tqdm)
        except BaseException:
            engine = self.llm.llm_engine
            states = getattr(getattr(engine, "output_processor", None), "request_states", {})
            if states:
                engine.abort_request(list(states))
            while engine.has_unfinished_requests():
                engine.step()
            raise

    def close(self) -> None:
        """Shut vLLM down and free what an in-process engine leaves behind."""
        engine = self.llm.llm_engine
        shutdown = getattr(engine, "shutdown", None) or getattr(
            getattr(engine, "engine_core", None), "shutdown", None)
        if shutdown is not None:
            shutdown()
        del self.llm, engine
        _release_vllm_process_state()


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


def _build_llm(config: EngineConfig, connector: ConnectorConfig) -> Any:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if config.multiprocessing else "0"
    from vllm import LLM
    from vllm.config import KVTransferConfig
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    if on_cpu:
        # Use every core (vLLM reserves one by default when it runs in this process).
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    kwargs: dict[str, Any] = dict(
        model=config.model,
        tokenizer=config.tokenizer or config.model,
        dtype=config.dtype,
        max_model_len=config.max_model_len,
        enforce_eager=on_cpu if config.enforce_eager is None else config.enforce_eager,
        enable_prefix_caching=config.enable_prefix_caching,
        tensor_parallel_size=config.tensor_parallel_size,
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
    return LLM(**kwargs)
