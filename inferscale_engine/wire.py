"""Parsing the fields of kv_transfer_params: one clear PlanError per malformed field.

Plans arrive from untrusted clients; each helper checks one field's type and range.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from inferscale_engine.errors import PlanError

MAX_TOKEN_ID = 2**31 - 1


def key_scales(value: Any) -> tuple[float, ...]:
    """The key_scale field: () or positive factors below 100."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < 100 for v in value):
        raise PlanError(f"plan field 'key_scale' must be a list of positive numbers, got "
                        f"{value!r:.60}")
    return tuple(float(v) for v in value)


def packed_field(raw: Mapping[str, Any], name: str, item_size: int, what: str) -> bytes:
    """A base64 field decoded, holding whole items of item_size bytes."""
    value = raw.get(name)
    if not isinstance(value, str):
        raise PlanError(f"plan field {name!r} must be a base64 string of {what}, got "
                        f"{type(value).__name__}")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise PlanError(f"plan field {name!r} is not valid base64") from None
    if len(data) % item_size:
        raise PlanError(f"plan field {name!r} must hold whole {what} ({item_size} bytes each), "
                        f"got {len(data)} bytes")
    return data


def str_field(raw: Mapping[str, Any], name: str) -> str:
    """A string field."""
    value = raw.get(name)
    if not isinstance(value, str):
        raise PlanError(f"plan field {name!r} must be a string, got {type(value).__name__}")
    return value


def int_field(raw: Mapping[str, Any], name: str) -> int:
    """A non-negative int field (bools refused)."""
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlanError(f"plan field {name!r} must be a non-negative int, got {value!r}")
    return value


def ints_field(raw: Mapping[str, Any], name: str) -> list[int]:
    """A list of ints in [0, 2**31)."""
    value = raw.get(name)
    if not isinstance(value, list | tuple):
        raise PlanError(f"plan field {name!r} must be a list of ints, got {type(value).__name__}")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOKEN_ID:
            raise PlanError(f"plan field {name!r} holds {v!r}; expected ints in [0, 2**31)")
    return list(value)
