"""Expiry (issue 54, item 3): add(expiration_date=...) on the real vLLM CPU build.

An expired fact is never served (search, records, get_all, get) and its KV leaves the slab,
host RAM and disk; with on_expiry='delete' the sweeper deletes the row, history EXPIRE; a bad
expiration_date is refused and nothing is stored. SQLite and PostgreSQL alike.
"""

from __future__ import annotations

import time
from datetime import UTC, date, datetime, timedelta

import pytest

from inferscale_engine.errors import ConfigError, FactNotFoundError, InvalidRequestError
from tests.conftest import FACTS, running_engine
from tests.engine.memory.memory_support import HashEmbedder
from tests.invariants.test_tiers import _bytes

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def tiered_engine(tiny_models, tmp_path_factory):
    """A tiny engine with a small slab, a host RAM tier and a disk tier."""
    model = tiny_models["llama"]
    disk = tmp_path_factory.mktemp("disk")
    with running_engine(model, slab_capacity_bytes=_bytes(model, 640),
                        host_tier_bytes=_bytes(model, 400), disk_tier_path=str(disk)) as eng:
        eng.disk_folder = disk
        yield eng


@pytest.fixture(params=["sqlite", "postgres"])
def database(request, tmp_path):
    if request.param == "postgres":
        return request.getfixturevalue("postgres_url")
    return str(tmp_path / "memory.db")


def _memory(engine, database, **options):
    from inferscale_engine.memory import Memory

    return Memory(engine, database, HashEmbedder(), progress_bar=False, **options)


def _wait_until(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _disk_entries(engine) -> int:
    engine.workers.flush_disk()
    return len(list(engine.disk_folder.glob("*.safetensors")))


def test_an_expired_fact_is_never_served_and_leaves_every_tier(tiered_engine, database):
    engine = tiered_engine
    with _memory(engine, database, expiry_sweep_s=None) as memory:
        start = _disk_entries(engine)
        expires = time.time() + 3600
        gone = [r.fact_id for r in memory.add(user_id="alice", texts=FACTS[:2],
                                              expiration_date=expires)]
        kept = [r.fact_id for r in memory.add(user_id="alice", texts=FACTS[2:4])]
        bob = [r.fact_id for r in memory.add(user_id="bob", texts=FACTS[:2],
                                             expiration_date=expires)]
        stored = memory.get(user_id="alice", fact_id=gone[0])
        assert stored.expires_at == pytest.approx(expires)
        assert memory.records(user_id="alice")[0].to_item().expires_at == pytest.approx(expires)
        assert _disk_entries(engine) == start + 6
        for i in range(0, 24, 4):  # other users' facts push alice's out of the slab
            memory.add(user_id="carol", texts=[f"Carol's note {n}: room {n % 7}, project {n}."
                                               for n in range(i, i + 4)], dedupe=False)
        tiers = engine.tiers_of(gone)
        assert set(tiers) == set(gone) and all("disk" in t for t in tiers.values())
        assert any("host" in t for t in engine.tiers_of(gone + kept).values())
        hosted = engine.stats().num_host_facts
        expires = time.time() + 1.0  # adds take seconds on the CPU: the clock starts now
        assert memory.set_expiration(user_id="alice", fact_ids=gone,
                                     expiration_date=expires) == gone
        time.sleep(1.1)
        found = memory.search(user_id="alice", query=FACTS[0], k=10)
        assert set(found.handle.fact_ids) == set(kept)  # the first verb forgot them
        assert engine.tiers_of(gone) == {}  # no tier holds their KV
        assert engine.stats().num_host_facts <= hosted
        assert _disk_entries(engine) == start + 6 + 24 - 2
        assert [r.fact_id for r in memory.records(user_id="alice")] == kept
        assert [f.fact_id for f in memory.get_all(user_id="alice")] == kept
        with pytest.raises(FactNotFoundError, match="expired"):
            memory.get(user_id="alice", fact_id=gone[0])
        # hidden, not deleted (mem0's behaviour): the row and its history stay
        assert len(memory.records(user_id="alice", include_expired=True)) == 4
        assert [e.event for e in memory.history(user_id="alice", fact_id=gone[0])] == ["ADD"]
        # another user's facts of the same texts are untouched
        assert set(memory.search(user_id="bob", query=FACTS[0], k=10).handle.fact_ids) == set(
            bob)
        assert memory.sweep_expired() == []  # nothing more to hide, nothing deleted
        memory.delete_all(user_id="alice")
        memory.delete_all(user_id="bob")
        memory.delete_all(user_id="carol")


def test_the_sweeper_deletes_expired_rows_with_expire_history(tiered_engine, database):
    engine = tiered_engine
    with _memory(engine, database, on_expiry="delete", expiry_sweep_s=0.2) as memory:
        start = _disk_entries(engine)
        (soon,) = [r.fact_id for r in memory.add(user_id="dana", texts=[FACTS[0]],
                                                 expiration_date=time.time() + 600)]
        (later,) = [r.fact_id for r in memory.add(user_id="dana", texts=[FACTS[1]],
                                                  expiration_date=time.time() + 3600)]
        assert _disk_entries(engine) == start + 2
        memory.set_expiration(user_id="dana", fact_ids=[soon], expiration_date=time.time() + 1)
        _wait_until(lambda: len(memory.records(user_id="dana", include_expired=True)) == 1)
        assert [e.event for e in memory.history(user_id="dana", fact_id=soon)] == [
            "ADD", "EXPIRE"]
        assert engine.tiers_of([soon]) == {}
        assert _disk_entries(engine) == start + 1
        assert [r.fact_id for r in memory.records(user_id="dana")] == [later]
        assert memory.stats().counters["expired_deleted"] == 1
        memory.delete_all(user_id="dana")


def test_restart_serves_no_expired_fact_and_set_expiration_extends(tiered_engine, database):
    engine = tiered_engine
    with _memory(engine, database, expiry_sweep_s=None) as memory:
        short, moved = [r.fact_id for r in memory.add(user_id="erin", texts=FACTS[:2],
                                                      expiration_date=time.time() + 600)]
        assert memory.set_expiration(user_id="erin", fact_ids=[short, moved],
                                     expiration_date=time.time() + 1.0) == [short, moved]
        new_end = datetime.now(UTC) + timedelta(hours=1)
        assert memory.set_expiration(user_id="erin", fact_ids=[moved],
                                     expiration_date=new_end) == [moved]
        assert memory.set_expiration(user_id="mallory", fact_ids=[moved],
                                     expiration_date=new_end) == []  # not hers: untouched
        time.sleep(1.1)
        assert memory.set_expiration(user_id="erin", fact_ids=[short],
                                     expiration_date=new_end) == []  # never brought back
    with _memory(engine, database, expiry_sweep_s=None) as memory:  # a restart
        assert memory.engine.tiers_of([short]) == {}
        assert [f.fact_id for f in memory.search(user_id="erin", query=FACTS[0], k=5).facts
                ] == [moved]
        assert memory.get(user_id="erin", fact_id=moved).expires_at == pytest.approx(
            new_end.timestamp())
        memory.delete_all(user_id="erin")


def test_a_bad_expiration_date_is_refused_and_stores_nothing(tiered_engine, database):
    with _memory(tiered_engine, database, expiry_sweep_s=None) as memory:
        for bad, match in [("2020-01-01", "already passed"), (time.time() - 1, "already passed"),
                           ("next tuesday", "not an ISO 8601"), (True, "not a time"),
                           (float("nan"), "not a time"), ([2030], "not a time")]:
            with pytest.raises(InvalidRequestError, match=match):
                memory.add(user_id="frank", texts=["Frank owns a red bicycle."],
                           expiration_date=bad)
            with pytest.raises(InvalidRequestError, match=match):
                memory.add(user_id="frank", messages=[{"role": "user", "content": "hi"}],
                           session_id="s", expiration_date=bad)
        assert memory.records(user_id="frank", include_expired=True) == []
        assert memory.turns(user_id="frank", session_id="s") == []
        tomorrow = date.today() + timedelta(days=2)
        for value, expected in [
                (tomorrow, datetime.combine(tomorrow + timedelta(days=1), datetime.min.time(),
                                            UTC).timestamp()),
                (tomorrow.isoformat(), datetime.combine(
                    tomorrow + timedelta(days=1), datetime.min.time(), UTC).timestamp()),
                ("2099-05-08T12:00:00+02:00", datetime(2099, 5, 8, 10, tzinfo=UTC).timestamp()),
                (datetime(2099, 5, 8, 12), datetime(2099, 5, 8, 12, tzinfo=UTC).timestamp()),
                (4_000_000_000, 4_000_000_000.0)]:
            (added,) = memory.add(user_id="frank", texts=[f"Frank's fact {value!s}."],
                                  expiration_date=value)
            assert memory.get(user_id="frank", fact_id=added.fact_id).expires_at == expected
        memory.delete_all(user_id="frank")


def test_expiry_options_are_checked(tiered_engine, tmp_path):
    from inferscale_engine.memory import MemoryConfig

    for options, match in [({"on_expiry": "drop"}, "on_expiry"),
                           ({"expiry_sweep_s": 0}, "expiry_sweep_s"),
                           ({"expiry_sweep_s": True}, "expiry_sweep_s")]:
        with pytest.raises(ConfigError, match=match):
            _memory(tiered_engine, str(tmp_path / "x.db"), **options)
        with pytest.raises(ConfigError, match=match):
            MemoryConfig(engine=tiered_engine.config, **options)


def test_a_sweep_of_some_users_deletes_only_their_expired_rows(tiered_engine, database):
    with _memory(tiered_engine, database, expiry_sweep_s=None) as memory:
        ids = {}
        for user in ("lg:one", "LG:two", "other"):
            (ids[user],) = [r.fact_id for r in memory.add(user_id=user, texts=[FACTS[0]],
                                                          expiration_date=time.time() + 600)]
            memory.set_expiration(user_id=user, fact_ids=[ids[user]],
                                  expiration_date=time.time() + 0.5)
        time.sleep(0.6)
        # each verb already took what was due out of serving; the sweep deletes lg:'s rows
        assert ids["lg:one"] in memory.sweep_expired(delete=True, user_prefix="lg:")
        assert tiered_engine.tiers_of(list(ids.values())) == {}
        assert memory.records(user_id="lg:one", include_expired=True) == []
        for user in ("LG:two", "other"):  # another prefix (case counts): hidden, kept
            assert [r.fact_id for r in memory.records(user_id=user, include_expired=True)] == [
                ids[user]]
            assert memory.records(user_id=user) == []
        for user in ("LG:two", "other"):
            memory.delete_all(user_id=user)
