"""KVMemoryStore built the way LangGraph's suites build their stores: only construction changes.

Each suite module names a store class (InMemoryStore, SqliteStore, AsyncSqliteStore,
PostgresStore, AsyncPostgresStore); conftest.py puts the class of the same role here in its
place. Every construction makes a KVMemoryStore over a fresh Memory on the package's engine:

- the database is the one the test names: ':memory:' (InMemoryStore), the SQLite path or
  ':memory:' it passes, or the PostgreSQL database its fixture created (on the session's
  throwaway server, which conftest.py puts in DEFAULT_URI);
- `index={"embed": ..., "fields" | "text_fields": [...]}`: the test's embeddings become the
  Memory's embedder and its fields the store's `fields`; without an index, the tests' hashed
  bag-of-words embedder;
- `ttl=` (LangGraph's TTLConfig) is the KVMemoryStore's `ttl`; `start_ttl_sweeper()` and
  `stop_ttl_sweeper()` are KVMemoryStore's own (the async forms call them);
- `setup()`, `MIGRATIONS` and PostgresStore's `_cursor()`, which the fixtures call while
  constructing, do what construction needs (Memory migrates its database when it opens it;
  `_cursor` opens a cursor on the test's database, with dict rows as theirs has). The TTL
  tests read and backdate their rows with SQL on LangGraph's table `store` (prefix, key,
  expires_at, updated_at); on PostgreSQL a view of that name over InferScale's `facts` table
  gives those columns (an update of it writes the fact's times), created with the store;
- the Memory encodes KV on first use (encode_on_add=False): the suites test the store's
  contract, not KV encoding, which has tests of its own.

Memories made during a test are closed when it ends (conftest.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from langgraph.store.base.embed import ensure_embeddings

from inferscale_engine.memory.search.embedder import Embedder
from inferscale_integrations.langchain.store import KVMemoryStore
from tests.engine.memory.memory_support import HashEmbedder

ENGINE: list[Any] = []
"""The engine stores are built on (set by conftest.py for each test)."""
OPENED: list[Any] = []
"""Memories built during the current test (conftest.py closes them, then CLOSE)."""
CLOSE: list[Any] = []
"""Their FactStores."""
FACT_IDS_PER_STORE = 10**9
"""The n-th store of a test numbers its facts from n * FACT_IDS_PER_STORE."""


class LangChainEmbedder(Embedder):
    """A LangChain Embeddings (the test's `index["embed"]`) as Memory's embedder."""

    def __init__(self, embeddings: Any) -> None:
        super().__init__(f"langchain-{type(embeddings).__name__}", device="cpu")
        self._embeddings = ensure_embeddings(embeddings)

    @property
    def dim(self) -> int:
        return len(self._embeddings.embed_query("dim"))

    def encode(self, texts):
        vectors = torch.tensor(self._embeddings.embed_documents(list(texts)),
                               dtype=torch.float32).reshape(len(texts), -1)
        return F.normalize(vectors, dim=-1)


def _build(store: KVMemoryStore, database: str, index: dict[str, Any] | None,
           fields_key: str, ttl: dict[str, Any] | None = None) -> None:
    """Make `store` a KVMemoryStore over a new Memory on `database`."""
    from inferscale_engine.memory import Memory
    from inferscale_engine.memory.store.fact_store import FactStore

    index = dict(index or {})
    embedder = LangChainEmbedder(index["embed"]) if index.get("embed") else HashEmbedder()
    fact_store = FactStore(database)
    _first_fact_id(fact_store, (len(OPENED) + 1) * FACT_IDS_PER_STORE)
    memory = Memory(ENGINE[0], fact_store, embedder, progress_bar=False, encode_on_add=False)
    # A Memory owns its engine's fact ids (one Memory per Engine); the stores of a test share
    # the package's engine instead, their ids kept apart by _first_fact_id, so each gives its
    # claim back at once.
    ENGINE[0].release_fact_ids(memory)
    OPENED.append(memory)
    CLOSE.append(fact_store)
    store._fact_store = fact_store  # type: ignore[attr-defined]
    KVMemoryStore.__init__(store, memory, fields=index.get(fields_key), ttl=ttl)
    store._database = database  # type: ignore[attr-defined]
    if fact_store.shared:
        with fact_store._db.transaction("langgraph's store view") as db:
            for statement in _STORE_VIEW:
                db.execute(statement)


_STORE_VIEW = (
    """CREATE OR REPLACE VIEW store AS SELECT fact_id,
           replace(substr(user_id, 11), '/', '.') AS prefix,
           (metadata::jsonb) ->> 'langgraph_key' AS key,
           to_timestamp(expires_at) AS expires_at, to_timestamp(updated_at) AS updated_at
       FROM facts WHERE user_id LIKE 'langgraph:%'""",
    """CREATE OR REPLACE FUNCTION store_view_update() RETURNS trigger AS $$ BEGIN
           UPDATE facts SET expires_at = extract(epoch FROM NEW.expires_at),
                            updated_at = extract(epoch FROM NEW.updated_at)
           WHERE fact_id = OLD.fact_id;
           RETURN NEW;
       END $$ LANGUAGE plpgsql""",
    """CREATE OR REPLACE TRIGGER store_view_update INSTEAD OF UPDATE ON store
       FOR EACH ROW EXECUTE FUNCTION store_view_update()""",
)
"""LangGraph's `store` table as a view of the facts of the store's namespaces (labels joined
by '.', as theirs; the test's labels need no percent-encoding)."""


def _first_fact_id(fact_store: Any, first: int) -> None:
    """Start the store's fact ids at `first` or later: one engine serves every store of a
    test, and it knows each fact by its id, so the ids of stores alive together must differ."""
    with fact_store._db.transaction("test fact ids") as db:
        if fact_store.shared:
            db.execute("SELECT setval(pg_get_serial_sequence('facts', 'fact_id'), ?)", (first,))
        elif not db.execute("UPDATE sqlite_sequence SET seq = MAX(seq, ?) WHERE name = 'facts'",
                            (first,)).rowcount:
            db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('facts', ?)", (first,))


def _kv_store(cls: type[KVMemoryStore], database: str, index: dict[str, Any] | None,
              fields_key: str, ttl: dict[str, Any] | None) -> Any:
    store = cls.__new__(cls)
    _build(store, database, index, fields_key, ttl)
    return store


def _close(store: Any) -> None:
    KVMemoryStore.stop_ttl_sweeper(store)
    store.memory.close()
    store._fact_store.close()


class InMemoryStore(KVMemoryStore):
    """InMemoryStore(index=...): a KVMemoryStore on ':memory:'."""

    def __init__(self, *, index: dict[str, Any] | None = None) -> None:
        _build(self, ":memory:", index, "fields")


class SqliteStore(KVMemoryStore):
    """SqliteStore.from_conn_string(path, index=...): a KVMemoryStore on that SQLite path."""

    MIGRATIONS: list[str] = []
    """None of its own: Memory migrates the fact store (schema.py) when it opens it."""
    FIELDS_KEY = "text_fields"

    @classmethod
    @contextmanager
    def from_conn_string(cls, conn_string: str, *, index: dict[str, Any] | None = None,
                         ttl: dict[str, Any] | None = None, **options: Any) -> Iterator[Any]:
        store = _kv_store(cls, conn_string, index, cls.FIELDS_KEY, ttl)
        try:
            yield store
        finally:
            _close(store)

    def setup(self) -> None:
        """Memory migrated the database when it opened it."""


class PostgresStore(SqliteStore):
    """PostgresStore.from_conn_string(url, ...): a KVMemoryStore on that PostgreSQL database."""

    FIELDS_KEY = "fields"

    @contextmanager
    def _cursor(self) -> Iterator[Any]:
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(self._database, autocommit=True, row_factory=dict_row) as conn, \
                conn.cursor() as cursor:
            yield cursor


class AsyncSqliteStore(SqliteStore):
    """AsyncSqliteStore.from_conn_string: the same, entered with `async with`."""

    @classmethod
    @asynccontextmanager
    async def from_conn_string(cls, conn_string: str, *,  # type: ignore[override]
                               index: dict[str, Any] | None = None,
                               ttl: dict[str, Any] | None = None,
                               **options: Any) -> AsyncIterator[Any]:
        store = _kv_store(cls, conn_string, index, cls.FIELDS_KEY, ttl)
        try:
            yield store
        finally:
            _close(store)

    async def setup(self) -> None:  # type: ignore[override]
        """Memory migrated the database when it opened it."""

    async def start_ttl_sweeper(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return KVMemoryStore.start_ttl_sweeper(self, *args, **kwargs)

    async def stop_ttl_sweeper(self, *args: Any, **kwargs: Any) -> bool:  # type: ignore[override]
        return KVMemoryStore.stop_ttl_sweeper(self, *args, **kwargs)


class AsyncPostgresStore(AsyncSqliteStore):
    """AsyncPostgresStore.from_conn_string: a KVMemoryStore on the test's database."""

    FIELDS_KEY = "fields"

    @asynccontextmanager
    async def _cursor(self) -> AsyncIterator[Any]:
        import psycopg
        from psycopg.rows import dict_row

        async with await psycopg.AsyncConnection.connect(self._database, autocommit=True,
                                                         row_factory=dict_row) as conn, \
                conn.cursor() as cursor:
            yield cursor
