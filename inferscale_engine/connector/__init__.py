"""InferScaleConnector: the facade vLLM loads in every process (kv_connector_module_path).

vLLM builds one instance per role; the facade builds only the half for its role and forwards
vLLM's hooks to it. Hook order and what each may do (vLLM 0.26 and 0.32):

Scheduler side (EngineCore process)
  get_num_new_matched_tokens  no side effects (may be called repeatedly): plan tokens to claim
  update_state_after_alloc    remember loads / save tracking for the admitted request
  build_connector_meta        every step; cheap when idle; LoadSpec / CaptureSpec lists
  request_finished            drop per-request state; report the plan's outcome
Worker side (every worker process)
  register_kv_caches          detect the paged layout, allocate the slab
  start_load_kv               inject this step's loads, all layers, before the forward
  wait_for_layer_load / save_kv_layer   nothing (per-layer hooks are skipped by CUDA graphs)
  wait_for_save               capture fact spans computed in this step into the slab
  get_block_ids_with_load_errors        blocks vLLM must recompute (entry missing or foreign)

Its modules, by side ("load" is vLLM's word for what we call inject):

  scheduler.py     InferScaleScheduler (scheduler side): plans checked, tokens claimed
  metadata.py      the step record the scheduler builds and the worker reads
  worker.py        InferScaleWorker (worker side): the slab, inject and capture
  slab.py          KVSlab: the worker's GPU tier of fact KV, in pages
  paged.py         where a token's K and V live in vLLM's paged cache, per backend
  staging.py       host buffers a step's injection indices are written into
  worker_tiers.py  the worker side of the lower tiers: host RAM and disk entries
  control.py       SlabControl: the worker extension the app calls (free, stats, tiers)

This module is imported by every vLLM process: it may import only plan, rope, config, errors,
kernels, vLLM and torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from inferscale_engine.config import ConnectorConfig
from inferscale_engine.connector.metadata import InferScaleMetadata
from inferscale_engine.connector.scheduler import InferScaleScheduler
from inferscale_engine.connector.worker import InferScaleWorker

if TYPE_CHECKING:
    from vllm.attention.backends.abstract import AttentionMetadata
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = ["InferScaleConnector"]


class InferScaleConnector(KVConnectorBase_V1):
    """Injects stored fact KV into vLLM's paged cache; captures new facts' KV."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig | None = None) -> None:
        # vLLM 0.26 may pass kv_cache_config=None; the base class stores it as given.
        super().__init__(vllm_config=vllm_config, role=role,
                         kv_cache_config=kv_cache_config)  # type: ignore[arg-type]
        config = ConnectorConfig.from_dict(self._kv_transfer_config.kv_connector_extra_config)
        self.scheduler = (InferScaleScheduler(vllm_config, config)
                          if role == KVConnectorRole.SCHEDULER else None)
        self.worker = (InferScaleWorker(vllm_config, config)
                       if role == KVConnectorRole.WORKER else None)

    # ==============================
    # Worker-side methods
    # ==============================
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self.worker is not None
        self.worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        assert self.worker is not None
        self.worker.start_load_safely(self._metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: AttentionMetadata, **kwargs: Any) -> None:
        return

    def wait_for_save(self) -> None:
        assert self.worker is not None
        self.worker.finish_step(self._metadata())

    def get_block_ids_with_load_errors(self) -> set[int]:
        assert self.worker is not None
        return self.worker.take_failed_block_ids()

    def _metadata(self) -> InferScaleMetadata:
        meta: KVConnectorMetadata = self._get_connector_metadata()
        assert isinstance(meta, InferScaleMetadata)
        return meta

    # ==============================
    # Scheduler-side methods
    # ==============================
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int
                                   ) -> tuple[int | None, bool]:
        assert self.scheduler is not None
        return self.scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        assert self.scheduler is not None
        self.scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        assert self.scheduler is not None
        return self.scheduler.build_connector_meta(scheduler_output)

    def request_finished(self, request: Request, block_ids: list[int]
                         ) -> tuple[bool, dict[str, Any] | None]:
        assert self.scheduler is not None
        return False, self.scheduler.request_finished(request)
