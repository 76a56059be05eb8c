"""The compiled plan packing (plan_pack.c): InjectionPlan.from_runs makes the same plan with it
as without it, and hands what it refuses to the Python path, whose PlanError says why."""

from __future__ import annotations

import random
import struct

import pytest

from inferscale_engine import plan as plan_module
from inferscale_engine.errors import PlanError
from inferscale_engine.plan import InjectionPlan, from_params, pack_token_ids

pytestmark = pytest.mark.skipif(plan_module.plan_packer() is None,
                                reason="no C compiler or Python headers here: from_runs uses "
                                       "its Python path (tested in test_plan.py)")
SECRET = b"k" * 32


def random_runs(rng: random.Random) -> tuple[list[int], list[bytes]]:
    n = rng.randint(1, 120)
    keys = [rng.choice([0, 1, 2**63 - 1, rng.randrange(2**40)]) for _ in range(n)]
    runs = [pack_token_ids([rng.randrange(-(2**31), 2**31) for _ in range(rng.randint(1, 60))])
            for _ in range(n)]
    return keys, runs


@pytest.mark.parametrize("seed", range(30))
def test_the_compiled_plan_is_the_python_plan(seed, monkeypatch):
    keys, runs = random_runs(random.Random(seed))
    fast = InjectionPlan.from_runs("alice", keys, runs, secret=SECRET)
    with_salt = InjectionPlan.from_runs("alice", tuple(keys), runs, "salt")
    monkeypatch.setattr(plan_module, "plan_packer", lambda: None)
    slow = InjectionPlan.from_runs("alice", keys, runs, secret=SECRET)
    assert fast == slow and fast.wire == slow.wire and fast.cache_salt == slow.cache_salt
    assert with_salt == InjectionPlan.from_runs("alice", keys, runs, "salt")
    assert type(fast.slab_keys) is tuple and type(fast.lengths) is tuple
    assert fast.signed(SECRET).mac == slow.signed(SECRET).mac
    parsed = from_params(fast.signed(SECRET).to_params())
    assert parsed == fast.signed(SECRET) and parsed.verify(SECRET)


def test_the_packer_refuses_what_the_python_path_refuses():
    pack = plan_module.plan_packer()
    run = pack_token_ids([1, 2, 3])
    refused = [([1], []), ([], [run]), ([1, 2], [run]), ([1], [b""]), ([1], [run[:-1]]),
               ([1], ["abc"]), ([2**63], [run]), ([1.5], [run]), ([1], (run,))]
    for keys, runs in refused:
        with pytest.raises((ValueError, TypeError, OverflowError)):
            pack(keys, runs)
            pytest.fail(f"{keys!r:.20} {runs!r:.40} was packed")
    for keys, runs in refused[:5]:  # from_runs then says why, as before
        with pytest.raises(PlanError, match="one slab key per non-empty run"):
            InjectionPlan.from_runs("alice", keys, runs, "salt")
    with pytest.raises(struct.error):  # a key out of int64: the Python path's error, unchanged
        InjectionPlan.from_runs("alice", [2**63], [run], "salt")
    tupled = InjectionPlan.from_runs("alice", [1], (run,), "salt")  # not a list: Python path
    assert tupled == InjectionPlan.from_runs("alice", [1], [run], "salt")


def test_python_code_run_while_packing_cannot_change_what_is_packed():
    """A key's __index__ runs Python code; the packer reads snapshots taken before it."""
    runs = [pack_token_ids([1, 2]), pack_token_ids([3])]

    class Emptying:
        def __index__(self) -> int:
            runs.clear()  # would free the bytes a borrowed pointer still reads
            return 7

    keys, _, lengths, _, tokens = plan_module.plan_packer()([Emptying(), 8], runs)
    assert keys[1] == 8 and lengths == (2, 1) and tokens == pack_token_ids([1, 2, 3])
    assert runs == []
