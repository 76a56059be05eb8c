"""The worker's compiled load index (load_index.c), built once per machine with its C compiler.

A load's index is ~20 numpy and C-level calls in Python (`InferScaleWorker._load_indices`):
~40 us warm and 100-200 us cold per request at k=100, on the critical path of every injected
request. load_index.c does the same in one call. It is compiled the way Triton builds its own
launchers (the system C compiler and Python's headers, both present wherever Triton runs), once
per source and interpreter, into $INFERSCALE_CACHE/native (~/.cache/inferscale/native). Where
that fails (no compiler, no headers) the worker keeps its numpy path, with one warning; the two
give the same index (tests/engine/connector/test_native_index.py).

INFERSCALE_NATIVE=0 turns the compiled path off (A/B measurements, debugging).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

NATIVE_ENV = "INFERSCALE_NATIVE"
"""Set to 0 to keep the numpy path."""
MODULE_NAME = "inferscale_load_index"
SOURCE = Path(__file__).with_name("load_index.c")
_FLAGS = ("-O2", "-shared", "-fPIC", "-std=c11")

LoadIndexFill = Callable[..., int]
"""fill(entries, slab_keys, lengths, user_id, system_owner, lo, hi, block_ids, block_size, out,
column) -> hi - lo, or -(i + 1) when segment i fails its check (see load_index.c)."""


@cache
def load_index_fill() -> LoadIndexFill | None:
    """The compiled fill, or None (turned off, or it cannot be built here: logged once)."""
    if os.environ.get(NATIVE_ENV, "1").strip() == "0":
        logger.info("InferScale: %s=0, the worker builds load indices with numpy", NATIVE_ENV)
        return None
    try:
        fill: LoadIndexFill = build(cache_dir()).fill
        return fill
    except Exception as exc:  # noqa: BLE001 - any failure leaves the numpy path, never the engine
        logger.warning("InferScale: the compiled load index is unavailable (%s); the worker "
                       "builds load indices with numpy (slower per request)", exc)
        return None


def cache_dir() -> Path:
    """$INFERSCALE_CACHE/native, or ~/.cache/inferscale/native."""
    root = os.environ.get("INFERSCALE_CACHE") or Path.home() / ".cache" / "inferscale"
    return Path(root) / "native"


def build(folder: Path, compiler: str | None = None) -> Any:
    """Compile load_index.c into `folder` (once per source, compiler and interpreter); load it.

    Raises:
        RuntimeError: no C compiler or no Python headers; the compiler's error if it fails.
    """
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") \
        or shutil.which("clang")
    if not cc:
        raise RuntimeError("no C compiler found (install gcc, or set CC)")
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").exists():
        raise RuntimeError(f"Python's headers are missing ({include}/Python.h; install the "
                           "python3-dev package)")
    source = SOURCE.read_bytes()
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    digest = hashlib.sha256(b"\0".join([source, cc.encode(), " ".join(_FLAGS).encode(),
                                        include.encode(), suffix.encode(),
                                        sys.version.encode()])).hexdigest()[:16]
    target = folder / digest / f"{MODULE_NAME}{suffix}"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        # Compiled under a temporary name, then renamed: workers of one engine may build at once.
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            built = Path(scratch) / target.name
            done = subprocess.run([cc, *_FLAGS, f"-I{include}", str(SOURCE), "-o", str(built)],
                                  capture_output=True, text=True, timeout=300, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-2000:]}")
            os.replace(built, target)
        logger.info("InferScale: compiled the load index into %s", target)
    spec = importlib.util.spec_from_file_location(MODULE_NAME, target)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {target}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
