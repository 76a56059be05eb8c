"""BoundMover, the serving path's launcher: every step through it moves what reference.py moves.

On CUDA the second and later launches of a direction skip Triton's binder (a recorded launcher
call); those launches are checked against the oracle like the first ones, with index buffers
of every size and row stride the worker hands it.
"""

from __future__ import annotations

import pytest
import torch

from inferscale_engine.kernels import chunked_rope, reference
from inferscale_engine.kernels.mover import BoundMover
from tests.engine.kernels.test_chunked_rope import (
    DEVICE,
    INTERPRETED,
    SENTINEL,
    Case,
    assert_matches,
    make_cache,
    make_plan,
    make_slab,
    tables,
)

STEPS = ((0, 16), (3, 1), (1, 40), (5, 64), (0, 101), (7, 33))
"""(first token, tokens) of each step's slice of the plan."""


def staged(parts: tuple[torch.Tensor, ...], start: int, count: int, capacity: int
           ) -> torch.Tensor:
    """The step's [4, count] index inside a [4, capacity] buffer, as the worker's staging."""
    buffer = torch.full((4, capacity), -7, dtype=torch.int64, device=DEVICE)
    for row, part in enumerate(parts):
        buffer[row, :count] = part[start:start + count]
    return buffer[:, :count]


@pytest.mark.parametrize("direction", ["inject", "capture"])
def test_every_launch_matches_the_reference(direction: str) -> None:
    case = Case(dtype=torch.bfloat16, lengths=(40, 41, 7, 13), num_rows=128, num_blocks=64)
    gen = torch.Generator().manual_seed(11)
    rope = tables(case)
    rows, slots, canonical, serving = make_plan(case, gen)
    keys, values = make_cache(case, gen, fill=None if direction == "capture" else SENTINEL)
    slab_keys, slab_values = make_slab(case, gen, fill=SENTINEL if direction == "capture"
                                       else None)
    mover = BoundMover(chunked_rope.PagedKVPointers(keys, values), slab_keys, slab_values,
                       rope)
    for step, (start, count) in enumerate(STEPS):
        want_keys, want_values = [k.clone() for k in keys], [v.clone() for v in values]
        want_slab_keys, want_slab_values = slab_keys.clone(), slab_values.clone()
        piece = slice(start, start + count)
        if direction == "inject":
            index = staged((rows, slots, canonical, serving), start, count, 128 + step)
            mover.inject(index)
            reference.inject_(want_keys, want_values, slab_keys, slab_values, rows[piece],
                              slots[piece], canonical[piece], serving[piece], rope)
        else:
            index = staged((rows, slots, serving, canonical), start, count, 128 + step)
            mover.capture(index)
            reference.capture_(keys, values, want_slab_keys, want_slab_values, slots[piece],
                               rows[piece], serving[piece], canonical[piece], rope)
        for got, want in zip([*keys, *values, slab_keys, slab_values],
                             [*want_keys, *want_values, want_slab_keys, want_slab_values]):
            assert_matches(got, want)
    # Compiled: launches 2.. skip Triton's binder. Interpreted: there is no compiled launcher.
    assert mover.fast_launches == (0 if INTERPRETED else len(STEPS) - 1)


@pytest.mark.skipif(INTERPRETED, reason="pinned host memory is a CUDA path")
def test_an_index_in_pinned_host_memory_moves_what_a_device_index_moves() -> None:
    # The worker's zero-copy staging: the kernel reads the index where the host wrote it.
    case = Case(dtype=torch.bfloat16, lengths=(40, 41, 7, 13), num_rows=128, num_blocks=64)
    gen = torch.Generator().manual_seed(12)
    rope = tables(case)
    rows, slots, canonical, serving = make_plan(case, gen)
    keys, values = make_cache(case, gen, fill=SENTINEL)
    slab_keys, slab_values = make_slab(case, gen, fill=None)
    mover = BoundMover(chunked_rope.PagedKVPointers(keys, values), slab_keys, slab_values,
                       rope)
    for step, (start, count) in enumerate(STEPS):
        want_keys, want_values = [k.clone() for k in keys], [v.clone() for v in values]
        piece = slice(start, start + count)
        host = staged((rows, slots, canonical, serving), start, count, 128 + step).cpu()
        pinned = torch.empty((4, 128 + step), dtype=torch.int64).pin_memory()[:, :count]
        pinned.copy_(host)
        mover.inject(pinned)
        reference.inject_(want_keys, want_values, slab_keys, slab_values, rows[piece],
                          slots[piece], canonical[piece], serving[piece], rope)
        for got, want in zip([*keys, *values], [*want_keys, *want_values]):
            assert_matches(got, want)
    assert mover.fast_launches == len(STEPS) - 1
    pageable = torch.zeros(4, 8, dtype=torch.int64)  # not mapped for the device: refused
    with pytest.raises(ValueError, match="cannot be accessed"):
        mover.inject(pageable)


def test_a_bad_index_is_refused_with_its_shape() -> None:
    case = Case()
    gen = torch.Generator().manual_seed(2)
    keys, values = make_cache(case, gen, fill=0.0)
    slab_keys, slab_values = make_slab(case, gen, fill=0.0)
    mover = BoundMover(chunked_rope.PagedKVPointers(keys, values), slab_keys, slab_values,
                       tables(case))
    good = torch.zeros(4, 8, dtype=torch.int64, device=DEVICE)
    strided = torch.zeros(8, 4, dtype=torch.int64, device=DEVICE).t()  # [4, 8], columns apart
    for bad in (good.int(), good[:3], strided, good[0]):
        with pytest.raises(ValueError, match=r"\[4, T\] int64"):
            mover.inject(bad)
    mover.inject(good[:, :0])  # an empty step is a no-op
