"""KVMemoryStore: a LangGraph store whose items are InferScale facts.

`create_agent(..., store=KVMemoryStore(memory))` (or `create_react_agent`, or any graph's
`compile(store=...)`) gives tools and nodes `runtime.store`: put, get, search, delete and
list_namespaces work as with LangGraph's own stores, and LangGraph's own store tests pass
against it (tests/integrations/langgraph_suites). Each namespace is one memory scope (the KV
salt, the retrieval index and the deletes are per namespace). An item is one fact per text it
is searched by: `value["text"]` (or, for other values, the value as JSON), or with LangGraph's
index fields (`fields=` here, `index=[...]` of a put) one fact per text those fields hold, so
each field is embedded on its own and a query scores an item by its best field, as LangGraph's
stores do. The value itself rides in each fact's metadata; filters match its fields.

Found items are `KVSearchItem`s: besides the value they carry the item's KV handle.
`kv_context(items)` turns the items of one namespace into one marker for a prompt, which
ChatInferScale injects as KV; apps that paste `item.value["text"]` instead work with any chat
model (as text). `KVMemoryMiddleware(namespace=...)` attaches the namespace's top-k facts to
every model call of create_agent without any prompt code.

TTL (`ttl=` LangGraph's TTLConfig, `put(..., ttl=minutes)`, refresh on read, the sweeper
started by start_ttl_sweeper()): ttl.py; an expired item's KV is never injected.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote, unquote

from langgraph.store.base import (
    NOT_PROVIDED,
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    get_text_at_path,
    validate_op_namespace,
)

from inferscale_engine import checks
from inferscale_engine.errors import HandleError, InvalidRequestError
from inferscale_engine.facts import MemoryHandle
from inferscale_engine.memory.search.filters import COMBINATORS, check_filter
from inferscale_integrations.handles import RECENT_HANDLES
from inferscale_integrations.langchain.ttl import (
    TTL_FIELD,
    Sweeper,
    check_ttl_config,
    expiry_of,
    minutes,
)
from inferscale_integrations.registry import DEFAULT_NAME, check_name, get_memory

if TYPE_CHECKING:
    from inferscale_engine.memory import Memory
    from inferscale_engine.memory.store.records import StoredFact

SCOPE_PREFIX = "langgraph:"
"""Memory user ids of store namespaces: the prefix, then the labels percent-encoded, '/'-joined."""
KEY_FIELD, VALUE_FIELD, INDEXED_FIELD = "langgraph_key", "langgraph_value", "langgraph_indexed"


def scope_of(namespace: Sequence[str]) -> str:
    """The Memory user id of a namespace.

    Raises:
        InvalidNamespaceError: LangGraph refuses the namespace (empty, a label that is empty,
            not a string, or holds '.' or NUL).
        InvalidRequestError: the namespace is longer than a Memory user id can be.
    """
    namespace = tuple(namespace)
    if not namespace:
        raise InvalidNamespaceError("Namespace cannot be empty.")
    validate_op_namespace(GetOp(namespace, ""))
    scope = SCOPE_PREFIX + "/".join(quote(p, safe="") for p in namespace)
    if len(scope) > checks.MAX_USER_ID_CHARS:
        raise InvalidRequestError(
            f"namespace {namespace!r:.80} is {len(scope)} characters as a memory scope, over "
            f"{checks.MAX_USER_ID_CHARS}; use fewer or shorter labels")
    return scope


def namespace_of(scope: str) -> tuple[str, ...] | None:
    """The namespace of a Memory user id (None: not a store namespace)."""
    if not scope.startswith(SCOPE_PREFIX):
        return None
    return tuple(unquote(p) for p in scope[len(SCOPE_PREFIX):].split("/"))


class KVSearchItem(SearchItem):
    """A search result that also carries its item's KV handle (its facts, best first)."""

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
    """A LangGraph BaseStore over an InferScale Memory (sync, async and batch forms).

    A batch is checked whole before any of it runs: one invalid operation (a namespace
    LangGraph refuses, a value that is not a dict, a text too long for a fact, a bad filter)
    raises and nothing of the batch is written.
    """

    supports_ttl = True

    def __init__(self, memory: Memory | str = DEFAULT_NAME, *, text_field: str = "text",
                 fields: Sequence[str] | None = None, ttl: TTLConfig | None = None) -> None:
        """Wrap a Memory (nothing is looked up until the first operation).

        Args:
            memory: the Memory, or the name it is registered under (register_memory).
            text_field: without `fields`, the value field whose string is the item's one text
                (other values: the value as JSON).
            fields: LangGraph's index fields (paths such as "title", "notes[*].text", "$"):
                each text they hold is embedded on its own. A put's `index=[...]` overrides
                them for its item; `index=False` leaves it unranked: a query search returns it
                after the ranked items, with score None (as LangGraph's InMemoryStore does).
            ttl: LangGraph's TTLConfig (default_ttl and sweep_interval_minutes in minutes,
                refresh_on_read, omit_expired); None: items expire only when put with a ttl.
        """
        self._memory = memory if not isinstance(memory, str) else None
        self._name = check_name(memory) if isinstance(memory, str) else None
        self.text_field = checks.check_text(text_field, "text_field", InvalidRequestError)
        self.fields = None if fields is None else _check_fields(fields, "fields")
        self.ttl_config = check_ttl_config(ttl)  # type: ignore[assignment]
        self._lock = threading.Lock()
        self._sweeper = Sweeper(self.sweep_ttl)

    @property
    def memory(self) -> Memory:
        """The Memory the items live in."""
        return self._memory if self._memory is not None else get_memory(self._name or "")

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        checked = [self._check(op) for op in ops]  # all of them before any runs
        results: list[Result] = []
        for op, plan in zip(ops, checked, strict=True):
            if isinstance(op, GetOp):
                results.append(self._get(plan))
            elif isinstance(op, PutOp):
                self._put(plan)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(self._search(op, plan))
            else:
                results.append(self._list_namespaces(op))
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    def put(self, namespace: tuple[str, ...], key: str, value: Mapping[str, Any],
            index: Literal[False] | list[str] | None = None, *, ttl: Any = NOT_PROVIDED,
            pinned: bool | None = None) -> None:
        """LangGraph's put, and pinned: True pins the item's facts, False unpins them.

        A pinned item is in every answer of the namespace, before the retrieved facts
        (Memory.pin); None leaves the pin as it is.
        """
        if pinned is not None and not isinstance(pinned, bool):
            raise InvalidRequestError(f"pinned must be True, False or None, got {pinned!r:.40}")
        super().put(namespace, key, value, index, ttl=ttl)
        if pinned is not None and value is not None:
            self._pin(namespace, key, pinned)

    async def aput(self, namespace: tuple[str, ...], key: str, value: Mapping[str, Any],
                   index: Literal[False] | list[str] | None = None, *, ttl: Any = NOT_PROVIDED,
                   pinned: bool | None = None) -> None:
        """put(), in a worker thread."""
        await asyncio.to_thread(self.put, namespace, key, value, index, ttl=ttl, pinned=pinned)

    def _pin(self, namespace: tuple[str, ...], key: str, pinned: bool) -> None:
        scope = scope_of(namespace)
        ids = [f.fact_id for f in self._facts(scope, key, omit_expired=True)]
        (self.memory.pin if pinned else self.memory.unpin)(user_id=scope, fact_ids=ids)

    # ---- TTL (ttl.py) ------------------------------------------------------------------
    def sweep_ttl(self) -> int:
        """Delete the store's expired items now (history EXPIRE); returns the facts deleted."""
        return len(self.memory.sweep_expired(delete=True, user_prefix=SCOPE_PREFIX))

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None
                          ) -> concurrent.futures.Future[None]:
        """Sweep every sweep_interval_minutes (default: the TTL config's, else 5) in a thread."""
        return self._sweeper.start(sweep_interval_minutes or (self.ttl_config or {}).get(
            "sweep_interval_minutes"))

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper; False if it did not stop within `timeout` seconds."""
        return self._sweeper.stop(timeout)

    # ---- checks (every op of a batch, before any runs) ---------------------------------
    def _check(self, op: Op) -> Any:
        if not isinstance(op, GetOp | PutOp | SearchOp | ListNamespacesOp):
            raise InvalidRequestError(f"unknown store operation {type(op).__name__}; "
                                      "LangGraph's are GetOp, PutOp, SearchOp, ListNamespacesOp")
        validate_op_namespace(op)  # LangGraph's own rules and error (InvalidNamespaceError)
        if isinstance(op, GetOp):
            return (scope_of(op.namespace) if op.namespace else None, _check_key(op.key),
                    op.refresh_ttl)
        if isinstance(op, PutOp):
            return self._check_put(op)
        if isinstance(op, SearchOp):
            _check_page(op.limit, op.offset)
            if op.query is not None:
                checks.check_str(op.query, "query", InvalidRequestError)
            return _on_value(check_filter(op.filter) or {})
        _check_page(op.limit, op.offset)
        if op.max_depth is not None:
            checks.check_int(op.max_depth, "max_depth", 1, InvalidRequestError)
        return None

    def _check_put(self, op: PutOp) -> tuple[str | None, str, list[str], dict[str, Any] | None]:
        key = _check_key(op.key)
        if op.value is None:  # a delete: of nothing when the namespace cannot hold items
            return (scope_of(op.namespace) if op.namespace else None), key, [], None
        ttl = None if op.ttl is None else minutes(op.ttl)
        scope = scope_of(op.namespace)
        if not isinstance(op.value, Mapping):
            raise InvalidRequestError(f"a store value is a dict, got {type(op.value).__name__}")
        if op.index is not None and op.index is not False:
            _check_fields(op.index, "index")
        texts, indexed = self._texts(op.value, op.index)
        metadata = {KEY_FIELD: key, VALUE_FIELD: dict(op.value), INDEXED_FIELD: indexed,
                    **({TTL_FIELD: ttl} if ttl is not None else {})}
        checks.check_metadata(metadata, f"the value of {key!r}")
        for text in texts:  # the checks Memory.add makes, so that a batch fails before writing
            self.memory.engine.tokenize_fact(text)
        return scope, key, texts, metadata

    def _texts(self, value: Mapping[str, Any], index: Any) -> tuple[list[str], bool]:
        """The item's texts (one fact each) and whether query search embeds them."""
        fields = self.fields if index is None else index
        if index is not False and fields:
            texts = [t for field in fields for t in get_text_at_path(value, field)
                     if checks.has_visible(t)]
            if texts:
                return list(dict.fromkeys(texts)), True
        text = value.get(self.text_field)
        if not isinstance(text, str) or not checks.has_visible(text):
            text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
        return [text], index is not False and not fields

    # ---- operations --------------------------------------------------------------------
    def _get(self, plan: tuple[str | None, str, bool]) -> Item | None:
        scope, key, refresh = plan
        found = self._facts(scope, key, self._omit()) if scope is not None else []
        if refresh and found:
            self._refresh([found])
        return _item(found, Item) if found else None

    def _put(self, plan: tuple[str | None, str, list[str], dict[str, Any] | None]) -> None:
        scope, key, texts, metadata = plan
        if scope is None:
            return
        memory = self.memory
        with self._lock:  # one writer per store: a key never gets two sets of facts
            everything, now = self._facts(scope, key, omit_expired=False), time.time()
            found = [f for f in everything if f.expires_at is None or f.expires_at > now]
            stale = [f.fact_id for f in everything if f not in found]  # a new write replaces
            if metadata is not None:
                expires = expiry_of(metadata.get(TTL_FIELD))
                for record, text in zip(found, texts, strict=False):
                    memory.update(user_id=scope, fact_id=record.fact_id, text=text,
                                  metadata=metadata)
                    if record.expires_at != expires:
                        memory.set_expiration(user_id=scope, fact_ids=[record.fact_id],
                                              expiration_date=expires)
                if len(texts) > len(found):
                    memory.add(user_id=scope, texts=texts[len(found):], metadata=metadata,
                               dedupe=False, expiration_date=expires)
            surplus = stale + [record.fact_id for record in found[len(texts):]]
            if surplus:
                memory.delete(user_id=scope, fact_ids=surplus)

    def _search(self, op: SearchOp, wanted: dict[str, Any]) -> list[SearchItem]:
        memory = self.memory
        prefix = tuple(op.namespace_prefix)
        scopes = [s for s in memory.users()
                  if (ns := namespace_of(s)) is not None and ns[:len(prefix)] == prefix]
        listed: list[list[StoredFact]] = []  # the items that match the filter, in store order
        for scope in scopes:
            listed += _items(memory.records(user_id=scope, filter=wanted or None,
                                            include_expired=not self._omit()))
        scores: dict[tuple[str, str], float] = {}
        if op.query is not None and checks.has_visible(op.query):  # blank: no query
            item_of = {f.fact_id: _id(facts) for facts in listed for f in facts}
            for scope in scopes:  # cosine scores, as LangGraph's stores give (no keyword part)
                found = memory.search(user_id=scope, query=op.query, k=2**31 - 1,
                                      filter={**wanted, INDEXED_FIELD: True},
                                      search_mode="vector", hide_older_versions="never")
                for fact_id, score in zip(found.handle.fact_ids, found.handle.scores,
                                          strict=True):
                    if fact_id in item_of:  # best first: an item scores by its best field
                        scores.setdefault(item_of[fact_id], score)
            ranked = sorted(range(len(listed)), key=lambda i: -scores.get(_id(listed[i]), -2.0))
            listed = [listed[i] for i in ranked]  # then the unranked (index=False), score None
        page = listed[op.offset:op.offset + op.limit]
        if op.refresh_ttl:
            self._refresh(page)
        return [_item(facts, KVSearchItem, scores.get(_id(facts))) for facts in page]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        memory, omit = self.memory, self._omit()
        spaces = sorted({ns for scope in memory.users() if (ns := namespace_of(scope)) is not None
                         and (not omit or _items(memory.records(user_id=scope)))})
        for condition in op.match_conditions or ():
            path = tuple(condition.path)
            spaces = [ns for ns in spaces if len(ns) >= len(path) and _matches(
                ns[:len(path)] if condition.match_type == "prefix" else ns[-len(path):], path)]
        if op.max_depth is not None:
            spaces = sorted({ns[:op.max_depth] for ns in spaces})
        return spaces[op.offset:op.offset + op.limit]

    def _facts(self, scope: str, key: str, omit_expired: bool) -> list[StoredFact]:
        """The facts of one item, oldest first (expired ones too unless omit_expired)."""
        return self.memory.records(user_id=scope, filter={KEY_FIELD: key},
                                   include_expired=not omit_expired)

    def _omit(self) -> bool:
        """Reads leave out expired items a sweep has not deleted yet (TTLConfig.omit_expired)."""
        return bool((self.ttl_config or {}).get("omit_expired", False))

    def _refresh(self, items: Iterable[Sequence[StoredFact]]) -> None:
        """Restart the TTL of items just read (expired ones stay expired).

        One write per namespace and TTL, not per item.
        """
        batches: dict[tuple[str, float], list[int]] = {}
        for facts in items:
            ttl = facts[0].metadata.get(TTL_FIELD)
            if ttl is not None:
                batches.setdefault((facts[0].user_id, ttl), []).extend(f.fact_id for f in facts)
        for (scope, ttl), ids in batches.items():
            self.memory.set_expiration(user_id=scope, fact_ids=ids,
                                       expiration_date=expiry_of(ttl))


def _items(records: Iterable[StoredFact]) -> list[list[StoredFact]]:
    """Facts grouped by item (namespace and key), items in the order of their first fact."""
    grouped: dict[tuple[str, str], list[StoredFact]] = {}
    for record in records:
        if KEY_FIELD in record.metadata:  # not facts the namespace's scope got otherwise
            grouped.setdefault(_id([record]), []).append(record)
    return list(grouped.values())


def _id(facts: Sequence[StoredFact]) -> tuple[str, str]:
    return facts[0].user_id, facts[0].metadata[KEY_FIELD]


def _item(facts: Sequence[StoredFact], cls: type[Item], score: float | None = None) -> Any:
    latest = max(facts, key=lambda f: (f.updated_at, f.fact_id))
    fields = {"namespace": namespace_of(latest.user_id) or (),
              "key": latest.metadata[KEY_FIELD], "value": latest.metadata[VALUE_FIELD],
              "created_at": datetime.fromtimestamp(min(f.created_at for f in facts), UTC),
              "updated_at": datetime.fromtimestamp(latest.updated_at, UTC)}
    if cls is KVSearchItem:
        return KVSearchItem(score=score, handle=MemoryHandle(
            latest.user_id, tuple(f.fact_id for f in facts)), **fields)
    return cls(**fields)


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise InvalidRequestError(f"a store key is a non-empty string, got {key!r:.80}")
    return key


def _check_fields(fields: object, what: str) -> list[str]:
    if (isinstance(fields, str) or not isinstance(fields, Sequence)
            or not all(isinstance(f, str) and f for f in fields)):
        raise InvalidRequestError(f"{what} is a list of field paths (e.g. ['title', "
                                  f"'notes[*].text']), got {fields!r:.80}")
    return list(fields)


def _check_page(limit: object, offset: object) -> None:
    checks.check_int(limit, "limit", 0, InvalidRequestError)
    checks.check_int(offset, "offset", 0, InvalidRequestError)


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
