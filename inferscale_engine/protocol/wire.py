"""The kv_transfer_params format's primitives: version, key, packed ids, MAC, field parsers.

Plans (plan.py, save_plan.py) arrive from untrusted clients; each parser checks one field's
type and range (one clear PlanError per malformed field).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from inferscale_engine.errors import PlanError

PLAN_VERSION = 7
"""7: inject plans carry no token ids (the MAC binds the prompt's); 6: MACs and salts are keyed
BLAKE2b; 5: save plans hold spans (runs of facts); 4: keys and lengths packed (3: int lists)."""
PARAMS_KEY = "inferscale"
MAX_TOKEN_ID = 2**31 - 1


def pack_token_ids(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian int32 bytes (one C-level pass; struct beats array here).

    Raises:
        struct.error: an id is out of int32 or not an int.
    """
    return struct.pack(f"<{len(token_ids)}i", *token_ids)


def b64(data: bytes) -> str:
    """Bytes as a base64 str (the params' packed fields)."""
    return base64.b64encode(data).decode("ascii")


def utf8(text: str) -> bytes:
    """UTF-8 with surrogatepass: a forged plan's lone surrogates fail the MAC, never raise."""
    return text.encode("utf-8", "surrogatepass")


def mac_of(secret: bytes, payload: bytes) -> str:
    """The MAC of `payload` under the engine's secret (32 hex digits)."""
    # Keyed BLAKE2b (RFC 7693's MAC mode), 128-bit tags: one C call, a few times cheaper than
    # HMAC-SHA256 on plans of a few KB; a request pays one (MP=0: the salt) or three.
    if len(secret) > 64:  # BLAKE2b takes keys of up to 64 bytes
        secret = hashlib.blake2b(secret).digest()
    return hashlib.blake2b(payload, key=secret, digest_size=16).hexdigest()


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
