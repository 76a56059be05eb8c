"""InferScale's counters on vLLM's /metrics (Prometheus text format).

A collector in prometheus_client's registry (the one vLLM's /metrics serves) reports a snapshot
of Memory.stats(), refreshed by a background thread: the slab lives in vLLM's workers, and a
scrape must never wait on them. /metrics is server-wide, so only admin keys read it (auth.py).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)

_COUNTERS = {
    "injected_tokens": "Prompt tokens whose KV was injected from the slab",
    "injected_requests": "Requests with injected KV",
    "captured_tokens": "Fact tokens captured into the slab",
    "load_errors": "Injections that failed (vLLM recomputed those tokens)",
    "host_bytes_in": "Bytes of fact KV demoted from the slab to host RAM",
    "host_bytes_out": "Bytes of fact KV promoted from host RAM back into the slab",
    "disk_bytes_written": "Bytes of fact KV written to the disk tier",
    "disk_bytes_read": "Bytes of fact KV loaded from the disk tier",
    "disk_write_errors": "Disk tier writes that failed (full disk, unwritable folder)",
}
_PLAN_COUNTERS = {  # counted by the connector's scheduler for every request, whatever its route
    "fallback_rejected": ("plans_rejected", "Plans the connector refused (malformed, forged "
                                            "or replayed)"),
    "fallback_mismatch": ("plans_mismatch", "Authentic plans that did not match their "
                                            "prompt or salt"),
}
_ENGINE_COUNTERS = {
    "encoded_facts": "Facts encoded into the slab",
    "evicted_facts": "Facts whose KV was evicted (still durable)",
    "reencoded_facts": "Facts encoded again on use (in no tier, or a refused disk entry)",
    "returned_facts": "Facts brought back into the slab on use (from any tier, or encoded)",
    "demoted_facts": "Facts evicted from the slab into host RAM",
    "host_hits": "Facts brought back from host RAM (a copy, no prefill)",
    "disk_hits": "Facts loaded from the disk tier (a read, no prefill)",
    "disk_misses": "Facts the disk tier did not have, or refused",
    "disk_refused": "Disk entries refused: corrupt, truncated, or of another model or context",
    "fallback_text_evicted": "Requests served as text because facts could not be resident",
    "repaired_facts": "Facts prefilled as text after the injected ones (suffix repair)",
}

_MEMORY_COUNTERS = {
    "synced_users": "Users read again from a shared store (first use, or another replica "
                    "wrote them)",
    "synced_facts": "Facts registered from a shared store by those reads",
    "released_users": "Users of a shared store let go as the least recently served (their "
                      "state is read again on their next use)",
    "infer_calls": "add(infer=True) calls: the served model extracted facts",
    "infer_invalid": "infer=True calls whose model output was not valid (nothing changed)",
    "queued_adds": "Facts of asynchronous adds stored and queued (embedding and KV to come)",
    "async_added": "Facts of asynchronous adds embedded, encoded and indexed",
    "async_add_refusals": "Asynchronous adds refused with 429: the queue was full",
    "async_add_failures": "Facts whose background work failed (stored, served as text, "
                          "retried at the next start)",
    "resumed_adds": "Pending facts queued again at start-up",
    "pending_served_as_text": "Facts served as text because their KV was not ready yet "
                              "(an asynchronous add still in the queue)",
}


class MemoryMetrics:
    """A prometheus_client collector of the Memory's sizes and counters."""

    def __init__(self, memory: Any, refusals: Counter[int] | None = None,
                 interval_s: float = 2.0) -> None:
        self._memory = memory
        self._refusals = refusals if refusals is not None else Counter()
        self._interval_s = interval_s
        self._snapshot: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refresh_loop, name="inferscale-metrics",
                                        daemon=True)

    def start(self) -> None:
        """Register with prometheus_client's registry and start refreshing."""
        from prometheus_client import REGISTRY

        # The first snapshot is taken by the thread: start() runs on the event loop, where
        # Memory.stats() cannot wait for the workers (AsyncRunner needs the loop free).
        REGISTRY.register(self)
        self._thread.start()

    def stop(self) -> None:
        """Stop refreshing and unregister."""
        from prometheus_client import REGISTRY

        self._stop.set()
        try:
            REGISTRY.unregister(self)
        except KeyError:
            pass

    def refresh(self) -> None:
        """Take a new snapshot (a Memory.stats() call, which asks every worker)."""
        try:
            self._snapshot = self._memory.stats()
        except Exception:  # noqa: BLE001 - metrics must never take the server down
            logger.debug("InferScale metrics refresh failed", exc_info=True)

    def _refresh_loop(self) -> None:
        self.refresh()
        while not self._stop.wait(self._interval_s):
            self.refresh()

    def collect(self) -> Iterator[Any]:
        """prometheus_client's hook: the metrics of the last snapshot."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self._snapshot
        if stats is None:
            return
        totals = stats.engine.worker_totals  # over tensor-parallel ranks
        gauges = {"facts": (stats.num_facts, "Facts in the durable store"),
                  "resident_facts": (stats.num_resident, "Facts whose KV is in the slab"),
                  "users": (stats.num_users, "Users with facts or turns"),
                  "slab_free_pages": (stats.engine.num_free_pages, "Unallocated slab pages"),
                  "slab_tokens": (totals.get("num_tokens", 0), "Tokens stored in the slab"),
                  "slab_capacity_tokens": (totals.get("capacity_tokens", 0),
                                           "Tokens the slab holds"),
                  "host_facts": (stats.engine.num_host_facts, "Facts whose KV waits in host RAM"),
                  "host_tokens": (totals.get("host_num_tokens", 0),
                                  "Tokens stored in the host-RAM tier"),
                  "host_capacity_tokens": (totals.get("host_capacity_tokens", 0),
                                           "Tokens the host-RAM tier holds")}
        gauges["served_users"] = (stats.num_served_users, "Users whose serving state this "
                                  "server holds: facts registered, or read from a shared "
                                  "store (at most --max-served-users of those)")
        for name, (value, text) in gauges.items():
            yield GaugeMetricFamily(f"inferscale_{name}", text, value=value)
        for name, text in _COUNTERS.items():
            yield CounterMetricFamily(f"inferscale_{name}", text,
                                      value=totals.get(name, 0))
        for name, (key, text) in _PLAN_COUNTERS.items():
            yield CounterMetricFamily(f"inferscale_{name}", text, value=totals.get(key, 0))
        for name, text in _ENGINE_COUNTERS.items():
            yield CounterMetricFamily(f"inferscale_{name}", text,
                                      value=stats.engine.counters.get(name, 0))
        for name, text in _MEMORY_COUNTERS.items():
            yield CounterMetricFamily(f"inferscale_{name}", text,
                                      value=stats.counters.get(name, 0))
        refused = CounterMetricFamily("inferscale_refused_requests",
                                      "Requests answered with a 4xx status", labels=["status"])
        for status, count in sorted(self._refusals.items()):
            refused.add_metric([str(status)], count)
        yield refused
