"""The inspector's server panel: a JSON view of the server's own Prometheus metrics.

The same registry /metrics serves (vLLM's, with InferScale's collector in it): the slab and
tier gauges and counters of server/metrics.py, and vLLM's request counters and time-to-first-
token histogram. Values are summed over labels (engines, finish reasons); rates are the page's
(differences between two polls).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any

SUMMED = (
    "inferscale_facts", "inferscale_resident_facts", "inferscale_users",
    "inferscale_host_facts", "inferscale_slab_tokens", "inferscale_slab_capacity_tokens",
    "inferscale_slab_free_pages", "inferscale_host_tokens", "inferscale_host_capacity_tokens",
    "inferscale_injected_requests_total", "inferscale_injected_tokens_total",
    "inferscale_returned_facts_total", "inferscale_host_hits_total",
    "inferscale_disk_hits_total", "inferscale_disk_misses_total",
    "inferscale_reencoded_facts_total", "inferscale_evicted_facts_total",
    "inferscale_demoted_facts_total", "inferscale_encoded_facts_total",
    "inferscale_fallback_text_evicted_total", "inferscale_fallback_rejected_total",
    "inferscale_fallback_mismatch_total", "inferscale_load_errors_total",
    "inferscale_repaired_facts_total", "inferscale_refused_requests_total",
    "vllm:request_success_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    "vllm:kv_cache_usage_perc",
)
"""What the panel shows (a metric missing from this vLLM version is left out)."""
TTFT = "vllm:time_to_first_token_seconds"


def registry() -> Any:
    """The registry vLLM's /metrics serves (a multiprocess one when configured)."""
    try:
        from vllm.v1.metrics.prometheus import get_prometheus_registry
    except ImportError:  # pragma: no cover - other vLLM layouts
        from prometheus_client import REGISTRY

        return REGISTRY
    return get_prometheus_registry()


def snapshot(source: Any = None) -> dict[str, Any]:
    """{time, values: {metric: value}, ttft: {buckets: [[le, count]], count, sum}}.

    TTFT buckets are cumulative, as Prometheus keeps them; le is null for +Inf.
    """
    wanted = set(SUMMED)
    values: dict[str, float] = defaultdict(float)
    buckets: dict[float, float] = defaultdict(float)
    ttft = {"count": 0.0, "sum": 0.0}
    for family in (source or registry()).collect():
        for sample in family.samples:
            if sample.name in wanted:
                values[sample.name] += sample.value
            elif sample.name == TTFT + "_bucket":
                buckets[float(sample.labels["le"])] += sample.value
            elif sample.name in (TTFT + "_count", TTFT + "_sum"):
                ttft[sample.name.rsplit("_", 1)[1]] += sample.value
    return {"time": time.time(), "values": dict(values),
            "ttft": {"buckets": [[None if math.isinf(le) else le, count]
                                 for le, count in sorted(buckets.items())], **ttft}}
