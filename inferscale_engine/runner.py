"""VllmRunner: the co-located vllm.LLM with InferScale's connector, and how to drive it."""

from __future__ import annotations

import gc
import os
from typing import Any

from inferscale_engine.config import ConnectorConfig, EngineConfig
from inferscale_engine.plan import PARAMS_KEY

RESULT_KEY = PARAMS_KEY + "_result"
"""Key of the connector's per-request verdict in RequestOutput.kv_transfer_params."""


class VllmRunner:
    """Builds the engine, runs batches of prompts, reaches the workers, shuts down cleanly."""

    def __init__(self, config: EngineConfig, connector: ConnectorConfig) -> None:
        self.llm = _build_llm(config, connector)

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

    def rpc(self, method: str, *args: Any) -> list[Any]:
        """Call a SlabControl method on every worker; one result per worker."""
        return self.llm.collective_rpc(method, args=args)

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
        worker_extension_cls="inferscale_engine.control.SlabControl",
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
