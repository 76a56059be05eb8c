"""Collects LangGraph's own store test modules (see test_langgraph_suites.py) against
KVMemoryStore: their modules, fetched from the installed versions' sdists (upstream.py), with
their store classes bound to the construction shims (shims.py) and nothing else changed.

What this conftest adds around their tests, all of it construction:
- the engine every store is built on, and closing the Memories a test built;
- DEFAULT_URI (PostgreSQL suites): the session's throwaway server instead of localhost:5441;
- `fake_embeddings`, which the PostgreSQL suites take from a conftest of theirs that this run
  does not load (it would connect to localhost:5441): the same CharacterEmbeddings(dims=500);
- SKIPS: each test that is not run, with its reason;
- a test that passes without building a store fails, unless SKIPS names it: it tested
  LangGraph's own code, and it must not count as a pass of KVMemoryStore.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.langgraph_suites import shims
from tests.integrations.langgraph_suites.test_langgraph_suites import SKIPS, SUITES
from tests.integrations.langgraph_suites.upstream import (
    FetchError,
    fetch_tests,
    import_test_module,
)
from tests.pgserver import REQUIRE_ENV

ANCHOR = "test_langgraph_suites.py"


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> Any:
    if module_path.name == ANCHOR:
        return Suites.from_parent(parent, path=module_path)
    return None


class Suites(pytest.File):
    """The anchor module's SUITES: one collector per upstream test module."""

    def collect(self) -> Iterator[pytest.Collector]:
        for distribution, modules in SUITES.items():
            try:
                tests = fetch_tests(distribution)
            except FetchError as exc:
                if os.environ.get(REQUIRE_ENV):
                    raise
                pytest.skip(f"{exc} (set {REQUIRE_ENV} to make this an error)")
            for name in modules:
                # The anchor's path (not theirs): its nodes get this folder's conftests' hooks.
                module = Upstream.from_parent(
                    self, path=self.path, name=f"{distribution}/{name}.py",
                    nodeid=f"{self.nodeid}::{distribution}/{name}.py")
                module.source = tests / f"{name}.py"
                yield module


class Upstream(pytest.Module):
    """One of their test modules (`source`), its store classes bound to the shims."""

    source: Path

    def _getobj(self) -> Any:
        distribution = self.name.split("/")[0]
        package = "upstream_" + distribution.replace("-", "_")
        module = import_test_module(self.source.parent, self.source.stem, package)
        for name in ("InMemoryStore", "SqliteStore", "AsyncSqliteStore", "PostgresStore",
                     "AsyncPostgresStore"):
            if name in vars(module):
                setattr(module, name, getattr(shims, name))
        return module


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if f"/{ANCHOR}::" not in f"/{item.nodeid}":
            continue
        item.add_marker(pytest.mark.vllm)  # every store is built on the package's engine
        name = item.nodeid.split(f"{ANCHOR}::", 1)[1]
        for pattern, reason in SKIPS.items():
            if fnmatch.fnmatchcase(name, pattern):
                item.add_marker(pytest.mark.skip(reason=reason))
                break


@pytest.fixture(autouse=True)
def _kv_construction(request: pytest.FixtureRequest, engine: Any,
                     monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Stores of this test are built on the package's engine; their Memories closed after."""
    if hasattr(request.module, "DEFAULT_URI"):
        server = request.getfixturevalue("postgres_server")
        monkeypatch.setattr(request.module, "DEFAULT_URI", server.url_for("postgres"))
    shims.ENGINE[:] = [engine]
    yield
    while shims.OPENED:
        shims.OPENED.pop().close()
    while shims.CLOSE:
        shims.CLOSE.pop().close()


@pytest.fixture()
def fake_embeddings(request: pytest.FixtureRequest) -> Any:
    """Their conftest's fixture (the PostgreSQL suites): CharacterEmbeddings(dims=500)."""
    return request.module.CharacterEmbeddings(dims=500)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if (call.when == "call" and report.passed and f"/{ANCHOR}::" in f"/{item.nodeid}"
            and not shims.OPENED):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} passed without building a store: it tests "
                           "LangGraph's own code; name it in SKIPS (test_langgraph_suites.py) "
                           "with that reason")
    return report
