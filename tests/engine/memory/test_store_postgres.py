"""FactStore on PostgreSQL: what only a shared server database has.

Several processes writing one database, processes migrating a fresh database together, a
connection lost inside a transaction, URLs (bad, unreachable, with passwords). The behaviour
both databases share is tested on both in test_store.py.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from inferscale_engine.errors import ConfigError, StoreError
from inferscale_engine.memory.config import MemoryConfig
from inferscale_engine.memory.store import history, open_store
from inferscale_engine.memory.store.fact_store import FactStore
from inferscale_engine.memory.store.sql.postgres import redact

REPO_ROOT = Path(__file__).resolve().parents[3]


def add(fact_store: FactStore, user_id: str, texts: list[str]) -> list[int]:
    return fact_store.add_facts(user_id=user_id, texts=texts, token_ids=[[1, 2]] * len(texts),
                                embeddings=[[1.0, 0.0]] * len(texts))


def run_children(code: str, *args_per_child: list[str]) -> list[str]:
    """Run one `python -c code` per argument list at once; their stdout lines, all of them."""
    children = [subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO_ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for args in args_per_child]
    lines = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        lines += out.splitlines()
    return lines


def terminate(url: str, backend_pid: int) -> None:
    """End one server connection (as a failover or a network cut would) and wait until gone."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (backend_pid,))
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                            (backend_pid,)).fetchone():
            time.sleep(0.01)


def terminate_all(url: str) -> None:
    """End every other connection to the database (each connection of a store's pool)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        pids = [row[0] for row in admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND "
            "pid <> pg_backend_pid()")]
    for pid in pids:
        terminate(url, pid)


def hold_inside_transaction(monkeypatch, user_id: str) -> tuple[threading.Event,
                                                                threading.Event]:
    """Writes of `user_id` stop inside their transaction (rows inserted, not committed): the
    first event is set when one got there, and it goes on once the second is set."""
    record, inside, release = history.record, threading.Event(), threading.Event()

    def record_then_wait(db, user, *args):
        record(db, user, *args)
        if user == user_id:
            inside.set()
            assert release.wait(60)

    monkeypatch.setattr(history, "record", record_then_wait)
    return inside, release


# ---- several processes on one database ---------------------------------------------------------
WRITER = """
import sys, time
from inferscale_engine.memory.store.fact_store import FactStore

url, n, fact_id, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
with FactStore(url) as store:
    time.sleep(max(0.0, start - time.time()))  # every writer starts at once
    for i in range(10):
        for user in ("shared", f"own{n}"):
            ids = store.add_facts(user_id=user, texts=[f"{user} {n} {i} {j}" for j in range(3)],
                                  token_ids=[[1]] * 3, embeddings=[[1.0, 0.0]] * 3)
            print(user, *ids, flush=True)
        store.update(user_id="shared", fact_id=fact_id, text=f"p{n}-{i}", token_ids=[2],
                     embedding=[0.0, 1.0])
"""


def test_processes_writing_one_database_lose_nothing(postgres_url):
    with FactStore(postgres_url) as fact_store:
        (contested,) = add(fact_store, "shared", ["updated by every writer"])
        start = time.time() + 2.0
        lines = run_children(WRITER, *[[postgres_url, str(n), str(contested), str(start)]
                                       for n in range(4)])
        acknowledged = [(line.split()[0], int(i)) for line in lines for i in line.split()[1:]]
        ids = [i for _, i in acknowledged]
        assert len(ids) == len(set(ids)) == 4 * 10 * 2 * 3  # no id given twice
        users = Counter(user for user, _ in acknowledged)
        assert fact_store.count() == len(ids) + 1
        for user, count in users.items():
            stored = {f.fact_id for f in fact_store.get_all(user_id=user)}
            assert stored >= {i for u, i in acknowledged if u == user}
            assert len(stored) == count + (user == "shared")
        # a version per call: 1 + 40 adds + 40 updates of "shared", 10 adds of each own user
        assert fact_store.user_version("shared") == 81
        assert [fact_store.user_version(f"own{n}") for n in range(4)] == [10] * 4
        # one user's writers queue: each update saw the text the previous one left
        events = fact_store.history(user_id="shared", fact_id=contested)
        assert [e.event for e in events] == ["ADD"] + ["UPDATE"] * 40
        assert all(a.new_text == b.old_text for a, b in zip(events, events[1:]))


OPENER = """
import sys, time
from inferscale_engine.memory.store.fact_store import FactStore

url, n, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
time.sleep(max(0.0, start - time.time()))
with FactStore(url) as store:
    store.add_facts(user_id="u" + n, texts=["hello"], token_ids=[[1]], embeddings=[[1.0]])
    print(store.schema_version)
"""


def test_processes_opening_a_fresh_database_together_migrate_it_once(postgres_url):
    start = time.time() + 2.0
    versions = run_children(OPENER, *[[postgres_url, str(n), str(start)] for n in range(4)])
    with FactStore(postgres_url) as fact_store:
        assert versions == [str(fact_store.schema_version)] * 4 and fact_store.count() == 4
        with fact_store._db.reading("test") as db:
            assert db.execute("SELECT COUNT(*) FROM meta WHERE key = 'schema_version'"
                              ).fetchone()[0] == 1


# ---- lost connections --------------------------------------------------------------------------
def test_a_connection_lost_inside_a_transaction_leaves_nothing(postgres_url, monkeypatch):
    fact_store = FactStore(postgres_url)
    add(fact_store, "u", ["kept"])
    record = history.record

    def cut_then_record(db, *args):
        terminate(postgres_url, db._held().info.backend_pid)
        record(db, *args)

    monkeypatch.setattr(history, "record", cut_then_record)
    with pytest.raises(StoreError, match="add_facts failed, nothing was written") as info:
        add(fact_store, "u", ["lost 1", "lost 2"])
    assert "server at 127.0.0.1:" in str(info.value)
    monkeypatch.undo()
    # the next call opens a new connection; the lost call left no fact, history or version
    assert [f.text for f in fact_store.get_all(user_id="u")] == ["kept"]
    assert fact_store.user_version("u") == 1
    assert len(add(fact_store, "u", ["after"])) == 1
    fact_store.close()


def test_a_connection_lost_while_committing_says_the_outcome_is_unknown(postgres_url):
    fact_store = FactStore(postgres_url)
    commit = fact_store._db._commit

    def cut_then_commit():
        terminate(postgres_url, fact_store._db._held().info.backend_pid)
        commit()

    fact_store._db._commit = cut_then_commit
    with pytest.raises(StoreError, match="may or may not be stored; read it back"):
        add(fact_store, "u", ["maybe"])
    del fact_store._db._commit
    assert fact_store.count() == 0  # cut before COMMIT reached the server: rolled back
    assert len(add(fact_store, "u", ["after"])) == 1
    fact_store.close()


def test_a_call_whose_idle_connection_was_dropped_runs_again_once(postgres_url):
    """An idle pooled connection that the server ended (a failover, idle_session_timeout): the
    next call finds it dead, wrote nothing, and runs once more on a new connection."""
    import psycopg

    with FactStore(postgres_url) as fact_store:
        add(fact_store, "u", ["before"])
        terminate_all(postgres_url)
        assert len(add(fact_store, "u", ["after"])) == 1  # a write, as the first call
        terminate_all(postgres_url)
        assert [f.text for f in fact_store.get_all(user_id="u")] == ["before", "after"]  # a read
        terminate_all(postgres_url)
        scan = fact_store.iter_all(batch_size=1)  # a scan, on a connection of its own
        assert [f.text for f in next(scan)] == ["before"]
        scan.close()  # abandoned: its snapshot transaction ends with it
        assert [f.text for b in fact_store.iter_all() for f in b] == ["before", "after"]
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            assert admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                 "current_database() AND state LIKE 'idle in transaction%'"
                                 ).fetchone()[0] == 0


def test_the_first_call_after_a_database_restart_succeeds():
    """A restart ends every connection: the first call after it (a read, or a write) succeeds;
    while the server is down, calls fail at once with the reason."""
    from tests.pgserver import PostgresServer

    with PostgresServer() as server, FactStore(server.url) as fact_store:
        add(fact_store, "u", ["stored before the restart"])
        server.pause()
        began = time.monotonic()
        with pytest.raises(StoreError, match="cannot connect") as info:
            fact_store.count()
        assert time.monotonic() - began < 5 and f"server at 127.0.0.1:{server.port}" in str(
            info.value)
        server.resume()
        assert [f.text for f in fact_store.get_all(user_id="u")] == ["stored before the restart"]
        server.pause()
        server.resume()
        assert len(add(fact_store, "u", ["stored after the restart"])) == 1
        assert fact_store.count() == 2 and fact_store.user_version("u") == 2


def test_calls_of_several_threads_run_at_once_on_pooled_connections(postgres_url, monkeypatch):
    """One thread's call waits inside its transaction; another thread's calls (a write of
    another user, reads) go through meanwhile, on a connection of their own."""
    inside, release = hold_inside_transaction(monkeypatch, "slow")
    with FactStore(postgres_url) as fact_store, ThreadPoolExecutor(2) as pool:
        slow = pool.submit(add, fact_store, "slow", ["written while another call waits"])
        assert inside.wait(60)
        other = pool.submit(lambda: (add(fact_store, "quick", ["not queued behind it"]),
                                     fact_store.count(), fact_store.users()))
        try:
            ids, count, users = other.result(timeout=20)  # one connection: stuck until release
        finally:
            release.set()
        assert (len(ids), count, users) == (1, 1, ["quick"])  # the slow call has not committed
        assert len(slow.result(timeout=60)) == 1 and fact_store.count() == 2


def test_a_scan_reads_one_snapshot_so_no_late_commit_with_a_smaller_id_is_passed(
        postgres_url, monkeypatch):
    """iter_all pages by id. A fact that commits during the scan with an id below the page
    reached must not be skipped while facts committed after it are yielded: the scan is one
    snapshot, and both are outside it (their users' versions moved)."""
    inside, release = hold_inside_transaction(monkeypatch, "late")
    with FactStore(postgres_url) as scanner, FactStore(postgres_url) as replica, \
            FactStore(postgres_url) as other_replica, ThreadPoolExecutor(1) as pool:
        late = pool.submit(add, other_replica, "late", ["id 1, committed during the scan"])
        assert inside.wait(60)  # holds id 1, uncommitted
        assert add(replica, "early", ["a", "b", "c", "d"]) == [2, 3, 4, 5]
        version = scanner.user_version("late")
        scan = scanner.iter_all(batch_size=2)
        assert [f.fact_id for f in next(scan)] == [2, 3]
        release.set()
        assert late.result(timeout=60) == [1]
        assert add(replica, "after", ["id 6, committed after id 1"]) == [6]
        rest = [f.fact_id for batch in scan for f in batch]
        assert rest == [4, 5]  # paging alone: [4, 5, 6], and id 1 never
        assert scanner.user_version("late") == version + 1  # what the scan left out moved
        assert [f.fact_id for b in scanner.iter_all(batch_size=2) for f in b] == [1, 2, 3, 4, 5,
                                                                                  6]


# ---- URLs --------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_unreachable_servers_and_bad_urls_fail_fast_without_the_password(postgres_server):
    port = free_port()
    cases = [  # (url, what the message names)
        (f"postgresql://bob:s3cr%40t@127.0.0.1:{port}/facts", f"127.0.0.1:{port}"),
        ("postgres://bob:s3cr%40t@10.255.255.1:5432/facts?connect_timeout=2",
         "10.255.255.1:5432"),  # unroutable: the connect timeout ends it
        ("postgresql://bob:s3cr%zzt@localhost/facts", "not a valid PostgreSQL URL"),
        (postgres_server.url_for("missing").replace("postgres@", "postgres:s3cr%40t@"),
         'database "missing" does not exist'),
    ]
    for url, named in cases:
        began = time.monotonic()
        with pytest.raises(StoreError) as info:
            FactStore(url)
        assert time.monotonic() - began < 10
        message = str(info.value)
        assert named in message and "***" in message, message
        assert "s3cr" not in message and "zzt" not in message, message
    with pytest.raises(ConfigError, match="mysql://bob:\\*\\*\\*@db/facts' is not a supported"):
        FactStore("mysql://bob:s3cret@db/facts")
    with pytest.raises(ConfigError, match="synchronous_commit"):
        FactStore(postgres_server.url, synchronous="FULL")


def test_a_password_never_shows_in_the_stores_path(postgres_url):
    with_password = postgres_url.replace("postgres@", "postgres:hunter2@")
    with FactStore(with_password) as fact_store, \
            FactStore(postgres_url + "?password=hunter2&application_name=t") as other:
        assert fact_store.path == postgres_url.replace("postgres@", "postgres:***@")
        assert other.path == postgres_url + "?password=***&application_name=t"
        assert fact_store.shared and other.shared


def test_open_store_and_memory_config_take_a_url_as_is(postgres_url, tmp_path, monkeypatch,
                                                       tiny_models):
    from tests.conftest import engine_config

    monkeypatch.chdir(tmp_path)
    with open_store(postgres_url) as fact_store:
        assert isinstance(fact_store, FactStore) and fact_store.shared
    assert list(tmp_path.iterdir()) == []  # no folder made for a URL
    config = MemoryConfig(engine_config(tiny_models["qwen2"]), db_path=postgres_url)
    assert config.db_path == postgres_url


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://u:p@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:p%40ss:w@h1:5432,h2:5433/db?sslmode=require",
     "postgresql://u:***@h1:5432,h2:5433/db?sslmode=require"),
    ("postgresql://u@h/db?password=p&x=1", "postgresql://u@h/db?password=***&x=1"),
    ("postgres://h:5432/db", "postgres://h:5432/db"),
    ("postgresql:///db?host=/tmp/sock", "postgresql:///db?host=/tmp/sock"),
])
def test_redact_hides_passwords_only(url, shown):
    assert redact(url) == shown


# ---- what is stored --------------------------------------------------------------------------
def test_text_is_stored_as_written_and_nul_escaped(postgres_url):
    import psycopg

    with FactStore(postgres_url) as fact_store:
        add(fact_store, "u", ["plain text é 🧠", "with\x00nul"])
        assert fact_store.schema_version == 6
    with psycopg.connect(postgres_url) as raw:
        texts = [r[0] for r in raw.execute("SELECT text FROM facts ORDER BY fact_id")]
        tables = {r[0] for r in raw.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")}
    assert texts == ["plain text é 🧠", "with\uffff0nul"]
    assert tables == {"facts", "turns", "meta", "history", "user_versions"}
