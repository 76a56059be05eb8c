"""PreambleCache without an engine: keys by content, the identity memo of the last preamble."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from inferscale_engine.protocol.plan import pack_token_ids, token_digest
from inferscale_engine.runtime.preambles import PreambleCache
from inferscale_engine.runtime.residency import Residency, SlabAllocator


class _Writer:
    def __init__(self, residency: Residency) -> None:
        self.residency, self.saved = residency, []

    def save_preamble(self, owner, preamble, pinned):
        pages, _ = self.residency.allocate(len(preamble), set(), False)
        self.saved.append(tuple(preamble))
        return self.residency.next_slab_key(), pages


def make_cache() -> tuple[PreambleCache, _Writer, list]:
    residency = Residency(SlabAllocator(64, 16))
    writer, freed = _Writer(residency), []
    workers = SimpleNamespace(free=freed.extend)
    return (PreambleCache(writer, residency, workers, Counter(), (1, 2, 3)),  # type: ignore[arg-type]
            writer, freed)


def test_the_memo_is_an_identity_shortcut_never_a_different_answer():
    cache, writer, _ = make_cache()
    a, b = tuple(range(10, 40)), tuple(range(50, 70))
    key_a = cache.key(a)
    assert cache.key(a) == key_a and cache.run(a) == pack_token_ids(a)
    assert cache.run(a) is cache.run(a)  # packed once for the remembered tuple
    assert cache.key(tuple(list(a))) == key_a  # an equal tuple, another object: same entry
    key_b = cache.key(b)
    assert key_b != key_a and cache.run(b) == pack_token_ids(b)
    assert cache.run(a) == pack_token_ids(a)  # no longer remembered: packed again, same bytes
    assert cache.key(list(b)) == key_b and cache.key(a) == key_a  # a list is never remembered
    assert cache.run([7, 8]) == pack_token_ids([7, 8])
    assert writer.saved == [a, b]  # each encoded once
    assert cache._digest(a) == token_digest(a) and cache._digest(list(b)) == token_digest(b)


def test_an_evicted_remembered_preamble_is_encoded_again():
    cache, writer, freed = make_cache()
    extra = tuple(range(100, 120))
    first = cache.key(extra)
    cache.end_batch()
    cache.evict(0)  # the remembered preamble's entry is gone; its digest stays remembered
    assert freed == [first]
    again = cache.key(extra)
    assert again != first and writer.saved == [extra, extra]
