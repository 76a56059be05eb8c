"""Input checks: the one place that says what a user id, a fact, a turn or metadata may be.

Every layer (Memory, Engine, FactStore, RetrievalIndex, the adapters) calls these, so a rule
has one implementation and one message. Each check raises the specific InferScaleError given
by the caller's layer (or the default), with what failed, the bad value and what to do.
Pure Python: importable without torch or vLLM.
"""

from __future__ import annotations

import json
import math
import numbers
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from inferscale_engine.errors import (
    ConfigError,
    InvalidFactError,
    InvalidRequestError,
    InvalidTurnError,
    InvalidUserIdError,
)
from inferscale_engine.facts import FactId

ROLES = ("system", "user", "assistant", "tool")
"""Roles a chat message may have."""
FACT_ROLES = ("user", "assistant")
"""Turns whose content becomes a fact."""
RESERVED_PREFIX = "inferscale."
"""Metadata keys starting with this are InferScale's own."""
MAX_USER_ID_CHARS = 256
"""Longest user id or session id (they key every lookup and travel in headers)."""
MAX_METADATA_BYTES = 64 * 2**10
"""Largest metadata of one call, as compact JSON."""
MAX_METADATA_DEPTH = 16
"""Deepest nesting of lists and dicts in metadata (a dict of dicts is depth 2)."""
_MAX_FACT_ID = 2**63 - 1  # SQLite INTEGER

_INVISIBLE_CATEGORIES = frozenset({"Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Cn", "Co"})
# Characters of visible categories that render as nothing: Hangul fillers, the braille blank,
# the combining grapheme joiner, variation selectors, tags, the Mongolian vowel separator.
_INVISIBLE_CHARS = frozenset(
    "\u115f\u1160\u3164\uffa0\u2800\u034f\u180e\u17b4\u17b5"
    + "".join(map(chr, range(0xFE00, 0xFE10))))


def _invisible(char: str) -> bool:
    code = ord(char)
    return (unicodedata.category(char) in _INVISIBLE_CATEGORIES or char in _INVISIBLE_CHARS
            or 0xE0000 <= code <= 0xE007F or 0xE0100 <= code <= 0xE01EF)


def has_visible(text: str) -> bool:
    """True if `text` has a character that renders.

    Spaces, zero-width characters, joiners, variation selectors and control characters do not.
    """
    return any(not _invisible(c) for c in text)


def check_str(value: object, what: str, error: type[Exception]) -> str:
    """`value` if it is a str of valid Unicode (possibly blank)."""
    if isinstance(value, bytes | bytearray | memoryview):
        raise error(f"{what} is {type(value).__name__}, not text; decode it first, e.g. "
                    "data.decode('utf-8', errors='replace')")
    if not isinstance(value, str):
        raise error(f"{what} must be a str, got {type(value).__name__} {value!r:.60}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(f"{what} is not valid Unicode: a lone surrogate at index {exc.start} "
                    "(bytes decoded with 'surrogateescape'?); decode the source with its real "
                    "encoding or errors='replace'") from None
    return value


def check_text(value: object, what: str, error: type[Exception] = InvalidFactError, *,
               strip: bool = True) -> str:
    """`value` (stripped unless strip=False) if it is valid Unicode with a visible character."""
    text = check_str(value, what, error)
    if not has_visible(text):
        raise error(f"{what} is empty or has no visible character ({value!r:.20}); pass text "
                    "with content")
    return text.strip() if strip else text


def check_user_id(user_id: object, error: type[Exception] = InvalidUserIdError) -> str:
    """A user id in NFC form: a str with a visible character and no control characters.

    NFC makes the composed and decomposed spellings of one name ('café') the same user. At most
    MAX_USER_ID_CHARS characters.
    """
    if (type(user_id) is str and len(user_id) <= MAX_USER_ID_CHARS and user_id.isascii()
            and user_id.isprintable() and user_id.strip()):
        return user_id  # printable ASCII with a non-space: the checks below pass, NFC is itself
    check_str(user_id, "user_id", error)
    assert isinstance(user_id, str)
    if len(user_id) > MAX_USER_ID_CHARS:
        raise error(f"user_id has {len(user_id)} characters ({user_id!r:.40}...); at most "
                    f"{MAX_USER_ID_CHARS}: use a stable short id, not a name or a document")
    if any(unicodedata.category(c) == "Cc" for c in user_id):
        raise error(f"user_id {user_id!r:.40} contains a control character; user ids are "
                    "printable text")
    if not has_visible(user_id):
        raise error(f"user_id is empty or blank ({user_id!r:.20}); pass the same non-empty id "
                    "for every call of one user")
    return unicodedata.normalize("NFC", user_id)


def check_session(session_id: object, what: str = "session_id",
                  error: type[Exception] = InvalidTurnError) -> str | None:
    """None or a session (agent, run) id with a visible character, at most 256 characters."""
    if session_id is None:
        return None
    check_text(session_id, what, error)
    if len(str(session_id)) > MAX_USER_ID_CHARS:
        raise error(f"{what} has {len(str(session_id))} characters; at most "
                    f"{MAX_USER_ID_CHARS}")
    return str(session_id)


def check_list(values: object, what: str, error: type[Exception],
               num_expected: int | None = None) -> Sequence[Any]:
    """`values` if it is list-like (a sequence or an array; not a str, bytes or dict).

    With num_expected, it must also have that length.
    """
    array_like = hasattr(values, "__len__") and hasattr(values, "__getitem__")
    if isinstance(values, str | bytes | bytearray | Mapping) or not (
            isinstance(values, Sequence) or array_like):
        raise error(f"{what} must be a list, got {type(values).__name__} {values!r:.60}; wrap "
                    f"a single item: {what}=[...]")
    sized = cast(Sequence[Any], values)
    if num_expected is not None and len(sized) != num_expected:
        raise error(f"{len(sized)} {what} for {num_expected} facts; pass one per fact")
    return sized


def check_role(role: object, what: str) -> str:
    """A chat role (one of ROLES)."""
    if role not in ROLES:
        raise InvalidTurnError(f"{what} is {role!r:.40}; a role is one of {ROLES}")
    return str(role)


def check_messages(messages: object) -> list[tuple[str, str]]:
    """(role, content) of role/content dicts; content may be blank (it is not made a fact)."""
    turns = []
    for i, message in enumerate(check_list(messages, "messages", InvalidTurnError)):
        if not isinstance(message, Mapping) or message.get("role") not in ROLES:
            raise InvalidTurnError(f"messages[{i}] is {message!r:.80}; pass dicts with role in "
                                   f"{ROLES} and str content")
        content = check_str(message.get("content"), f"messages[{i}] content", InvalidTurnError)
        turns.append((str(message["role"]), content))
    return turns


def check_metadata(metadata: object, what: str = "metadata") -> dict[str, Any] | None:
    """None or a JSON-serializable dict with str keys, none of them reserved."""
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata):
        raise InvalidFactError(f"{what} is {metadata!r:.80}; pass a dict with string keys")
    if any(k.startswith(RESERVED_PREFIX) for k in metadata):
        raise InvalidFactError(f"{what} keys starting with {RESERVED_PREFIX!r} are reserved; "
                               "rename them")
    return json_object(metadata, what)


def json_object(metadata: Mapping[str, Any], what: str,
                max_bytes: int = MAX_METADATA_BYTES) -> dict[str, Any]:
    """`metadata` as a dict if json.dumps accepts it (finite numbers only) and it is bounded.

    At most MAX_METADATA_DEPTH levels of nesting and `max_bytes` of JSON: whatever is stored
    must be readable again by every layer (JSON parsers have recursion limits).
    """
    if _nesting(metadata) > MAX_METADATA_DEPTH:
        raise InvalidFactError(f"{what} is nested more than {MAX_METADATA_DEPTH} levels deep "
                               "(dicts and lists); flatten it")
    try:
        encoded = json.dumps(dict(metadata), allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidFactError(f"{what} is not JSON-serializable ({exc}); use str, int, "
                               "finite float, bool, None, lists and dicts") from None
    size = len(encoded.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise InvalidFactError(f"{what} is {size} bytes as JSON; at most {max_bytes}: "
                               "keep large documents elsewhere and store a reference")
    return dict(metadata)


def _nesting(value: object) -> int:
    """Levels of dicts and lists in `value`, counted without recursion (1 for a flat dict).

    Stops counting past MAX_METADATA_DEPTH + 1, so a hostile value costs what a bounded one does.
    """
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, Mapping | list | tuple):
            continue
        deepest = max(deepest, depth)
        if depth > MAX_METADATA_DEPTH:
            return depth
        stack.extend((child, depth + 1) for child in (
            item.values() if isinstance(item, Mapping) else item))
    return deepest


def check_fact_ids(fact_ids: object, what: str = "fact_ids",
                   error: type[Exception] = InvalidFactError) -> list[FactId]:
    """Fact ids as add() returned them: a list of positive ints (`what`: a single one's name)."""
    if hasattr(fact_ids, "tolist"):  # numpy array or torch tensor
        fact_ids = fact_ids.tolist()
    if isinstance(fact_ids, str | bytes | Mapping) or not isinstance(fact_ids, Iterable):
        raise error(f"{what} must be a list of ints, got {type(fact_ids).__name__} "
                    f"{fact_ids!r:.60}; wrap a single item: {what}=[...]")
    ids = list(fact_ids)
    for i, fact_id in enumerate(ids):
        if isinstance(fact_id, bool) or not isinstance(fact_id, numbers.Integral) or not (
                1 <= int(fact_id) <= _MAX_FACT_ID):
            name = what if what != "fact_ids" else f"fact_ids[{i}]"
            raise error(f"{name} is {fact_id!r:.40}; pass fact ids as returned by add() "
                        "(positive ints)")
    return [FactId(int(f)) for f in ids]


def check_int(value: object, what: str, minimum: int, error: type[Exception]) -> int:
    """`value` if it is an int (not a bool) >= minimum."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise error(f"{what}={value!r:.40} must be an int >= {minimum}")
    return value


def check_half_scan_min_rows(value: object) -> int | None:
    """`value` if it is None (the device's default) or an int >= 0 (0 = never).

    ConfigError otherwise (MemoryConfig, the indexes, the server's flag).
    """
    return None if value is None else check_int(value, "half_scan_min_rows", 0, ConfigError)


def comparable_text(text: str) -> str:
    """`text` with only its formatting removed.

    Unicode form (NFKC), case, spacing, invisible characters and punctuation go; words, digits,
    symbols and emoji stay.
    """
    kept = []
    for char in unicodedata.normalize("NFKC", text).casefold():
        if _invisible(char) and not char.isspace():
            continue
        kept.append(" " if char.isspace() or unicodedata.category(char)[0] == "P" else char)
    return " ".join("".join(kept).split())


def same_text(a: str, b: str) -> bool:
    """True if two texts say the same words (they differ at most in formatting).

    The text-level half of duplicate detection: an embedding model maps unrelated texts it
    cannot read (emoji, rare scripts) to one vector, so similarity alone never drops a fact.
    """
    return comparable_text(a) == comparable_text(b)


def check_time(value: object, what: str, error: type[Exception] = InvalidRequestError, *,
               day_end: bool = False, hint: str = "") -> float | None:
    """A point in time as seconds since the epoch (None stays None).

    Takes a datetime (naive: UTC), a date (its midnight UTC; with day_end, the end of that
    day), an ISO 8601 string of either, or a number of seconds since the epoch. `hint` ends
    the error message.
    """
    import datetime as dt

    if value is None:
        return None
    hint = hint or ("pass a datetime, a date, an ISO 8601 string such as '2024-05-08' or "
                    "'2024-05-08T14:30:00+02:00', or seconds since the epoch")
    if isinstance(value, str):
        text = value.strip()
        try:
            value = (dt.date.fromisoformat(text) if len(text) == 10
                     else dt.datetime.fromisoformat(text))
        except ValueError:
            raise error(f"{what}={text!r:.60} is not an ISO 8601 date or time; {hint}") from None
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        value = dt.datetime.combine(value + dt.timedelta(days=1 if day_end else 0),
                                    dt.time(), dt.UTC)
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)).timestamp()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise error(f"{what}={value!r:.60} ({type(value).__name__}) is not a time; {hint}")
    return float(value)
