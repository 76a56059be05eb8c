"""Small C helpers of the per-request hot path, built once per machine with its C compiler.

On a busy serving host every Python-level call on a request's path costs tens of microseconds
with cold caches, so the two places that make ~20 of them per request do their work in one call
of a C function instead: the worker's load index (`connector/load_index.c`) and the plan's
packing of its runs (`plan_pack.c`). Each is compiled the way Triton builds its own launchers
(the system C compiler and Python's headers, both present wherever Triton runs), once per
source, compiler and interpreter, into $INFERSCALE_CACHE/native (~/.cache/inferscale/native).
Where that fails (no compiler, no headers) the callers keep their Python path, which gives the
same results, after one warning.

INFERSCALE_NATIVE=0 turns every compiled path off (A/B measurements, debugging).
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
from functools import cache
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

NATIVE_ENV = "INFERSCALE_NATIVE"
"""Set to 0 to keep the Python paths."""
_FLAGS = ("-O2", "-shared", "-fPIC", "-std=c11")


@cache
def compiled(source: Path, name: str) -> ModuleType | None:
    """The extension module `name` built from `source`, or None.

    None where INFERSCALE_NATIVE=0 or it cannot be built here (logged once per module).
    """
    if os.environ.get(NATIVE_ENV, "1").strip() == "0":
        logger.info("InferScale: %s=0, %s stays in Python", NATIVE_ENV, name)
        return None
    try:
        return build(source, name, cache_dir())
    except Exception as exc:  # noqa: BLE001 - any failure leaves the Python path, never the engine
        logger.warning("InferScale: %s is unavailable (%s); its Python path serves instead "
                       "(slower per request)", name, exc)
        return None


def cache_dir() -> Path:
    """$INFERSCALE_CACHE/native, or ~/.cache/inferscale/native."""
    root = os.environ.get("INFERSCALE_CACHE") or Path.home() / ".cache" / "inferscale"
    return Path(root) / "native"


def build(source: Path, name: str, folder: Path, compiler: str | None = None) -> ModuleType:
    """Compile `source` into `folder` (once per source, compiler and interpreter) and load it.

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
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    digest = hashlib.sha256(b"\0".join([source.read_bytes(), cc.encode(), " ".join(_FLAGS).encode(),
                                        include.encode(), suffix.encode(),
                                        sys.version.encode()])).hexdigest()[:16]
    target = folder / digest / f"{name}{suffix}"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        # Compiled under a temporary name, then renamed: processes of one engine may build at once.
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            built = Path(scratch) / target.name
            done = subprocess.run([cc, *_FLAGS, f"-I{include}", str(source), "-o", str(built)],
                                  capture_output=True, text=True, timeout=300, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-2000:]}")
            os.replace(built, target)
        logger.info("InferScale: compiled %s into %s", name, target)
    spec = importlib.util.spec_from_file_location(name, target)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {target}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
