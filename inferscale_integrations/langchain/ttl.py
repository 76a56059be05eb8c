"""KVMemoryStore's TTL, with LangGraph's semantics (langgraph.store.base.TTLConfig).

An item put with `ttl` (minutes; default: the config's default_ttl) expires that long after
its last write, or its last read when reads refresh it (refresh_on_read, or a read's
refresh_ttl). Its facts carry the expiry (Memory's expiration_date), so the Memory never
serves their KV once it passed. Until the sweeper deletes the item (history EXPIRE), reads
still return it unless omit_expired is set, as LangGraph's own stores do; a refresh never
brings an expired item back. The sweeper is a thread started by start_ttl_sweeper(), every
sweep_interval_minutes, as PostgresStore's.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from inferscale_engine.errors import ConfigError, EngineClosedError, InvalidRequestError

logger = logging.getLogger(__name__)

TTL_FIELD = "langgraph_ttl"
"""The metadata key of an item's facts holding its TTL in minutes (absent: no TTL)."""
_TTL_KEYS = ("default_ttl", "refresh_on_read", "omit_expired", "sweep_interval_minutes")
_DEFAULT_SWEEP_MINUTES = 5.0
"""LangGraph's PostgresStore's sweep interval when the config names none."""


def check_ttl_config(ttl: object) -> dict[str, Any] | None:
    """LangGraph's TTLConfig, checked (ConfigError); a copy the store may read each call."""
    if ttl is None:
        return None
    if not isinstance(ttl, Mapping):
        raise ConfigError(f"ttl must be a TTLConfig dict (keys {', '.join(_TTL_KEYS)}), got "
                          f"{type(ttl).__name__}")
    unknown = sorted(set(ttl) - set(_TTL_KEYS))
    if unknown:
        raise ConfigError(f"ttl has unknown key(s) {unknown}; a TTLConfig has "
                          f"{', '.join(_TTL_KEYS)}")
    for key in ("default_ttl", "sweep_interval_minutes"):
        if ttl.get(key) is not None:
            minutes(ttl[key], f"ttl[{key!r}]", ConfigError)
    for key in ("refresh_on_read", "omit_expired"):
        if key in ttl and not isinstance(ttl[key], bool):
            raise ConfigError(f"ttl[{key!r}]={ttl[key]!r} must be True or False")
    return dict(ttl)


def minutes(value: object, what: str = "ttl",
            error: type[Exception] = InvalidRequestError) -> float:
    """A positive finite number of minutes."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value > 0):
        raise error(f"{what}={value!r} must be minutes > 0 (LangGraph's TTL), or None for an "
                    "item that never expires")
    return float(value)


def expiry_of(ttl_minutes: float | None) -> float | None:
    """Seconds since the epoch at which an item written (or refreshed) now expires."""
    return None if ttl_minutes is None else time.time() + ttl_minutes * 60.0


class Sweeper:
    """A thread that calls `sweep` every interval until stopped (PostgresStore's contract)."""

    def __init__(self, sweep: Callable[[], int]) -> None:
        self._sweep = sweep
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, interval_minutes: float | None) -> concurrent.futures.Future[None]:
        """Start sweeping (a no-op if running); the future is done when the thread ends."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        if self._thread is not None and self._thread.is_alive():
            future.add_done_callback(lambda f: self._stop.set() if f.cancelled() else None)
            return future
        interval = 60.0 * minutes(interval_minutes or _DEFAULT_SWEEP_MINUTES,
                                  "sweep_interval_minutes", ConfigError)
        self._stop.clear()

        def run() -> None:
            try:
                while not self._stop.wait(interval):
                    try:
                        self._sweep()
                    except EngineClosedError:
                        return
                    except Exception as exc:  # noqa: BLE001 - the next sweep tries again
                        logger.warning("store TTL sweep failed (%s); retrying", exc)
            finally:
                if not future.done():
                    future.set_result(None)

        future.add_done_callback(lambda f: self._stop.set() if f.cancelled() else None)
        self._thread = threading.Thread(target=run, name="inferscale-store-ttl-sweeper",
                                        daemon=True)
        self._thread.start()
        return future

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the thread; False if it did not end within `timeout` seconds."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return True
        self._stop.set()
        thread.join(timeout)
        if thread.is_alive():
            return False
        self._thread = None
        return True
