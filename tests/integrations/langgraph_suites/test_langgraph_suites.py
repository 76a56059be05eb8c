"""LangGraph's own store tests, run against KVMemoryStore.

The test modules below come from the published sdists of the installed versions of
langgraph-checkpoint (InMemoryStore's tests), langgraph-checkpoint-sqlite and
langgraph-checkpoint-postgres, fetched when the tests are collected (upstream.py; cached under
.cache/, never copied into this repository). conftest.py collects them in place of this module,
with their store classes bound to KVMemoryStore (shims.py): only construction changes.

SKIPS names every test that is not run, with its reason. A test of LangGraph's own code (one
that builds no store) must be named there: if it passes without building a store, the run
reports it as a failure.
"""

from __future__ import annotations

SUITES = {
    "langgraph-checkpoint": ["test_store"],
    "langgraph-checkpoint-sqlite": ["test_store", "test_async_store"],
    "langgraph-checkpoint-postgres": ["test_store", "test_async_store"],
}
"""Distribution -> the modules of its tests/ folder that test a store."""

_OWN_CODE = ("tests LangGraph's own code (its helpers and base classes), builds no store")
_INDEX_CONFIG = ("checks the index_config attribute of LangGraph's own stores; KVMemoryStore "
                 "takes its embedder from its Memory")

_SQL = ("tests the SQL of LangGraph's store (migrations, its escaping and pattern helpers), "
        "builds no store")
_FILTER_KEY_SQL = ("SqliteStore refuses filter keys that could inject SQL, as it writes them "
                   "into SQL; KVMemoryStore evaluates filters in Python, where such a key is "
                   "just a field name no item has")
_LOOP_GUARD = ("the async stores' sync methods refuse to run on the event loop's thread, which "
               "they need; KVMemoryStore's sync methods need no loop and run there")

_SAME_STORE = ("the same KVMemoryStore as the test's first parameter set: this parameter "
               "configures PostgresStore's own connection (pipeline, pool) or vector column "
               "type, which KVMemoryStore does not have")
_COSINE = ("expects l2 or inner-product scores; KVMemoryStore scores by cosine similarity, as "
           "its retrieval index does (the cosine variant of this test runs)")
_PG = "langgraph-checkpoint-postgres/test_*store.py::"

SKIPS: dict[str, str] = {
    _PG + "*[[]pipe*": _SAME_STORE,
    _PG + "*[[]pool*": _SAME_STORE,
    _PG + "*halfvec*": _SAME_STORE,
    _PG + "*l2*": _COSINE,
    _PG + "*inner_product*": _COSINE,
    "langgraph-checkpoint/test_store.py::test_dedupe_ops_*": _OWN_CODE,
    "langgraph-checkpoint/test_store.py::test_get_text_at_path*": _OWN_CODE,
    "langgraph-checkpoint/test_store.py::test_async_batch_store": _OWN_CODE,
    "langgraph-checkpoint/test_store.py::test_async_batch_store_handles_cancellation":
        _OWN_CODE,
    "langgraph-checkpoint/test_store.py::test_validate_op_namespace_*": _OWN_CODE,
    "langgraph-checkpoint/test_store.py::test_vector_store_initialization": _INDEX_CONFIG,
    "langgraph-checkpoint-sqlite/test_*store.py::test_vector_store_initialization":
        _INDEX_CONFIG,
    "langgraph-checkpoint-sqlite/test_store.py::test_nonnull_migrations": _SQL,
    "langgraph-checkpoint-sqlite/test_store.py::test_escape_glob_literal": _SQL,
    "langgraph-checkpoint-sqlite/test_store.py::test_namespace_match_pattern": _SQL,
    "langgraph-checkpoint-sqlite/test_store.py::test_list_namespaces_prefix_uses_indexable_"
    "condition": _SQL,
    "langgraph-checkpoint-sqlite/test_store.py::test_sql_injection_vulnerability*":
        _FILTER_KEY_SQL,
    "langgraph-checkpoint-sqlite/test_async_store.py::test_no_running_loop*": _LOOP_GUARD,
    _PG + "test_vector_store_initialization*": _INDEX_CONFIG,
    _PG + "test_nonnull_migrations": _SQL,
    _PG + "test_escape_like_literal": _SQL,
    _PG + "test_namespace_match_pattern": _SQL,
    _PG + "test_no_running_loop*": _LOOP_GUARD,
    _PG + "test_abatch_uses_single_pool_checkout": (
        "counts AsyncPostgresStore's own pool checkouts (it patches "
        "langgraph.checkpoint.postgres._ainternal); KVMemoryStore's database calls go through "
        "its Memory"),
    _PG + "test_large_batches_async*": (
        "a load test of 60,000 operations (it passed once here, in 418 s on 2 CPU cores); the "
        "same operations at a tenth of the count run in the SQLite suite's "
        "test_large_batches_async and concurrently in test_large_batches"),
}
"""fnmatch pattern of '<distribution>/<module>.py::<test>' -> why that test is not run."""
