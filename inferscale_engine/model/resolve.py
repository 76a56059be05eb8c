"""Which model a command serves: 'small', 'auto' or a folder, and the dtype to serve it in."""

from __future__ import annotations

from pathlib import Path


def resolve_model(name: str) -> tuple[Path, str]:
    """Model folder and dtype for 'small' | 'auto' | a model folder.

    'small' is the real Qwen2.5-Coder-0.5B-Instruct, built once from its PyPI-packaged GGUF
    (the `smallmodel` extra); 'auto' is the same. A folder is served in its config's dtype.

    Raises:
        ConfigError: 'small' or 'auto' without the smallmodel extra installed.
    """
    from inferscale_engine.errors import ConfigError
    from inferscale_engine.model.small_model import small_model_available, small_model_path

    if name in ("small", "auto"):
        if not small_model_available():
            raise ConfigError(f"--model {name} needs the small model's packages: pip install "
                              "'inferscale-kv[smallmodel]', or pass a model folder")
        return small_model_path(), "float32"  # bf16 is emulated (slow) on most CPUs
    return Path(name), "auto"
