"""The files Memory.import_ reads: InferScale's export, mem0's export, a LangGraph store's dump.

Each is read whole and checked before anything is stored: a bad record is an
InvalidRequestError that names its line (JSON Lines) or its place in the document (one JSON
document), and nothing is imported. The format is told by the content (or given):

- 'inferscale': our JSON Lines (docs/memory.md#export-and-import): a header line
  {"format": "inferscale.memories", "version": 1, ...}, then one fact per line.
- 'mem0': mem0's records {"id", "memory", "metadata", "created_at", "updated_at", "user_id",
  "agent_id", "run_id", "expiration_date", ...}, as a get_all answer {"results": [...]}, a list
  or JSON Lines; mem0's other fields (hash, role, actor_id, score, ...) are not kept.
- 'langgraph': LangGraph store items {"namespace": [...], "key", "value": {...}, "created_at",
  "updated_at"}, as a list, {"items": [...]} or JSON Lines: one fact per item, its text
  value["text"] (else the value as JSON), the item under the metadata key 'langgraph'.

Every record gets a source key (mem0:<id>, langgraph:[namespace, key], our facts' identity):
importing a record whose source the user already has adds nothing (store/transfer.py).
Importable without torch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from inferscale_engine import checks
from inferscale_engine.errors import InferScaleError, InvalidRequestError
from inferscale_engine.memory.search.filters import scope
from inferscale_engine.memory.store.history import EVENTS
from inferscale_engine.memory.store.reserved import CONTEXT_KEY, scoped
from inferscale_engine.memory.store.transfer import native_source
from inferscale_engine.prompting.contexts import RunContext

SCHEMA = "inferscale.memories"
"""The header's "format" of an InferScale export."""
SCHEMA_VERSION = 1
"""The version of the export schema written here; an import reads versions up to it."""
FORMATS = ("inferscale", "mem0", "langgraph")
"""The formats read (format= of Memory.import_)."""
FACT_FIELDS = ("id", "user_id", "agent_id", "run_id", "session_id", "text", "metadata",
               "created_at", "updated_at", "valid_from", "valid_to", "superseded_by",
               "expires_at", "pinned", "source", "context", "history")
"""The fields of one fact line of an InferScale export, in the order written."""


@dataclass(frozen=True, slots=True)
class ImportRecord:
    """One fact to import, checked: what it says, before it is tokenized and embedded."""

    where: str
    """Its place in the file, for messages ('line 7', 'record 3')."""
    source: str
    text: str
    metadata: dict[str, Any]
    """Its metadata with InferScale's reserved keys (scopes, context); SOURCE_KEY not yet."""
    created_at: float | None
    updated_at: float | None
    session_id: str | None = None
    valid_from: float | None = None
    valid_to: float | None = None
    superseded_by: str | None = None
    """The source of the fact that superseded it."""
    expires_at: float | None = None
    history: tuple[tuple[str, str | None, str | None, float], ...] | None = None
    """(event, old text, new text, time) oldest first; None: the file has none (an ADD is
    recorded at created_at)."""
    pinned: bool = False
    """Pinned in the export (pinned again on import, within the pin caps)."""


def read(text: str, format: str | None = None) -> tuple[str, list[ImportRecord]]:
    """(format, records) of a file's content, every record checked.

    Raises:
        InvalidRequestError: the content is of no known format, or a record is bad; the message
            names the line or record.
    """
    if format is not None and format not in FORMATS:
        raise InvalidRequestError(f"format={format!r}; pass one of {FORMATS} or None (told "
                                  "from the content)")
    entries = _entries(text)
    if not entries:
        raise InvalidRequestError("the file holds no records; nothing to import")
    found = format or _detect(entries[0][1])
    if found == "inferscale":
        records = _ours(entries)
    else:
        parse = _mem0 if found == "mem0" else _langgraph
        records = [_at(where, parse, entry) for where, entry in entries]
    _check_one_user(entries if found != "inferscale" else entries[1:])
    seen: dict[str, str] = {}
    for record in records:
        if record.source in seen:
            raise InvalidRequestError(f"{record.where}: the record {record.source!r} repeats "
                                      f"{seen[record.source]}; nothing was imported")
        seen[record.source] = record.where
    return found, records


def _entries(text: str) -> list[tuple[str, Any]]:
    """(place, JSON value) of each record: one JSON document's list, else each line's."""
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if isinstance(document, Mapping):
        items = next((document[k] for k in ("results", "items", "memories")
                      if isinstance(document.get(k), list)), None)
        document = [document] if items is None else items
    if isinstance(document, list):
        return [(f"record {i + 1}", item) for i, item in enumerate(document)]
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                entries.append((f"line {number}", json.loads(line)))
            except ValueError as exc:
                raise InvalidRequestError(f"line {number} is not JSON ({exc}); every line of "
                                          "a JSON Lines file is one JSON object; nothing was "
                                          "imported") from None
    return entries


def _detect(first: Any) -> str:
    if isinstance(first, Mapping):
        if first.get("format") == SCHEMA:
            return "inferscale"
        if "memory" in first:
            return "mem0"
        if {"namespace", "key", "value"} <= first.keys():
            return "langgraph"
    raise InvalidRequestError(
        f"the first record {first!r:.120} is of no known format: expected an InferScale export "
        f"(a header line with format {SCHEMA!r}), mem0 records (with 'memory') or LangGraph "
        "items (with 'namespace', 'key', 'value'); or pass format=")


_T = TypeVar("_T")


def _at(where: str, parse: Callable[[str, Mapping[str, Any]], _T], entry: Any) -> _T:
    """parse(entry) with every error prefixed by the record's place."""
    if not isinstance(entry, Mapping):
        raise InvalidRequestError(f"{where} is {entry!r:.80}, not a JSON object; nothing was "
                                  "imported")
    try:
        return parse(where, entry)
    except InferScaleError as exc:
        raise InvalidRequestError(f"{where}: {exc}; nothing was imported") from None


def _check_one_user(entries: Iterable[tuple[str, Any]]) -> None:
    users = sorted({str(e["user_id"]) for _, e in entries
                    if isinstance(e, Mapping) and e.get("user_id") is not None})
    if len(users) > 1:
        raise InvalidRequestError(f"the file holds the memories of several users ({users[:5]}); "
                                  "import one user's records at a time; nothing was imported")


# ---- InferScale's export ---------------------------------------------------------------
def _ours(entries: list[tuple[str, Any]]) -> list[ImportRecord]:
    where, header = entries[0]
    version = header.get("version") if isinstance(header, Mapping) else None
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidRequestError(f"{where}: the header's version is {version!r}; an export "
                                  "header has an int version")
    if version > SCHEMA_VERSION:
        raise InvalidRequestError(f"{where}: schema version {version} is newer than this "
                                  f"InferScale reads ({SCHEMA_VERSION}); upgrade inferscale")
    count = header.get("num_facts")
    if count is not None and count != len(entries) - 1:
        raise InvalidRequestError(f"the header says {count} facts but the file holds "
                                  f"{len(entries) - 1}: was it cut short? nothing was imported")
    ids = {e["id"]: _at(w, lambda _, e: _native(e), e) for w, e in entries[1:]
           if isinstance(e, Mapping) and isinstance(e.get("id"), int)
           and not isinstance(e.get("id"), bool)}
    return [_at(w, lambda w, e: _fact(w, e, ids), e) for w, e in entries[1:]]


def _native(entry: Mapping[str, Any]) -> str:
    """A record's source: its own 'source', else its id and creation time."""
    source = entry.get("source")
    if isinstance(source, str) and source:
        return source
    return native_source(entry["id"], _time(entry.get("created_at"), "created_at") or 0.0)


def _fact(where: str, entry: Mapping[str, Any], sources: Mapping[int, str]) -> ImportRecord:
    if unknown := set(entry) - set(FACT_FIELDS):
        raise InvalidRequestError(f"unknown fields {sorted(unknown)}; a fact line has "
                                  f"{FACT_FIELDS}")
    fact_id = entry.get("id")
    source = sources.get(fact_id) if type(fact_id) is int else None
    if source is None:
        raise InvalidRequestError(f"id={fact_id!r:.40} must be an int (the fact's id)")
    valid_to, newer = _time(entry.get("valid_to"), "valid_to"), entry.get("superseded_by")
    if newer is not None and valid_to is None:
        raise InvalidRequestError(f"superseded_by={newer!r:.40} without valid_to; a superseded "
                                  "fact has both")
    metadata = _metadata(entry.get("metadata"), entry.get("agent_id"), entry.get("run_id"))
    context = entry.get("context")
    if isinstance(context, Mapping):
        context = RunContext.from_json(context).to_json()
    elif context is not None and not isinstance(context, str):
        raise InvalidRequestError(f"context={context!r:.60}: a text, a run context or null")
    if context:
        metadata[CONTEXT_KEY] = context
    history = entry.get("history")
    pinned = entry.get("pinned", False)
    if not isinstance(pinned, bool):
        raise InvalidRequestError(f"pinned={pinned!r:.40} must be true or false")
    return ImportRecord(
        where, source, checks.check_text(entry.get("text"), "text"), metadata,
        _time(entry.get("created_at"), "created_at"), _time(entry.get("updated_at"),
                                                            "updated_at"),
        checks.check_session(entry.get("session_id")), _time(entry.get("valid_from"),
                                                             "valid_from"),
        valid_to, sources.get(newer) if isinstance(newer, int) else None,
        _time(entry.get("expires_at"), "expires_at"),
        None if history is None else tuple(_event(e, i) for i, e in enumerate(
            checks.check_list(history, "history", InvalidRequestError))), pinned)


def _event(event: Any, i: int) -> tuple[str, str | None, str | None, float]:
    what = f"history[{i}]"
    if not isinstance(event, Mapping) or event.get("event") not in EVENTS:
        raise InvalidRequestError(f"{what} is {event!r:.80}; an event is {{'event': one of "
                                  f"{EVENTS}, 'old_text', 'new_text', 'created_at'}}")
    texts = [event.get(k) for k in ("old_text", "new_text")]
    if any(t is not None and not isinstance(t, str) for t in texts):
        raise InvalidRequestError(f"{what}: old_text and new_text are texts or null")
    at = _time(event.get("created_at"), f"{what}.created_at")
    if at is None:
        raise InvalidRequestError(f"{what} has no created_at")
    return event["event"], texts[0], texts[1], at


# ---- mem0 and LangGraph ----------------------------------------------------------------
def _mem0(where: str, entry: Mapping[str, Any]) -> ImportRecord:
    source = entry.get("id")
    if isinstance(source, bool) or not isinstance(source, str | int) or source == "":
        raise InvalidRequestError(f"id={source!r:.40}: a mem0 record has an id")
    metadata = _metadata(entry.get("metadata"), entry.get("agent_id"), entry.get("run_id"))
    return ImportRecord(where, f"mem0:{source}", checks.check_text(entry.get("memory"), "memory"),
                        metadata, _time(entry.get("created_at"), "created_at"),
                        _time(entry.get("updated_at"), "updated_at"),
                        expires_at=_time(entry.get("expiration_date"), "expiration_date",
                                         day_end=True))


def _langgraph(where: str, entry: Mapping[str, Any]) -> ImportRecord:
    namespace, key, value = entry.get("namespace"), entry.get("key"), entry.get("value")
    if not isinstance(namespace, list | tuple) or not namespace or not all(
            isinstance(label, str) and label for label in namespace):
        raise InvalidRequestError(f"namespace={namespace!r:.60}: a list of labels")
    if not isinstance(key, str) or not key or not isinstance(value, Mapping):
        raise InvalidRequestError(f"key={key!r:.40}, value={value!r:.40}: an item has a "
                                  "string key and an object value")
    text = value.get("text")
    if not isinstance(text, str) or not checks.has_visible(text):
        text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    item = {"namespace": list(namespace), "key": key, "value": dict(value)}
    return ImportRecord(where, "langgraph:" + json.dumps([list(namespace), key],
                                                         ensure_ascii=False),
                        checks.check_text(text, "text"), _metadata({"langgraph": item}, None,
                                                                   None),
                        _time(entry.get("created_at"), "created_at"),
                        _time(entry.get("updated_at"), "updated_at"))


# ---- fields ------------------------------------------------------------------------------
def _metadata(value: Any, agent_id: Any, run_id: Any) -> dict[str, Any]:
    """The app's metadata (checked, no reserved key) with the agent and run scopes."""
    return dict(scoped(checks.check_metadata(value), *scope(agent_id, run_id)) or {})


def _time(value: Any, what: str, *, day_end: bool = False) -> float | None:
    """A time field as seconds since the epoch: a number or an ISO 8601 string (None: null)."""
    return checks.check_time(value, what, InvalidRequestError, day_end=day_end)

