"""The Chunked-RoPE kernels bound to one cache, slab and RoPE tables: the serving hot path.

`chunked_rope.inject_` / `capture_` check every argument and go through Triton's launcher,
which binds and specializes ~30 arguments per call: tens of microseconds of host Python per
engine step, paid on every request's critical path. A `BoundMover` checks the slab and tables
once; each step passes only its [4, T] index. From the third launch of a direction on, the
launch skips Triton's binder too: the second launch records the exact arguments Triton hands
its compiled launcher, and later launches call that launcher with the same arguments, the
step's index and token count substituted (they are never specialized on, so the one compiled
kernel serves every step). Anything unexpected (launch hooks set, another Triton version's
calling convention) keeps the regular path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from inferscale_engine.kernels import chunked_rope

logger = logging.getLogger(__name__)

_DYNAMIC = ("index_ptr", "index_stride", "num_tokens")
"""Kernel parameters that change per step (do_not_specialize, so one kernel serves all)."""


class BoundMover:
    """inject / capture of one paged cache, slab and RoPE tables (see the module docstring)."""

    def __init__(self, cache: chunked_rope.PagedKVPointers, slab_keys: torch.Tensor,
                 slab_values: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str,
                 layer_tables: torch.Tensor | None = None, prebind: bool = True) -> None:
        """Check the slab and tables against the cache (ValueError if they do not fit)."""
        self._static = {to_cache: chunked_rope.StaticArgs.build(
            cache, slab_keys, slab_values, cos, sin, style, layer_tables, to_cache)
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
                index.stride(1) != 1 or index.device != self._device):
            raise ValueError(f"a mover's index must be [4, T] int64 on {self._device} with "
                             f"contiguous rows; got {index.dtype} {list(index.shape)} strides "
                             f"{index.stride()} on {index.device}")
        if not index.shape[1]:
            return
        fast = self._fast.get(to_cache)
        if fast is not None and fast.usable():
            fast(index)
            self.fast_launches += 1
            return
        static = self._static[to_cache]
        kernel = self._kernels.get(to_cache)
        if not self._prebind or kernel is None or to_cache in self._fast:
            self._kernels[to_cache] = chunked_rope.launch(static, index)
            return
        self._fast[to_cache] = _PreBound.record(kernel, static, index)


class _PreBound:
    """Triton's compiled launcher with one recorded launch's arguments."""

    def __init__(self, run: Callable[..., Any], recorded: tuple[Any, ...],
                 static: chunked_rope.StaticArgs, positions: tuple[int, int, int]) -> None:
        self._run = run
        self._launcher = recorded[4:6]  # after grid x, y, z and stream: function, metadata
        self._params = list(recorded[9:])
        self._static = static
        self._positions = positions
        from triton import knobs
        from triton.runtime import driver

        self._knobs = knobs.runtime
        self._stream = driver.active.get_current_stream
        self._device_index = static.device.index

    @classmethod
    def record(cls, kernel: Any, static: chunked_rope.StaticArgs, index: torch.Tensor
               ) -> _PreBound | None:
        """Launch once through Triton, recording its launcher call; None if it cannot be reused.

        The launch itself always happens (through Triton's regular path).
        """
        names = list(getattr(chunked_rope._move_kernel, "arg_names", ()))
        calls: list[tuple[Any, ...]] = []
        original = getattr(kernel, "run", None)

        def recorder(*args: Any) -> Any:
            calls.append(args)
            return original(*args)  # type: ignore[misc]

        try:
            kernel.run = recorder
        except AttributeError:
            original = None
        try:
            chunked_rope.launch(static, index)
        finally:
            if original is not None:
                kernel.run = original
        if original is None or len(calls) != 1 or not all(n in names for n in _DYNAMIC):
            return cls._refuse("Triton's compiled kernel was not reused", calls)
        args = calls[0]
        positions = tuple(9 + names.index(n) for n in _DYNAMIC)
        if (len(args) != 9 + len(names) or any(a is not None for a in args[6:9])
                or args[positions[0]] is not index or args[positions[2]] != index.shape[1]):
            return cls._refuse("unexpected launcher arguments (launch hooks set?)", calls)
        return cls(original, args, static, positions)  # type: ignore[arg-type]

    @staticmethod
    def _refuse(why: str, calls: list[tuple[Any, ...]]) -> None:
        logger.info("InferScale: Triton launches keep the regular path (%s; %d calls)", why,
                    len(calls))
        return None

    def usable(self) -> bool:
        """False while Triton launch hooks are set (a profiler): those need the regular path."""
        return self._knobs.launch_enter_hook is None and self._knobs.launch_exit_hook is None

    def __call__(self, index: torch.Tensor) -> None:
        params = self._params.copy()
        at_index, at_stride, at_tokens = self._positions
        num_tokens = index.shape[1]
        params[at_index - 9], params[at_stride - 9] = index, index.stride(0)
        params[at_tokens - 9] = num_tokens
        grid_x, grid_y, grid_z = self._static.grid(num_tokens)
        self._run(grid_x, grid_y, grid_z, self._stream(self._device_index), *self._launcher,
                  None, None, None, *params)
