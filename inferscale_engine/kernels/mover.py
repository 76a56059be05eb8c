"""The Chunked-RoPE kernels bound to one cache, slab and RoPE tables: the serving hot path.

`chunked_rope.inject_` / `capture_` check every argument and go through Triton's launcher,
which binds and specializes ~30 arguments per call: tens of microseconds of host Python per
engine step, paid on every request's critical path. A `BoundMover` checks the slab and tables
once; each step passes only its [4, T] index. From the second launch of a direction on, the
launch skips Triton's binder too: it calls the launcher of the kernel the first launch
compiled with the arguments Triton's binder would hand it, the step's index and token count
substituted (they are never specialized on, so the one compiled kernel serves every step).
Launch hooks (a profiler) or another Triton calling convention keep the regular path.

On CUDA the index may also sit in pinned host memory: the kernel then reads it over the bus
(unified addressing), and the step needs no host-to-device copy. Triton's launcher checks that
the driver maps the address; a pageable host tensor fails there with a ValueError.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from inferscale_engine.kernels import chunked_rope
from inferscale_engine.kernels.rope_tables import RopeTables

logger = logging.getLogger(__name__)

_DYNAMIC = ("index_ptr", "index_stride", "num_tokens")
"""Kernel parameters that change per step (do_not_specialize, so one kernel serves all)."""


class BoundMover:
    """inject / capture of one paged cache, slab and RoPE tables (see the module docstring)."""

    def __init__(self, cache: chunked_rope.PagedKVPointers, slab_keys: torch.Tensor,
                 slab_values: torch.Tensor, rope: RopeTables, prebind: bool = True) -> None:
        """Check the slab and tables against the cache (ValueError if they do not fit)."""
        self._static = {to_cache: chunked_rope.StaticArgs.build(
            cache, slab_keys, slab_values, rope, to_cache)
            for to_cache in (True, False)}
        self._device = cache.device
        self._prebind = prebind and cache.device.type == "cuda"
        self._kernels: dict[bool, Any] = {}
        self._fast: dict[bool, _PreBound | None] = {}
        self.fast_launches = 0
        """Launches that skipped Triton's binder (diagnostics and tests)."""

    def inject(self, index: torch.Tensor) -> None:
        """Slab rows -> paged slots; index [4, T] int64: rows, slots, from (canonical), to."""
        self._run(True, index)

    def capture(self, index: torch.Tensor) -> None:
        """Paged slots -> slab rows; index [4, T] int64: rows, slots, from (serving), to."""
        self._run(False, index)

    def _run(self, to_cache: bool, index: torch.Tensor) -> None:
        if index.dim() != 2 or index.shape[0] != 4 or index.dtype != torch.int64 or (
                index.stride(1) != 1) or (index.device != self._device and not (
                    self._device.type == "cuda" and index.device.type == "cpu")):
            raise ValueError(f"a mover's index must be [4, T] int64 on {self._device} (or in "
                             f"pinned host memory) with contiguous rows; got {index.dtype} "
                             f"{list(index.shape)} strides {index.stride()} on {index.device}")
        if not index.shape[1]:
            return
        static = self._static[to_cache]
        if self._prebind and to_cache not in self._fast and to_cache in self._kernels:
            # the second launch: bind to the kernel the first one compiled (once)
            self._fast[to_cache] = _PreBound.bind(self._kernels[to_cache], static)
        fast = self._fast.get(to_cache)
        if fast is not None and fast.usable():
            fast(index)
            self.fast_launches += 1
            return
        self._kernels[to_cache] = chunked_rope.launch(static, index)


class _PreBound:
    """Triton's compiled launcher, called with the arguments Triton's binder would hand it."""

    def __init__(self, kernel: Any, static: chunked_rope.StaticArgs, names: list[str]) -> None:
        from triton import knobs
        from triton.runtime import driver

        self._launcher = kernel.run
        self._function, self._metadata = kernel.function, kernel.packed_metadata
        values = dict(zip(names[:5], static.head, strict=True))
        values.update(zip(names[8:8 + len(static.tail)], static.tail, strict=True))
        values.update((n, static.options[n]) for n in names[8 + len(static.tail):])
        # The fixed tensors as their device addresses: the launcher takes an int as it is,
        # where a tensor costs a data_ptr() call and a driver query per launch. `static`
        # keeps the tensors alive.
        self._params = [_address(values.get(n)) for n in names]
        self._positions = tuple(names.index(n) for n in _DYNAMIC)
        self._static = static
        self._knobs = knobs.runtime
        self._stream = driver.active.get_current_stream
        self._device_index = static.device.index

    @classmethod
    def bind(cls, kernel: Any, static: chunked_rope.StaticArgs) -> _PreBound | None:
        """The launcher of `kernel` (compiled by a regular launch), or None.

        None where this Triton's calling convention is not the one known here (Triton >= 3.3:
        launcher(grid x, y, z, stream, function, packed metadata, launch metadata, enter hook,
        exit hook, *every parameter in order)).
        """
        import triton

        names = list(getattr(chunked_rope._move_kernel, "arg_names", ()))
        major, minor = (int(x) for x in triton.__version__.split(".")[:2])
        constexprs = names[8 + len(static.tail):]
        if ((major, minor) < (3, 3) or names[5:8] != list(_DYNAMIC)
                or not all(n in static.options for n in constexprs)
                or not all(hasattr(kernel, a) for a in ("run", "function", "packed_metadata"))):
            logger.info("InferScale: Triton %s launches keep the regular path",
                        triton.__version__)
            return None
        return cls(kernel, static, names)

    def usable(self) -> bool:
        """False while Triton launch hooks are set (a profiler): those need the regular path.

        Triton 3.6 keeps an (empty) HookChain there; its regular path then builds launch
        metadata and calls the empty chains on every launch.
        """
        return _no_hooks(self._knobs.launch_enter_hook) and _no_hooks(
            self._knobs.launch_exit_hook)

    def __call__(self, index: torch.Tensor) -> None:
        params = self._params.copy()
        at_index, at_stride, at_tokens = self._positions
        num_tokens = index.shape[1]
        params[at_index], params[at_stride], params[at_tokens] = (index, index.stride(0),
                                                                  num_tokens)
        grid_x, grid_y, grid_z = self._static.grid(num_tokens)
        self._launcher(grid_x, grid_y, grid_z, self._stream(self._device_index),
                       self._function, self._metadata, None, None, None, *params)


def _address(value: Any) -> Any:
    return value.data_ptr() if isinstance(value, torch.Tensor) else value


def _no_hooks(hook: Any) -> bool:
    return hook is None or getattr(hook, "calls", None) == []
