"""KVMemoryStore: a LangGraph store whose items are InferScale facts.

`create_agent(..., store=KVMemoryStore(memory))` (or `create_react_agent`, or any graph's
`compile(store=...)`) gives tools and nodes `runtime.store`: put, get, search, delete and
list_namespaces work as with LangGraph's own stores. Each namespace is one memory scope (the
KV salt, the retrieval index and the deletes are per namespace), each item one fact: its text
is `value["text"]` (or the fields `index` names, or the value as JSON), and the value itself
rides in the fact's metadata. Search ranks by the fact embeddings and filters on the value's
fields.

Found items are `KVSearchItem`s: besides the value they carry the fact's KV handle.
`kv_context(items)` turns the items of one namespace into one marker for a prompt, which
ChatInferScale injects as KV; apps that paste `item.value["text"]` instead work with any chat
model (as text). `KVMemoryMiddleware(namespace=...)` attaches the namespace's top-k facts to
every model call of create_agent without any prompt code.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from inferscale_engine.errors import HandleError, InvalidRequestError
from inferscale_engine.facts import MemoryHandle
from inferscale_engine.memory.filters import COMBINATORS, check_filter, lookup
from inferscale_integrations.handles import RECENT_HANDLES
from inferscale_integrations.registry import DEFAULT_NAME, check_name, get_memory

if TYPE_CHECKING:
    from inferscale_engine.memory import Memory
    from inferscale_engine.memory.records import StoredFact

SCOPE_PREFIX = "langgraph:"
"""Memory user ids of store namespaces: the prefix, then the labels percent-encoded, '/'-joined."""
KEY_FIELD, VALUE_FIELD, INDEXED_FIELD = "langgraph_key", "langgraph_value", "langgraph_indexed"


def scope_of(namespace: Sequence[str]) -> str:
    """The Memory user id of a namespace."""
    if not namespace or not all(isinstance(p, str) and p for p in namespace):
        raise InvalidRequestError(f"a namespace is a non-empty tuple of non-empty strings, got "
                                  f"{namespace!r}")
    return SCOPE_PREFIX + "/".join(quote(p, safe="") for p in namespace)


def namespace_of(scope: str) -> tuple[str, ...] | None:
    """The namespace of a Memory user id (None: not a store namespace)."""
    if not scope.startswith(SCOPE_PREFIX):
        return None
    return tuple(unquote(p) for p in scope[len(SCOPE_PREFIX):].split("/"))


class KVSearchItem(SearchItem):
    """A search result that also carries its fact's KV handle."""

    def __init__(self, *args: Any, handle: MemoryHandle, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handle = handle


def kv_context(items: Iterable[SearchItem]) -> str:
    """One marker naming the KV of found items (of one namespace), for a prompt string.

    Raises:
        HandleError: items of several namespaces (one request serves one memory scope), or
            items that are not KVSearchItems.
    """
    handles = []
    for item in items:
        if not isinstance(item, KVSearchItem):
            raise HandleError("kv_context takes items found by KVMemoryStore.search")
        handles.append(item.handle)
    if not handles:
        return ""
    users = {h.user_id for h in handles}
    if len(users) > 1:
        raise HandleError("kv_context takes items of one namespace; found "
                          f"{sorted(namespace_of(u) or () for u in users)}")
    ids = tuple(dict.fromkeys(f for h in handles for f in h.fact_ids))
    return RECENT_HANDLES.marker(MemoryHandle(handles[0].user_id, ids))


class KVMemoryStore(BaseStore):
    """A LangGraph BaseStore over an InferScale Memory (sync, async and batch forms)."""

    supports_ttl = False

    def __init__(self, memory: Memory | str = DEFAULT_NAME, *, text_field: str = "text"
                 ) -> None:
        """Wrap a Memory (nothing is looked up until the first operation).

        Args:
            memory: the Memory, or the name it is registered under (register_memory).
            text_field: the value field whose string is the fact text (others: the value as
                JSON, unless a put names its `index` fields).
        """
        self._memory = memory if not isinstance(memory, str) else None
        self._name = check_name(memory) if isinstance(memory, str) else None
        self.text_field = text_field
        self._lock = threading.Lock()

    @property
    def memory(self) -> Memory:
        """The Memory the items live in."""
        return self._memory if self._memory is not None else get_memory(self._name or "")

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op))
            elif isinstance(op, PutOp):
                self._put(op)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            else:
                raise InvalidRequestError(f"unknown store operation {type(op).__name__}")
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    # ---- operations --------------------------------------------------------------------
    def _get(self, op: GetOp) -> Item | None:
        found = self._find(scope_of(op.namespace), op.key)
        return _item(found, Item) if found is not None else None

    def _put(self, op: PutOp) -> None:
        scope = scope_of(op.namespace)
        if not isinstance(op.key, str) or not op.key:
            raise InvalidRequestError(f"a store key is a non-empty string, got {op.key!r}")
        memory = self.memory
        with self._lock:
            found = self._find(scope, op.key)
            if op.value is None:
                if found is not None:
                    memory.delete(user_id=scope, fact_ids=[found.fact_id])
                return
            if not isinstance(op.value, Mapping):
                raise InvalidRequestError(f"a store value is a dict, got "
                                          f"{type(op.value).__name__}")
            metadata = {KEY_FIELD: op.key, VALUE_FIELD: dict(op.value),
                        INDEXED_FIELD: op.index is not False}
            text = self._text(op.value, op.index)
            if found is None:
                memory.add(user_id=scope, texts=[text], metadata=metadata, dedupe=False)
            else:
                memory.update(user_id=scope, fact_id=found.fact_id, text=text,
                              metadata=metadata)

    def _search(self, op: SearchOp) -> list[SearchItem]:
        memory = self.memory
        prefix = tuple(op.namespace_prefix)
        scopes = [s for s in memory.users()
                  if (ns := namespace_of(s)) is not None and ns[:len(prefix)] == prefix]
        wanted = _on_value(check_filter(op.filter) or {})
        end = op.offset + op.limit
        if op.query is None:
            found: list[tuple[StoredFact, float | None]] = [
                (record, None) for scope in scopes
                for record in memory.records(user_id=scope, filter=wanted or None)
                if KEY_FIELD in record.metadata]  # not facts the namespace got otherwise
        else:
            wanted[INDEXED_FIELD] = True
            found = []
            for scope in scopes:
                result = memory.search(user_id=scope, query=op.query, k=end, filter=wanted)
                found.extend((memory.get(user_id=scope, fact_id=f), score) for f, score in zip(
                    result.handle.fact_ids, result.handle.scores, strict=True))
            found.sort(key=lambda pair: -(pair[1] or 0.0))
        return [_item(record, KVSearchItem, score) for record, score in found[op.offset:end]]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        spaces = sorted({ns for scope in self.memory.users()
                         if (ns := namespace_of(scope)) is not None})
        for condition in op.match_conditions or ():
            path = tuple(condition.path)
            spaces = [ns for ns in spaces if _matches(
                ns[:len(path)] if condition.match_type == "prefix" else ns[-len(path):], path)]
        if op.max_depth is not None:
            spaces = sorted({ns[:op.max_depth] for ns in spaces})
        return spaces[op.offset:op.offset + op.limit]

    # ---- internals ---------------------------------------------------------------------
    def _find(self, scope: str, key: str) -> StoredFact | None:
        records = self.memory.records(user_id=scope, filter={KEY_FIELD: key})
        return records[-1] if records else None

    def _text(self, value: Mapping[str, Any], index: Any) -> str:
        if isinstance(index, list) and index:
            parts = [lookup(value, field) for field in index]
            text = "\n".join(p if isinstance(p, str) else json.dumps(p, ensure_ascii=False)
                             for p in parts if p is not None)
            if text.strip():
                return text
        if isinstance(value.get(self.text_field), str) and value[self.text_field].strip():
            return str(value[self.text_field])
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _item(record: StoredFact, cls: type[Item], score: float | None = None) -> Any:
    namespace = namespace_of(record.user_id) or ()
    fields = {"namespace": namespace, "key": record.metadata[KEY_FIELD],
              "value": record.metadata[VALUE_FIELD],
              "created_at": datetime.fromtimestamp(record.created_at, UTC),
              "updated_at": datetime.fromtimestamp(record.updated_at, UTC)}
    if cls is KVSearchItem:
        return KVSearchItem(score=score, handle=MemoryHandle(
            record.user_id, (record.fact_id,)), **fields)
    return cls(**fields)


def _on_value(filter: Mapping[str, Any]) -> dict[str, Any]:
    """A filter on item values as one on the facts' metadata (the value under VALUE_FIELD)."""
    out: dict[str, Any] = {}
    for key, condition in filter.items():
        if key in COMBINATORS:
            out[key] = (_on_value(condition) if isinstance(condition, Mapping)
                        else [_on_value(part) for part in condition])
        else:
            out[f"{VALUE_FIELD}.{key}"] = condition
    return out


def _matches(labels: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    return len(labels) == len(pattern) and all(p in ("*", label)
                                               for label, p in zip(labels, pattern, strict=True))
