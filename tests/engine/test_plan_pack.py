"""The compiled plan wire format (plan_pack.c). pack: InjectionPlan.from_runs makes the same plan
with it as without it, and hands what it refuses to the Python path, whose PlanError says why.
bind: InjectionPlan.bound decides as its Python path does, and leaves it what it does not take."""

from __future__ import annotations

import base64
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# ---- bind: the scheduler's check of a signed plan (InjectionPlan.bound) ----------------------

def _python_bound(params, prompt):
    """InjectionPlan.bound by its Python path (no monkeypatch fixture: hypothesis uses it too)."""
    binder = plan_module.plan_binder
    plan_module.plan_binder = lambda: None  # type: ignore[assignment]
    try:
        return InjectionPlan.bound(params, prompt, SECRET)
    finally:
        plan_module.plan_binder = binder  # type: ignore[assignment]


def _mutations(rng: random.Random, entry: dict, prompt: list) -> tuple[dict, list]:
    """One random change to a signed plan's entry or its prompt (or none)."""
    entry, prompt = dict(entry), list(prompt)
    field = rng.choice(["v", "kind", "user", "salt", "mac", "keys", "lengths", "tokens", None])
    if field == "v":
        entry["v"] = rng.choice([plan_module.PLAN_VERSION - 1, float(plan_module.PLAN_VERSION),
                                 True, str(plan_module.PLAN_VERSION), 2**70])
    elif field in ("kind", "user", "salt", "mac"):
        entry[field] = rng.choice(["", "inject", "alice", "caf\u00e9", "\ud800", 7, None,
                                   entry[field] + "x"])
    elif field in ("keys", "lengths", "tokens"):
        text = entry[field]
        entry[field] = rng.choice([
            text[:-4], text + "AAAA", text + "====", text[:-1], text.rstrip("=") + "=",
            text.replace("A", "-", 1), " " + text, text + "\n", "", text + "AA==",
            base64.b64encode(b"\xff" * 8).decode(), base64.b64encode(b"\0" * 12).decode(),
            text[:4] + "=" + text[5:], 17, None])
    case = rng.randrange(8)
    if case == 1 and prompt:
        prompt[rng.randrange(len(prompt))] = rng.choice([True, 2**31, -(2**31) - 1, 1.0, "1",
                                                         -5, 2**31 - 1, -(2**31)])
    elif case == 2:
        prompt = prompt[:rng.randrange(len(prompt) + 1)]
    elif case == 3 and prompt:
        prompt[rng.randrange(len(prompt))] += 1
    return entry, prompt


@pytest.mark.parametrize("seed", range(40))
def test_bind_decides_as_the_python_path(seed):
    """Random signed plans, each with one random change to a field or to its prompt: the C
    path returns the Python path's plan (wire bytes included) or None alike."""
    rng = random.Random(seed)
    keys, runs = random_runs(rng)
    user = rng.choice(["alice", "caf\u00e9", "\U0001f600 bob", "u" * 300])
    plan = InjectionPlan.from_runs(user, keys, runs, secret=SECRET).signed(SECRET)
    params = plan.to_params()
    ids = list(struct.unpack(f"<{plan.num_tokens}i", plan.tokens))
    prompt = ids + [rng.randrange(100) for _ in range(rng.randint(0, 5))]
    assert InjectionPlan.bound(params, prompt, SECRET) == plan  # unchanged: it verifies
    for _ in range(25):
        entry, asked = _mutations(rng, params["inferscale"], prompt)
        mutated = {"inferscale": entry}
        fast = InjectionPlan.bound(mutated, asked, SECRET)
        slow = _python_bound(mutated, asked)
        assert fast == slow, (entry, asked[:8])
        assert fast is None or (fast.wire == slow.wire and fast.tokens == slow.tokens)


def test_bind_leaves_to_the_python_path_what_it_does_not_take():
    """None from bind is 'not decided here': a plan the Python path verifies still binds."""
    bind = plan_module.plan_binder()
    ids = [5, 6, 7, 8]
    plan = InjectionPlan.from_runs("alice", [3], [pack_token_ids(ids)], secret=SECRET)
    params = plan.signed(SECRET).to_params()
    entry = params["inferscale"]
    assert bind(entry, ids, plan_module.PLAN_VERSION) is not None

    class Id(int):
        pass

    taken_by_python = [
        ({**entry, "v": float(plan_module.PLAN_VERSION)}, ids),  # 6.0 == 6
        ({**entry, "keys": entry["keys"] + "=="}, ids),  # excess padding, which b64decode skips
        (entry, [Id(5), 6, 7, 8]),  # an int subclass
        (entry, (5, 6, 7, 8)),  # a tuple prompt
        (entry, [True, 6, 7, 8]),  # a bool packs as 1 (not this plan's 5: no match either way)
    ]
    for sent, prompt in taken_by_python:
        assert bind(sent, prompt, plan_module.PLAN_VERSION) is None
        assert (InjectionPlan.bound({"inferscale": sent}, prompt, SECRET)
                == _python_bound({"inferscale": sent}, prompt))
    assert InjectionPlan.bound({"inferscale": taken_by_python[0][0]}, ids, SECRET) is not None
    assert bind(entry, ids, plan_module.PLAN_VERSION + 1) is None
    with pytest.raises(TypeError):
        bind(entry, ids)


def test_python_code_run_while_binding_cannot_change_what_is_read():
    """A dict key whose __eq__ runs Python code (possible in-process only: JSON has str keys)
    cannot free a field bind is reading; the lookup's error leaves bind undecided."""
    ids = [5, 6, 7, 8]
    plan = InjectionPlan.from_runs("alice", [3], [pack_token_ids(ids)], secret=SECRET)
    fields = plan.signed(SECRET).to_params()["inferscale"]
    calls = []

    class Colliding:
        """Hashes as "mac" and sits first on its probe path: the lookup of "mac" calls __eq__."""

        armed = False

        def __hash__(self) -> int:
            return hash("mac")

        def __eq__(self, other: object) -> bool:
            if self.armed:
                calls.append(other)
                self.action()
            return False

        def action(self) -> None:
            entry.clear()  # would free the fields read before "mac" (v, kind, user, salt)

    key = Colliding()
    entry = {key: 1, **fields}
    key.armed = True
    assert plan_module.plan_binder()(entry, ids, plan_module.PLAN_VERSION) is None
    assert calls and entry == {}

    def boom() -> None:
        raise RuntimeError("boom")

    calls.clear()
    key.armed, key.action = False, boom  # type: ignore[method-assign]
    entry = {key: 1, **fields}
    key.armed = True
    assert plan_module.plan_binder()(entry, ids, plan_module.PLAN_VERSION) is None
    assert calls and len(entry) == len(fields) + 1


_B64ISH = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefgh0123456789+/= -\n\u00e9", max_size=40)
_FIELD = st.one_of(_B64ISH, st.text(max_size=8), st.integers(), st.none(), st.floats())


@settings(max_examples=400, deadline=None)
@given(entry=st.fixed_dictionaries({}, optional={
           "v": st.one_of(st.just(plan_module.PLAN_VERSION), _FIELD),
           "kind": st.one_of(st.just("inject"), _FIELD),
           **{name: _FIELD for name in ("user", "salt", "mac", "keys", "lengths", "tokens")}}),
       prompt=st.lists(st.one_of(st.integers(-(2**40), 2**40), st.booleans(), st.none()),
                       max_size=40))
def test_bind_on_arbitrary_fields_agrees_with_the_python_path(entry, prompt):
    """Untrusted params (the OpenAI server's) of any shape: bind returns the Python path's
    answer or leaves it undecided, and never raises."""
    python = _python_bound({"inferscale": entry}, prompt)
    got = plan_module.plan_binder()(entry, prompt, plan_module.PLAN_VERSION)
    if got is not None:  # it decided: a tuple of the fields the Python path reads
        assert InjectionPlan.bound({"inferscale": entry}, prompt, SECRET) == python
    assert python is None  # nothing arbitrary carries a valid MAC
