"""Worker-side half of the connector: owns the KV slab, injects and captures KV.

Runs in every vLLM worker (the process that owns the paged cache). Loads are synchronous and
happen in `start_load_kv`, before the forward, for all layers at once (FULL CUDA-graph replay
skips per-layer hooks, so nothing is done per layer). Captures happen in `wait_for_save`, after
the forward has written this step's K/V into the paged blocks.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from operator import attrgetter
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from inferscale_engine.config import ConnectorConfig
from inferscale_engine.connector.metadata import CaptureSpec, InferScaleMetadata, Int64s, LoadSpec
from inferscale_engine.connector.paged import (
    CpuPackedPagedKV,
    Fp8Cache,
    PagedKV,
    StridedPagedKV,
    strided_views,
)
from inferscale_engine.connector.slab import KVSlab, SlabEntry
from inferscale_engine.connector.staging import Staging
from inferscale_engine.connector.worker_tiers import DiskTier, HostTier
from inferscale_engine.kernels.rope_tables import RopeTables
from inferscale_engine.model.rope import RopeSpec, layer_rope_specs
from inferscale_engine.protocol.plan import SYSTEM_OWNER
from inferscale_engine.protocol.tier_control import DiskRead, DiskWrite, Move

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = logging.getLogger(__name__)


class InferScaleWorker:
    """Implements the worker-side hooks of InferScaleConnector."""

    def __init__(self, vllm_config: VllmConfig, config: ConnectorConfig) -> None:
        model_config = vllm_config.model_config
        self._config = config
        # LongRoPE's factor set follows vLLM's own max_model_len (as its rotary embedding does).
        self._layer_specs = layer_rope_specs(model_config.hf_config, model_config.max_model_len)
        self._num_kv_heads = model_config.get_num_kv_heads(vllm_config.parallel_config)
        self._head_dim = model_config.get_head_size()
        self._block_size = vllm_config.cache_config.block_size
        self._block_offsets = np.arange(self._block_size, dtype=np.int64)
        self._positions = np.arange(config.max_positions, dtype=np.int64)  # sliced per load
        self._cache_dtype = vllm_config.cache_config.cache_dtype
        self._model_dtype = cast(torch.dtype, model_config.dtype)  # resolved by vLLM
        self._vllm_config = vllm_config
        self.slab: KVSlab | None = None
        self.host: HostTier | None = None
        """Demoted fact KV in pinned host memory (connector/worker_tiers.py), if configured."""
        self.disk: DiskTier | None = None
        """Fact KV files on local disk, if configured."""
        self.paged: PagedKV | None = None
        self._rope: RopeTables | None = None
        self._failed_block_ids: set[int] = set()
        self._staging = Staging(torch.device("cpu"))
        self.counters: Counter[str] = Counter()
        self._recent: deque[tuple[str, Int64s, int, int]] = deque(maxlen=8)
        """(request id, block table, first and end position) of the last loads."""

    # ---- set-up ------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Detect the paged layout, allocate the slab and the RoPE tables.

        With an fp8 cache the slab holds the model dtype: captured KV is decoded with the
        layer's scales, and injected KV is quantized by vLLM's own cache write.
        """
        layers = list(kv_caches.values())
        first = layers[0]
        fp8 = Fp8Cache.of(self._cache_dtype, self._vllm_config, list(kv_caches))
        self.paged = _detect_layout(layers, self._num_kv_heads, self._head_dim, self._block_size,
                                    fp8, self._model_dtype)
        slab_dtype = self._model_dtype if fp8 is not None else first.dtype
        self.slab = KVSlab(len(layers), self._config.slab_pages, self._config.page_tokens,
                           self._num_kv_heads, self._head_dim, slab_dtype, first.device)
        self._staging = Staging(first.device)
        if fp8 is not None:  # vLLM's cache write takes device indices (no zero-copy kernel)
            self._staging.zero_copy = False
        if self._config.host_pages:
            self.host = HostTier(self.slab, self._config.host_pages)
        if self._config.disk_path:
            self.disk = DiskTier(self._config.disk_path, _tensor_parallel_rank(), self.counters)
        self._rope = _rope_tables(self._layer_specs, list(kv_caches), self._config.max_positions,
                                  first.device)
        self._check_zero_copy()
        logger.info("InferScale slab: %d layers, %d pages x %d tokens, %.1f MiB on %s",
                    len(layers), self._config.slab_pages, self._config.page_tokens,
                    self.slab.stats()["capacity_bytes"] / 2**20, first.device)

    def _check_zero_copy(self) -> None:
        """One load of a masked token (slab row -1: nothing moves) from pinned host memory.

        Where the driver does not map pinned memory for the device, Triton refuses the address
        and loads copy their index to the device instead. Also compiles the injection kernel
        here rather than in the first request.
        """
        assert self.slab is not None and self.paged is not None and self._rope is not None
        if not self._staging.zero_copy:  # CPU: nothing to check
            return
        self._staging.host(1)[:] = -1
        try:
            self.paged.inject_(self.slab, self._staging.index(1), self._rope)
            torch.cuda.synchronize(self.slab.keys.device)
        except Exception as exc:  # noqa: BLE001 - refused by Triton or the driver: copy instead
            self._staging.zero_copy = False
            logger.warning("InferScale: load indices are copied to the device (the kernel "
                           "cannot read pinned host memory here: %r)", exc)
        finally:
            self._staging.launched()

    # ---- hooks -------------------------------------------------------------------------
    def start_load(self, meta: InferScaleMetadata) -> None:
        """Inject every load of this step.

        Index math on the CPU straight into one (pinned) host buffer, which the kernel reads
        in place (or after one host-to-device copy), one kernel launch (or one vLLM cache-write
        call per layer on the CPU).
        """
        if not meta.loads:
            return
        assert self.slab is not None and self.paged is not None and self._rope is not None
        host = self._staging.host(sum(max(0, load.load_end - load.load_start)
                                      for load in meta.loads))
        filled, written = 0, []
        for load in meta.loads:
            width = self._write_index(load, host, filled)
            if width:
                written.append(load)
                filled += width
        if not filled:
            return
        try:
            self.paged.inject_(self.slab, self._staging.index(filled), self._rope)
        finally:
            self._staging.launched()
        self._recent.extend((load.req_id, load.block_ids, load.load_start, load.load_end)
                            for load in written[-(self._recent.maxlen or 0):])
        self.counters["injected_requests"] += len(written)
        self.counters["injected_tokens"] += filled

    def finish_step(self, meta: InferScaleMetadata) -> None:
        """Capture every fact span completed in this step into the slab, in one batched copy."""
        if not meta.captures:
            return
        try:
            self._capture_all(meta.captures)
        except Exception:  # never take the engine down: the app sees the entries missing
            self.counters["capture_errors"] += len(meta.captures)
            logger.exception("InferScale: capture of %d facts failed", len(meta.captures))

    def start_load_safely(self, meta: InferScaleMetadata) -> None:
        """start_load, failing the loads (not the engine step) on an unexpected error.

        vLLM then recomputes those blocks. Also counts the plans the scheduler refused (the
        step metadata is how its counts reach the control calls).
        """
        if meta.num_rejected or meta.num_mismatched:
            self.counters["plans_rejected"] += meta.num_rejected
            self.counters["plans_mismatch"] += meta.num_mismatched
        try:
            self.start_load(meta)
        except Exception:
            logger.exception("InferScale: injection failed; vLLM will recompute the tokens")
            for load in meta.loads:
                self._fail(load, "internal error", -1)

    def take_failed_block_ids(self) -> set[int]:
        """Blocks whose load failed in this step (vLLM recomputes them)."""
        failed, self._failed_block_ids = self._failed_block_ids, set()
        return failed

    # ---- control (worker extension) -----------------------------------------------------
    def free(self, slab_keys: list[int]) -> int:
        """Drop entries; returns how many existed. Their pages are reused by later saves."""
        assert self.slab is not None
        return sum(self.slab.entries.pop(k, None) is not None for k in slab_keys)

    def stats(self) -> dict[str, int]:
        """Slab and host tier occupancy, and counters."""
        assert self.slab is not None
        host = self.host.stats() if self.host is not None else {}
        return {**self.slab.stats(), **{f"host_{k}": v for k, v in host.items()},
                **self.counters}

    # ---- tiers (control calls; connector/worker_tiers.py) ----------------------------
    def demote(self, moves: list[Move]) -> list[bool]:
        """Move slab entries to host RAM; per move, done."""
        assert self.slab is not None
        if self.host is None:
            return [False] * len(moves)
        start = time.perf_counter_ns()
        tokens = self.host.demote(self.slab, moves)
        self.counters["host_demote_ns"] += time.perf_counter_ns() - start
        self.counters["host_demotions"] += sum(map(bool, tokens))
        self.counters["host_bytes_in"] += sum(tokens) * self.slab.bytes_per_token
        return [bool(n) for n in tokens]

    def promote(self, moves: list[Move]) -> list[bool]:
        """Move host entries back into the slab; per move, done."""
        assert self.slab is not None
        if self.host is None:
            return [False] * len(moves)
        start = time.perf_counter_ns()
        tokens = self.host.promote(self.slab, moves)
        self.counters["host_promote_ns"] += time.perf_counter_ns() - start
        self.counters["host_promote_calls"] += 1
        self.counters["host_promotions"] += sum(map(bool, tokens))
        self.counters["host_bytes_out"] += sum(tokens) * self.slab.bytes_per_token
        return [bool(n) for n in tokens]

    def persist(self, items: list[DiskWrite]) -> list[bool]:
        """Write slab entries to the disk tier (queued); per entry, whether it was in the slab."""
        assert self.slab is not None
        if self.disk is None:
            return [False] * len(items)
        return [self.disk.persist(self.slab, item) for item in items]

    def load(self, items: list[DiskRead]) -> list[str]:
        """Read entries from disk into the slab.

        Per item '' (loaded) or why not: missing, corrupt, mismatch, stale (counted).
        """
        assert self.slab is not None
        if self.disk is None:
            return ["missing"] * len(items)
        stream = self.host._stream if self.host is not None else None  # noqa: SLF001
        start = time.perf_counter_ns()
        results = [self.disk.load(self.slab, item, stream) for item in items]
        self.counters["disk_load_ns"] += time.perf_counter_ns() - start
        for result in results:
            self.counters[f"disk_{result or 'loads'}"] += 1
        return results

    def forget(self, host_keys: list[int], names: list[str]) -> int:
        """Drop host entries and delete disk files of deleted facts; how many existed."""
        dropped = self.host.drop(host_keys) if self.host is not None else 0
        return dropped + (self.disk.forget(names) if self.disk is not None else 0)

    def flush_disk(self) -> None:
        """Wait until every queued disk write is done."""
        if self.disk is not None:
            self.disk.flush()

    @property
    def recent_loads(self) -> list[tuple[str, np.ndarray]]:
        """(request id, paged slots written) of the last few loads (diagnostics and tests)."""
        return [(rid, self._slots(block_ids, lo, hi)) for rid, block_ids, lo, hi in self._recent]

    # ---- helpers -----------------------------------------------------------------------
    def _slots(self, block_ids: Int64s | list[int], start: int, end: int) -> np.ndarray:
        """[end - start] int64 paged slots of positions [start, end) under this block table."""
        bs = self._block_size
        first, last = start // bs, -(-end // bs)
        table = np.asarray(block_ids, dtype=np.int64)[first:last, None] * bs + self._block_offsets
        return table.ravel()[start - first * bs:end - first * bs]

    def _write_index(self, load: LoadSpec, host: np.ndarray, column: int) -> int:
        """Write one load's index into host[:, column:]; its width (0: nothing to load/failed)."""
        part = self._load_indices(load, host[:, column:])
        return 0 if part is None else part.shape[1]

    def _load_indices(self, load: LoadSpec, out: np.ndarray | None = None
                      ) -> np.ndarray | None:
        """[4, n] int64 array of one load (None if it failed), written into `out` if given.

        Rows: slab rows, paged slots, the positions the stored keys are rotated for, and the
        serving positions. No per-token or per-segment Python and few numpy calls (each costs
        microseconds on a busy serving host): the segments' entries are looked up and checked
        with C-level maps (_entry_problem only when a check fails), their rows and rotation
        positions joined from the entries' precomputed bytes.
        """
        assert self.slab is not None
        lo, hi = load.load_start, load.load_end
        lengths = load.lengths.tolist()
        if hi <= lo:
            return None
        if len(load.block_ids) * self._block_size < hi:  # vLLM always allocates them first
            self._fail(load, "block table shorter than the load", -1)
            return None
        whole = lo == 0 and hi == sum(lengths)
        if whole:  # the usual load: every segment, whole
            keys = load.slab_keys.tolist()
        else:  # segments overlapping [lo, hi): their starts and ends are increasing
            ends = np.cumsum(load.lengths)
            starts = ends - load.lengths
            first = int(np.searchsorted(ends, lo, side="right"))
            last = int(np.searchsorted(starts, hi, side="left"))
            if first >= last:
                return None
            keys, lengths = load.slab_keys[first:last].tolist(), lengths[first:last]
            offset = lo - int(starts[first])
        selected = list(map(self.slab.entries.get, keys))
        if (None in selected or list(map(_NUM_TOKENS, selected)) != lengths
                or not {load.user_id, SYSTEM_OWNER}.issuperset(map(_OWNER, selected))):
            key, problem = next((k, p) for k, e, n in zip(keys, selected, lengths)
                                if (p := _entry_problem(e, load.user_id, n)))
            self._fail(load, problem, key)
            return None
        packed = np.empty((4, hi - lo), dtype=np.int64) if out is None else out[:, :hi - lo]
        # Rows 0 and 2 (slab rows, canonical positions): one bytes join each over the entries'
        # precomputed int64 bytes (cheaper than numpy's concatenate of many 2-row arrays).
        rows = np.frombuffer(b"".join(map(_ROWS_BYTES, selected)), np.int64)
        canonical = np.frombuffer(b"".join(map(_CANONICAL_BYTES, selected)), np.int64)
        if not whole:
            rows, canonical = rows[offset:offset + hi - lo], canonical[offset:offset + hi - lo]
        packed[0], packed[2] = rows, canonical
        packed[1] = self._slots(load.block_ids, lo, hi)
        if hi > len(self._positions):
            self._positions = np.arange(max(hi, 2 * len(self._positions)), dtype=np.int64)
        packed[3] = self._positions[lo:hi]
        return packed

    def _fail(self, load: LoadSpec, problem: str, key: int) -> None:
        """Report every block of the load as failed: vLLM recomputes them (never wrong KV)."""
        first, last = load.load_start // self._block_size, (load.load_end - 1) // self._block_size
        self._failed_block_ids.update(load.block_ids[first:last + 1].tolist())
        self.counters["load_errors"] += 1
        logger.warning("InferScale: cannot inject request %s (slab key %d: %s); vLLM recomputes "
                       "those tokens", load.req_id, key, problem)

    def _capture_all(self, captures: list[CaptureSpec]) -> None:
        assert self.slab is not None and self.paged is not None and self._rope is not None
        parts, entries = [], []
        # Newest allocation first: when two captures of one step name the same page, the
        # older one is refused instead of racing it inside one batched copy.
        for capture in sorted(captures, key=lambda c: -c.slab_key):
            try:
                rows = self.slab.rows_for(capture.pages, capture.num_tokens)
            except ValueError as exc:
                self.counters["capture_errors"] += 1
                logger.warning("InferScale: capture of slab key %d refused: %s",
                               capture.slab_key, exc)
                continue
            superseded = self.slab.claim_pages(capture.slab_key, capture.pages)
            if superseded is None:
                self.counters["captures_refused_stale"] += 1
                logger.warning("InferScale: capture of slab key %d refused: the key was used "
                               "before or its pages belong to a newer allocation (a replayed "
                               "or stale save plan)", capture.slab_key)
                continue
            self.counters["superseded_entries"] += len(superseded)
            origin = capture.start if self._config.key_origin == "encoded" else 0
            end = capture.start + capture.num_tokens
            serving = np.arange(capture.start, end, dtype=np.int64)
            paged_slots = self._slots(capture.block_ids, capture.start, end)
            parts.append(np.stack((rows.numpy(), paged_slots, serving,
                                   serving - capture.start + origin)))
            entries.append((capture, SlabEntry(capture.user_id, rows, capture.num_tokens,
                                               origin)))
        if not parts:
            return
        packed = torch.from_numpy(np.concatenate(parts, axis=1)).to(self.slab.keys.device)
        self.paged.capture_(self.slab, packed, self._rope)  # rows, slots, serving, canonical
        for capture, entry in entries:
            if capture.key_scale:
                self.slab.scale_keys_(entry.rows, capture.key_scale)
        for capture, entry in entries:
            self.slab.entries[capture.slab_key] = entry
            self.counters["captured_tokens"] += capture.num_tokens
            self.counters["captures"] += 1


_ROWS_BYTES, _CANONICAL_BYTES = attrgetter("rows_bytes"), attrgetter("canonical_bytes")
_OWNER, _NUM_TOKENS = attrgetter("owner"), attrgetter("num_tokens")


def _entry_problem(entry: SlabEntry | None, user_id: str, length: int) -> str:
    # The plan's MAC already binds slab keys to token ids; this re-checks ownership here, in
    # the process that holds the KV (design invariant 5 of docs/how-it-works.md), and the length.
    if entry is None:
        return "not resident"
    if entry.owner not in (user_id, SYSTEM_OWNER):
        return "owned by another user"
    if entry.num_tokens != length:
        return "stored length differs from the plan"
    return ""


def _rope_tables(specs: tuple[RopeSpec, ...], layer_names: list[str], num_positions: int,
                 device: torch.device) -> RopeTables:
    """RoPE tables of the cache layers `layer_names` (model layer i uses specs[i]).

    One table when every layer rotates alike; otherwise one per distinct spec and each cache
    layer's index into them (layers are matched by the index in their vLLM name).
    """
    distinct = list(dict.fromkeys(specs))
    if len(distinct) == 1:
        return distinct[0].tables(num_positions, device)
    from vllm.model_executor.models.utils import extract_layer_index

    if len({(spec.style, spec.rotary_dim) for spec in distinct}) > 1:
        raise NotImplementedError("layers differ in RoPE style or rotary_dim; InferScale "
                                  "supports per-layer bases and scalings only")
    tables = [spec.cos_sin(num_positions, device) for spec in distinct]
    layer_tables = [distinct.index(specs[extract_layer_index(name)]) for name in layer_names]
    return RopeTables(torch.stack([cos for cos, _ in tables]),
                      torch.stack([sin for _, sin in tables]), distinct[0].style.value,
                      torch.tensor(layer_tables, dtype=torch.int64, device=device))


def _detect_layout(layers: list[torch.Tensor], num_kv_heads: int, head_dim: int,
                   block_size: int, fp8: Fp8Cache | None = None,
                   model_dtype: torch.dtype | None = None) -> PagedKV:
    """Pick the paged layout of the running attention backend."""
    first = layers[0]
    if first.device.type == "cpu":
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa  # vLLM 0.32 (CPU build)

        if first.dim() != 4 or first.shape[1] != num_kv_heads or first.shape[3] != 2 * head_dim:
            raise NotImplementedError(f"unexpected CPU KV cache shape {tuple(first.shape)}")
        isa = _get_attn_isa(model_dtype or first.dtype, first.shape[2], head_dim,
                            fp8.name if fp8 else "auto")
        return CpuPackedPagedKV(layers, isa, fp8)
    keys, values = zip(*(strided_views(t, num_kv_heads, head_dim) for t in layers))
    return StridedPagedKV(list(keys), list(values), fp8=fp8)


def _tensor_parallel_rank() -> int:
    """The worker's tensor-parallel rank (0 where vLLM's groups are not set up)."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except (AssertionError, ImportError, RuntimeError):
        return 0
