"""The compiled load index (connector/load_index.c): the numpy path's index, its checks, its
refusals, and the fallback where it cannot be built."""

from __future__ import annotations

import logging
import random
import shutil
from dataclasses import make_dataclass
from types import SimpleNamespace

import numpy as np
import pytest

from inferscale_engine import native as builder
from inferscale_engine.connector import native
from inferscale_engine.connector.metadata import InferScaleMetadata, LoadSpec
from inferscale_engine.plan import SYSTEM_OWNER
from tests.engine.connector.test_worker import (
    BLOCK_SIZE,
    as_arrays,
    break_entry,
    make_load,
    make_worker,
    reference_indices,
    whole,
)

pytestmark = pytest.mark.skipif(native.load_index_fill() is None,
                                reason="no C compiler or Python headers here: the worker uses "
                                       "its numpy path (tested in test_worker.py)")


def fill(worker, load: LoadSpec, out: np.ndarray, column: int = 0, **changes) -> int:
    args = dict(entries=worker.slab.entries, slab_keys=load.slab_keys, lengths=load.lengths,
                user=load.user_id, system=SYSTEM_OWNER, lo=load.load_start, hi=load.load_end,
                block_ids=load.block_ids, block_size=BLOCK_SIZE, out=out, column=column)
    args.update(changes)
    return native.load_index_fill()(*args.values())


@pytest.mark.parametrize("seed", range(40))
def test_the_compiled_index_is_the_reference_for_partial_and_whole_loads(seed):
    worker = make_worker()
    rng = random.Random(seed)
    load = make_load(worker, rng)
    load = as_arrays(load) if seed % 2 else load  # array('q'), as the scheduler builds them
    for case in (load, whole(load)):
        width = case.load_end - case.load_start
        out = np.full((4, width + 9), -7, dtype=np.int64)
        assert fill(worker, case, out, column=5) == width
        assert np.array_equal(out[:, 5:5 + width], reference_indices(worker, case))
        assert (out[:, :5] == -7).all() and (out[:, 5 + width:] == -7).all()  # nothing else


def test_the_worker_uses_it_and_writes_what_the_numpy_path_writes():
    worker = make_worker()
    assert worker._fill is not None
    rng = random.Random(3)
    loads = [make_load(worker, rng, user) for user in ("alice", "bob", "carol")]
    loads[1] = as_arrays(loads[1])
    seen = []
    worker.paged = SimpleNamespace(  # type: ignore[assignment]
        inject_=lambda slab, index, rope: seen.append(index.clone().numpy()))
    worker._rope = SimpleNamespace()  # type: ignore[assignment]
    meta = InferScaleMetadata(loads=loads)
    worker.start_load(meta)
    worker._fill = None  # the numpy path, same loads
    worker.start_load(meta)
    want = np.concatenate([reference_indices(worker, load) for load in loads], axis=1)
    assert len(seen) == 2 and np.array_equal(seen[0], want) and np.array_equal(seen[1], want)
    assert worker.counters["load_errors"] == 0


@pytest.mark.parametrize("problem", ["missing", "foreign", "length"])
def test_a_failed_check_names_its_segment(problem):
    worker = make_worker()
    load = whole(make_load(worker, random.Random(7)))
    bad = len(load.slab_keys) - 1
    break_entry(worker, int(load.slab_keys[bad]), problem)
    out = np.empty((4, load.load_end), dtype=np.int64)
    assert fill(worker, load, out) == -(bad + 1)


def test_the_system_owner_and_the_user_are_the_only_readers():
    worker = make_worker()
    load = whole(make_load(worker, random.Random(9), user="alice"))
    out = np.empty((4, load.load_end), dtype=np.int64)
    assert fill(worker, load, out) == load.load_end  # segment 0 is the system's preamble
    assert fill(worker, load, out, user="bob") == -2  # segment 1 is alice's


def test_arrays_it_cannot_read_are_refused_and_the_numpy_path_serves_them():
    worker = make_worker()
    load = whole(make_load(worker, random.Random(11)))
    n = load.load_end
    out = np.empty((4, n), dtype=np.int64)
    refused = {
        "int32 keys": dict(slab_keys=load.slab_keys.astype(np.int32)),
        "big-endian lengths": dict(lengths=load.lengths.astype(">i8")),
        "a list": dict(block_ids=load.block_ids.tolist()),
        "strided out": dict(out=np.empty((4, 2 * n), dtype=np.int64)[:, ::2]),
        "out of 3 rows": dict(out=np.empty((3, n), dtype=np.int64)),
        "out too narrow": dict(column=1),
        "past the segments": dict(hi=n + 1),
        "short block table": dict(block_ids=load.block_ids[:(n - 1) // BLOCK_SIZE]),
        "read-only out": dict(out=np.frombuffer(bytes(32 * n), np.int64).reshape(4, n)),
        "a zero length": dict(lengths=np.where(np.arange(len(load.lengths)) == 1, 0,
                                               load.lengths)),
    }
    for name, change in refused.items():
        with pytest.raises((ValueError, TypeError, BufferError)):
            fill(worker, load, out, **change)
            pytest.fail(name)
    # The worker hands such a load to its numpy path: the same index, no failure.
    odd = LoadSpec(load.req_id, load.user_id, load.slab_keys.astype(np.int32),
                   load.lengths.astype(np.int32), 0, n, load.block_ids.astype(np.int32))
    host = np.empty((4, n), dtype=np.int64)
    assert worker._write_index(odd, host, 0) == n
    assert np.array_equal(host, reference_indices(worker, load))


def _entry_type() -> type:
    """A new slots type of SlabEntry's fields (fill reads such entries' slots directly)."""
    return make_dataclass("Entry", [("owner", str), ("num_tokens", int), ("origin", int),
                                    ("rows_bytes", bytes)], slots=True, eq=False)


_Entry = _entry_type()


def _entries_as(entries: dict, kind: str) -> dict:
    """The same entries as another kind of object (every other one, for "mixed")."""
    out = {}
    for i, (key, e) in enumerate(entries.items()):
        fields = (e.owner, e.num_tokens, e.origin, e.rows_bytes)
        if kind == "namespace" or (kind == "mixed" and i % 2):
            out[key] = SimpleNamespace(**dict(zip(_Entry.__slots__, fields, strict=True)))
        elif kind == "slots":
            out[key] = _Entry(*fields)
        else:
            out[key] = e
    return out


@pytest.mark.parametrize("kind", ["slots", "namespace", "mixed"])
def test_entries_of_any_type_give_the_same_index(kind):
    """Slots read directly (SlabEntry, another slots type) or by getattr, alternating."""
    worker = make_worker()
    load = whole(make_load(worker, random.Random(13)))
    want = np.empty((4, load.load_end), dtype=np.int64)
    assert fill(worker, load, want) == load.load_end
    got = np.empty_like(want)
    entries = _entries_as(worker.slab.entries, kind)
    for _ in range(3):  # the layout learned, forgotten and learned again in turn
        assert fill(worker, load, got, entries=entries) == load.load_end
        assert np.array_equal(got, want)
        assert fill(worker, load, got) == load.load_end and np.array_equal(got, want)


def test_a_changed_type_is_read_as_changed():
    """A property put on the entry type after its slots were learned is what fill reads."""
    Entry = _entry_type()  # its own type: the change stays in this test
    worker = make_worker()
    load = whole(make_load(worker, random.Random(15), user="alice"))
    entries = {k: Entry(e.owner, e.num_tokens, e.origin, e.rows_bytes)
               for k, e in worker.slab.entries.items()}
    out = np.empty((4, load.load_end), dtype=np.int64)
    assert fill(worker, load, out, entries=entries) == load.load_end
    Entry.owner = property(lambda self: "mallory")  # type: ignore[attr-defined]
    assert fill(worker, load, out, entries=entries) == -1  # the preamble: not the system's now


def test_an_unset_slot_raises_as_getattr_does():
    worker = make_worker()
    load = whole(make_load(worker, random.Random(17)))
    entries = _entries_as(worker.slab.entries, "slots")
    key = int(load.slab_keys[1])
    half = object.__new__(_Entry)
    half.owner, half.num_tokens, half.origin = (entries[key].owner, entries[key].num_tokens,
                                                entries[key].origin)
    entries[key] = half
    out = np.empty((4, load.load_end), dtype=np.int64)
    with pytest.raises(AttributeError, match="rows_bytes"):
        fill(worker, load, out, entries=entries)
    del entries[key].owner
    with pytest.raises(AttributeError, match="owner"):
        fill(worker, load, out, entries=entries)


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(builder.NATIVE_ENV, "0")
    builder.compiled.cache_clear()
    try:
        assert native.load_index_fill() is None
        assert make_worker()._fill is None
    finally:
        monkeypatch.delenv(builder.NATIVE_ENV)
        builder.compiled.cache_clear()
    assert native.load_index_fill() is not None


def test_a_failed_build_leaves_the_numpy_path_with_a_warning(monkeypatch, tmp_path, caplog):
    with pytest.raises(RuntimeError, match="failed"):
        builder.build(native.SOURCE, native.MODULE_NAME, tmp_path / "a",
                      compiler=shutil.which("false") or "false")
    monkeypatch.setenv("INFERSCALE_CACHE", str(tmp_path / "b"))
    monkeypatch.setenv("CC", shutil.which("false") or "false")
    builder.compiled.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=builder.__name__):
            assert native.load_index_fill() is None
        assert "Python path serves instead" in caplog.text
    finally:
        monkeypatch.undo()
        builder.compiled.cache_clear()


def test_built_once_per_source_and_reused(tmp_path):
    first = builder.build(native.SOURCE, native.MODULE_NAME, tmp_path)
    built = list(tmp_path.rglob("*.so"))
    assert len(built) == 1
    mtime = built[0].stat().st_mtime_ns
    second = builder.build(native.SOURCE, native.MODULE_NAME, tmp_path)
    assert list(tmp_path.rglob("*.so")) == built and built[0].stat().st_mtime_ns == mtime
    assert first.fill is not None and second.fill is not None
