"""A Memory over a store that other processes write too (PostgreSQL shared by replicas).

"Another replica" is a second FactStore on the same database, writing as a replica's Memory
would. The Memory under test must serve exactly what the store holds for a user when it serves
that user: facts added elsewhere are found and injected, facts changed elsewhere are served
with their new text, facts deleted elsewhere are never served, and a user nobody else wrote is
read from the store once.
"""

from __future__ import annotations

import pytest

from inferscale_engine.errors import FactNotFoundError
from inferscale_engine.memory import Memory
from inferscale_engine.memory.store.fact_store import FactStore
from tests.conftest import FACTS, greedy
from tests.engine.memory.memory_support import HashEmbedder

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def engine(module_engine):
    """The module's tiny engine (conftest.py), W=32."""
    return module_engine


class OtherReplica:
    """Writes to the shared database as another replica's Memory would (same embedder)."""

    def __init__(self, url: str, engine) -> None:
        self.store, self.engine, self.embedder = FactStore(url), engine, HashEmbedder()

    def add(self, user_id: str, texts: list[str]) -> list[int]:
        return self.store.add_facts(
            user_id=user_id, texts=texts, token_ids=[self.engine.tokenize_fact(t) for t in texts],
            embeddings=self.embedder.encode(texts))

    def update(self, user_id: str, fact_id: int, text: str) -> None:
        self.store.update(user_id=user_id, fact_id=fact_id, text=text,
                          token_ids=self.engine.tokenize_fact(text),
                          embedding=self.embedder.encode([text])[0])


@pytest.fixture()
def shared(engine, postgres_url):
    # the first replica to open the database records its model fingerprint; a replica that
    # finds the same one reads users on first use (a different one re-reads every fact)
    Memory(engine, postgres_url, HashEmbedder(), progress_bar=False).close()
    other = OtherReplica(postgres_url, engine)
    try:
        yield postgres_url, other
    finally:
        other.store.close()


def replica(engine, url: str) -> Memory:
    """A Memory as `inferscale serve` opens one over a shared store: users read on first use."""
    return Memory(engine, url, HashEmbedder(), startup="lazy", progress_bar=False)


def served_texts(memory: Memory, user_id: str, query: str, k: int = 10) -> list[str]:
    return [fact.text for fact, _ in memory.search(user_id=user_id, query=query, k=k).hits]


def test_a_user_is_read_on_first_use_not_at_start(engine, shared):
    url, other = shared
    other.add("alice", FACTS[:3])
    other.add("bob", FACTS[3:5])
    with replica(engine, url) as memory:
        assert memory.stats().num_indexed == 0  # nothing registered at start
        assert sorted(served_texts(memory, "alice", FACTS[0])) == sorted(FACTS[:3])
        assert memory.stats().num_indexed == 3  # alice only
        for _ in range(3):
            served_texts(memory, "alice", FACTS[1])
        assert memory.stats().counters["synced_users"] == 1  # unchanged: not read again
        kv = memory.generate(user_id="alice", query=FACTS[0], k=3, sampling=greedy(4))
        assert kv.plan_status == "inject" and kv.num_injected_tokens > 0


def test_writes_of_another_replica_are_served(engine, shared):
    url, other = shared
    with replica(engine, url) as memory:
        mine = [r.fact_id for r in memory.add(user_id="alice", texts=FACTS[:2])]
        assert sorted(served_texts(memory, "alice", FACTS[0])) == sorted(FACTS[:2])
        (theirs,) = other.add("alice", [FACTS[2]])  # added elsewhere
        assert sorted(served_texts(memory, "alice", FACTS[2])) == sorted(FACTS[:3])
        kv = memory.generate(user_id="alice", query=FACTS[2], k=1, sampling=greedy(4))
        assert kv.plan_status == "inject" and kv.num_injected_tokens > 0
        other.update("alice", mine[0], "Alice moved to Lisbon in May.")  # changed elsewhere
        texts = served_texts(memory, "alice", "Lisbon")
        assert "Alice moved to Lisbon in May." in texts and FACTS[0] not in texts
        kv = memory.generate(user_id="alice", query="Lisbon", k=1, sampling=greedy(4))
        text = memory.generate(user_id="alice", query="Lisbon", k=1, sampling=greedy(4),
                               mode="text")
        assert kv.plan_status == "inject" and kv.num_prompt_tokens == text.num_prompt_tokens
        other.store.delete(user_id="alice", fact_ids=[theirs])  # deleted elsewhere
        assert FACTS[2] not in served_texts(memory, "alice", FACTS[2])
        with pytest.raises(FactNotFoundError):  # its KV freed, the engine forgot it
            memory.engine.is_resident(theirs)
        # this replica's own writes go on: they see the user as the store has it
        added = memory.add(user_id="alice", texts=[FACTS[2]])[0]
        assert added.event == "ADD" and added.fact_id != theirs
        assert sorted(f.text for f in memory.get_all(user_id="alice")) == sorted(
            ["Alice moved to Lisbon in May.", FACTS[1], FACTS[2]])


def test_users_stay_apart_on_a_shared_store(engine, shared):
    url, other = shared
    with replica(engine, url) as memory:
        memory.add(user_id="alice", texts=FACTS[:2])
        other.add("bob", FACTS[2:4])
        assert set(served_texts(memory, "bob", FACTS[2])) == set(FACTS[2:4])
        assert set(served_texts(memory, "alice", FACTS[2])) == set(FACTS[:2])
        other.store.reset(user_id="bob")  # reset elsewhere
        assert served_texts(memory, "bob", FACTS[2]) == []
        assert set(served_texts(memory, "alice", FACTS[0])) == set(FACTS[:2])


def test_own_writes_keep_the_user_synced(engine, shared):
    url, other = shared
    with replica(engine, url) as memory:
        ids = [r.fact_id for r in memory.add(user_id="carol", texts=FACTS[:3])]
        memory.update(user_id="carol", fact_id=ids[0], text="Carol moved to Oslo.")
        memory.delete(user_id="carol", fact_ids=[ids[1]])
        assert sorted(served_texts(memory, "carol", "Oslo")) == sorted(
            ["Carol moved to Oslo.", FACTS[2]])
        assert memory.stats().counters["synced_users"] == 1  # read once, on first use
        other.add("carol", [FACTS[3]])  # then someone else writes: read again
        assert FACTS[3] in served_texts(memory, "carol", FACTS[3])
        assert memory.stats().counters["synced_users"] == 2


def test_the_users_held_are_bounded_and_a_released_one_is_read_again(engine, shared):
    """Issue 52: serving state grew by one user for every id ever asked about. A replica holds
    at most max_served_users users of the shared store; the least recently served beyond that
    is released (its facts leave the engine and the index) and read again on its next use."""
    url, other = shared
    for user, texts in (("ann", FACTS[:2]), ("ben", FACTS[2:4]), ("cal", FACTS[4:])):
        other.add(user, texts)
    with Memory(engine, url, HashEmbedder(), startup="lazy", progress_bar=False,
                max_served_users=2) as memory:
        assert served_texts(memory, "ann", FACTS[0]) and served_texts(memory, "ben", FACTS[2])
        assert memory.stats().num_served_users == 2
        assert set(served_texts(memory, "cal", FACTS[4])) == set(FACTS[4:])
        stats = memory.stats()
        assert stats.num_served_users == 2 and stats.counters["released_users"] == 1
        assert memory.engine.get_facts("ann") == []  # released: no longer registered
        assert stats.num_indexed == len(FACTS[2:])
        for n in range(5):  # ids without facts are held the same way: within the bound
            assert served_texts(memory, f"nobody-{n}", "anything") == []
            assert memory.stats().num_served_users == 2
        kv = memory.generate(user_id="ann", query=FACTS[0], k=2, sampling=greedy(4))
        assert kv.plan_status == "inject" and kv.num_injected_tokens > 0  # read again
        assert sorted(served_texts(memory, "ann", FACTS[1])) == sorted(FACTS[:2])
        assert memory.stats().num_served_users == 2


def test_a_pin_set_by_another_replica_is_followed(engine, shared):
    url, other = shared
    with replica(engine, url) as memory:
        first, second = other.add("pia", FACTS[:2])
        assert memory.handle_for(user_id="pia", query=None, k=2).fact_ids == ()
        other.store.set_pinned(user_id="pia", fact_ids=[second], pinned=True)
        assert memory.pinned(user_id="pia") == [second]
        assert memory.handle_for(user_id="pia", query=None, k=2).fact_ids == (second,)
        other.store.set_pinned(user_id="pia", fact_ids=[second], pinned=False)
        other.store.set_pinned(user_id="pia", fact_ids=[first], pinned=True)
        assert memory.pinned(user_id="pia") == [first]
        other.store.delete(user_id="pia", fact_ids=[first])
        assert memory.pinned(user_id="pia") == []
