"""Live Memory objects by name, so framework objects hold only a name that survives pickling.

KVMemory, ChatInferScale, InferScaleLLM and the create_agent middleware are pydantic models
that frameworks copy, dump and pickle; the Memory (and its vLLM engine) must not travel with
them. They keep `memory_name` and look the live Memory up here on each use.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from inferscale_engine.errors import InferScaleError

if TYPE_CHECKING:
    from inferscale_engine.memory import Memory

DEFAULT_NAME = "default"

_lock = threading.Lock()
_memories: dict[str, Memory] = {}


class MemoryNotRegisteredError(InferScaleError, LookupError):
    """No live Memory is registered under the name a framework object refers to."""


def register_memory(memory: Memory, name: str = DEFAULT_NAME) -> str:
    """Make `memory` reachable as `name` (replacing what was there); returns the name.

    Raises:
        TypeError: `memory` is not an inferscale_engine Memory.
        ValueError: `name` is empty.
    """
    from inferscale_engine.memory import Memory

    if not isinstance(memory, Memory):
        raise TypeError(f"register_memory needs an inferscale_engine Memory, got "
                        f"{type(memory).__name__}; build one with Memory.from_config(...)")
    check_name(name)
    with _lock:
        _memories[name] = memory
    return name


def unregister_memory(name: str = DEFAULT_NAME) -> None:
    """Forget the Memory registered as `name` (nothing happens if there is none)."""
    with _lock:
        _memories.pop(name, None)


def get_memory(name: str = DEFAULT_NAME) -> Memory:
    """The live Memory registered as `name`.

    Raises:
        MemoryNotRegisteredError: nothing is registered under that name.
    """
    with _lock:
        memory = _memories.get(name)
    if memory is None:
        raise MemoryNotRegisteredError(
            f"no Memory is registered as {name!r} in this process; call "
            f"inferscale_integrations.register_memory(memory, name={name!r}) first (objects "
            "restored from pickle or JSON find their Memory by this name)")
    return memory


def claim_name(memory: Memory, name: str) -> None:
    """Register `memory` as `name` unless the name is taken (by `memory` itself: fine).

    Raises:
        ValueError: `name` already names another live Memory.
    """
    check_name(name)
    with _lock:
        current = _memories.setdefault(name, memory)
    if current is not memory:
        raise ValueError(f"memory_name={name!r} already names another Memory; pass another "
                         "memory_name, or call register_memory(memory, name) to replace it")


def check_name(name: object) -> str:
    """`name` if it is a non-blank string."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a memory name must be a non-empty string, got {name!r}")
    return name
