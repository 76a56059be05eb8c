"""A KV connector that does nothing: vLLM's own connector cost, without ours.

serve_overhead.py starts a third `vllm serve` with it, so the time a loaded connector costs
vLLM (its per-step and per-layer connector calls, the connector metadata each step) is told
apart from what InferScale's connector and seam add on top. Every hook returns at once: it
matches no tokens, loads and saves nothing.

  vllm serve MODEL --kv-transfer-config '{"kv_connector": "NoopConnector",
      "kv_connector_module_path": "benchmarks.noop_connector", "kv_role": "kv_both"}'
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)


class NoopConnector(KVConnectorBase_V1):
    """Every hook is a no-op; the scheduler side matches no external tokens."""

    # ---- worker side -----------------------------------------------------------------
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Nothing to load."""

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Nothing is in flight."""

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        """Nothing is saved."""

    def wait_for_save(self) -> None:
        """Nothing is in flight."""

    # ---- scheduler side --------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> tuple[int, bool]:
        """No external tokens, never asynchronous."""
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        """Nothing was claimed."""

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        """An empty metadata object per step, as every connector sends."""
        return KVConnectorMetadata()
