"""`inferscale serve --data-parallel-size N`: a memory request goes to its user's engine (the
one whose slab holds the user's facts), whatever X-data-parallel-rank a client sends; other
requests keep vLLM's own header handling. The data path itself is tested on a real DP=2 engine
in tests/invariants/test_data_parallel.py."""

from __future__ import annotations

from types import SimpleNamespace

from inferscale_engine.runtime.shards import rank_of
from inferscale_engine.server.identity import MemoryOptions
from inferscale_engine.server.seam import (
    _SCOPE,
    MemoryServingChat,
    MemoryServingCompletion,
    RequestScope,
)


def seam(cls: type) -> object:
    engine = SimpleNamespace(rank_of=lambda user_id: rank_of(user_id, 4))
    adopted = cls.__new__(cls)
    adopted._inferscale = SimpleNamespace(memory=SimpleNamespace(engine=engine))
    return adopted


def test_memory_requests_go_to_their_users_engine_whatever_the_header_says():
    forged = SimpleNamespace(headers={"X-data-parallel-rank": "3"})
    for cls in (MemoryServingChat, MemoryServingCompletion):
        serving = seam(cls)
        for user in ("ann", "bob", "chloé", "user-17"):
            token = _SCOPE.set(RequestScope(MemoryOptions(user_id=user), []))
            try:
                assert serving._get_data_parallel_rank(forged) == rank_of(user, 4)
            finally:
                _SCOPE.reset(token)
        # no memory (disabled, or no user): vLLM's header handling
        token = _SCOPE.set(RequestScope(MemoryOptions(user_id="ann", enabled=False), []))
        try:
            assert serving._get_data_parallel_rank(forged) == 3
        finally:
            _SCOPE.reset(token)
        assert serving._get_data_parallel_rank(forged) == 3
        assert serving._get_data_parallel_rank(None) is None


def test_the_user_hash_is_stable_and_spreads_users():
    assert rank_of("ann", 1) == 0
    ranks = [rank_of(f"user-{i}", 4) for i in range(400)]
    assert ranks == [rank_of(f"user-{i}", 4) for i in range(400)]  # no per-process hash seed
    assert all(60 <= ranks.count(r) <= 140 for r in range(4))
    assert rank_of("user-0", 2) == 1 and rank_of("user-1", 2) == 0  # pinned across releases
