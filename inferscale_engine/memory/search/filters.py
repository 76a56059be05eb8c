"""Metadata filters of search and listing (the shape mem0 and LangGraph's stores use).

A filter is a mapping. Each key names a metadata field (dots reach into nested mappings:
``"place.city"``) and its value is either a literal (the field equals it) or a mapping of
operators: ``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``, ``$in``, ``$nin``,
``$contains`` (a string field holds the substring, or a list field the item). The keys
``AND`` / ``OR`` (lists of filters) and ``NOT`` (one filter; also ``$and`` / ``$or`` /
``$not``) combine filters. All top-level conditions must hold. A field a fact does not have
matches only ``$ne`` and ``$nin``.

A filter is evaluated against every candidate fact, so its size is bounded before anything is
evaluated (check_filter): MAX_FILTER_DEPTH, MAX_FILTER_LIST, MAX_FILTER_NODES and
MAX_FILTER_CHARS; a larger one is an InvalidRequestError that names the limit.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from inferscale_engine.checks import check_session
from inferscale_engine.errors import InvalidRequestError

MAX_FILTER_DEPTH = 16
"""Mappings and lists nested in a filter, the filter itself included (a combinator nests two:
its list and each part)."""
MAX_FILTER_LIST = 1000
"""Items in one list (an ``$in`` / ``$nin`` operand, an ``AND`` / ``OR``)."""
MAX_FILTER_NODES = 2000
"""Values in a filter in all (each condition, operand and list item counts one)."""
MAX_FILTER_CHARS = 64 * 1024
"""Characters of all its keys and strings together."""

_MISSING = object()
_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "$gt": operator.gt, "$gte": operator.ge, "$lt": operator.lt, "$lte": operator.le}
_OPERATORS = frozenset({"$eq", "$ne", "$in", "$nin", "$contains", *_ORDER})
COMBINATORS = {"AND": "and", "$and": "and", "OR": "or", "$or": "or", "NOT": "not",
               "$not": "not"}
"""Keys that combine filters, and how."""


def check_filter(filter: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The filter, checked; None or {} mean no filter.

    Raises:
        InvalidRequestError: not a mapping, over a size limit (the module docstring), an
            unknown operator, or an operand of the wrong shape (say, $in without a list).
    """
    if filter is None:
        return None
    if not isinstance(filter, Mapping):
        raise InvalidRequestError(f"filter must be a mapping of metadata fields, got "
                                  f"{type(filter).__name__}")
    check_size(filter)
    _check(filter, "filter")
    return dict(filter) or None


def check_size(filter: Mapping[str, Any]) -> None:
    """Refuse a filter over a limit, walking it once without recursion (it may nest deeply).

    Raises:
        InvalidRequestError: what is over which limit, and how to narrow it.
    """
    nodes, chars = 1, 0
    pending: list[tuple[Any, int]] = [(filter, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, Mapping | list | tuple):
            if depth > MAX_FILTER_DEPTH:
                _too_large(f"nests deeper than {MAX_FILTER_DEPTH} levels")
            if not isinstance(value, Mapping) and len(value) > MAX_FILTER_LIST:
                _too_large(f"holds a list of {len(value)} items (at most {MAX_FILTER_LIST})")
            nodes += len(value)
            if nodes > MAX_FILTER_NODES:
                _too_large(f"holds more than {MAX_FILTER_NODES} values")
            if isinstance(value, Mapping):
                chars += sum(len(k) for k in value if isinstance(k, str))
            pending.extend((v, depth + 1) for v in (
                value.values() if isinstance(value, Mapping) else value))
        if chars > MAX_FILTER_CHARS:
            _too_large(f"holds more than {MAX_FILTER_CHARS} characters of keys and strings")


def _too_large(what: str) -> NoReturn:
    raise InvalidRequestError(f"filter {what}: it is evaluated against every fact, so its size "
                              "is bounded; narrow it (fewer or shorter conditions, a tag in "
                              "the metadata instead of a long $in list)")


def _check(filter: Mapping[str, Any], where: str) -> None:
    for key, value in filter.items():
        if not isinstance(key, str) or not key:
            raise InvalidRequestError(f"{where}: keys must be non-empty strings, got {key!r}")
        if key in COMBINATORS:
            parts = [value] if COMBINATORS[key] == "not" else value
            if not isinstance(parts, list) or not all(isinstance(p, Mapping) for p in parts):
                wanted = "a filter" if COMBINATORS[key] == "not" else "a list of filters"
                raise InvalidRequestError(f"{where}.{key} takes {wanted}")
            for i, part in enumerate(parts):
                _check(part, f"{where}.{key}[{i}]")
        elif key.startswith("$"):
            raise InvalidRequestError(f"{where}: unknown operator {key!r} (operators go inside a "
                                      "field's condition: {\"field\": {\"$gt\": 3}})")
        elif isinstance(value, Mapping) and any(str(k).startswith("$") for k in value):
            for op, operand in value.items():
                if op not in _OPERATORS:
                    raise InvalidRequestError(f"{where}.{key}: unknown operator {op!r}; use "
                                              f"one of {sorted(_OPERATORS)}")
                if op in ("$in", "$nin") and not isinstance(operand, list):
                    raise InvalidRequestError(f"{where}.{key}.{op} takes a list")


def matches(metadata: Mapping[str, Any], filter: Mapping[str, Any] | None) -> bool:
    """Whether a fact's metadata satisfies a checked filter (None: every fact does)."""
    if not filter:
        return True
    for key, value in filter.items():
        kind = COMBINATORS.get(key)
        if kind == "and":
            ok = all(matches(metadata, part) for part in value)
        elif kind == "or":
            ok = any(matches(metadata, part) for part in value)
        elif kind == "not":
            ok = not matches(metadata, value)
        else:
            ok = _holds(_field(metadata, key), value)
        if not ok:
            return False
    return True


def lookup(metadata: Mapping[str, Any], path: str, default: Any = None) -> Any:
    """The value at a field path ("place.city" reaches into nested mappings), or `default`.

    A key that itself holds the dots is found first.
    """
    if path in metadata:
        return metadata[path]
    current: Any = metadata
    for part in path.split("."):
        if not isinstance(current, Mapping) or part not in current:
            return default
        current = current[part]
    return current


def _field(metadata: Mapping[str, Any], path: str) -> Any:
    return lookup(metadata, path, _MISSING)


def _holds(actual: Any, condition: Any) -> bool:
    if not (isinstance(condition, Mapping) and any(str(k).startswith("$") for k in condition)):
        return actual is not _MISSING and actual == condition
    for op, operand in condition.items():
        if op == "$ne":
            ok = actual is _MISSING or actual != operand
        elif op == "$nin":
            ok = actual is _MISSING or actual not in operand
        elif actual is _MISSING:
            ok = False
        elif op == "$eq":
            ok = actual == operand
        elif op == "$in":
            ok = actual in operand
        elif op == "$contains":
            ok = isinstance(actual, (str, list)) and (
                operand in actual if isinstance(actual, list) or isinstance(operand, str)
                else False)
        else:
            try:
                ok = _ORDER[op](actual, operand)
            except TypeError:  # an ordering of different types: not a match
                ok = False
        if not ok:
            return False
    return True


def scope(agent_id: str | None, run_id: str | None) -> tuple[str | None, str | None]:
    """(agent_id, run_id) of a call, checked: mem0's scopes within a user."""
    return (check_session(agent_id, "agent_id", InvalidRequestError),
            check_session(run_id, "run_id", InvalidRequestError))


def selected(record: Any, wanted: Mapping[str, Any] | None,
             scope: tuple[str | None, str | None]) -> bool:
    """A public record (ingest.public_record) is in the scope and its metadata match.

    `scope` is (agent_id, run_id); None matches any.
    """
    agent_id, run_id = scope
    return ((agent_id is None or record.agent_id == agent_id)
            and (run_id is None or record.run_id == run_id)
            and matches(record.metadata, wanted))
