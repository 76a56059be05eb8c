"""The kv_transfer_params format: round trip, authentication, strict parsing."""

from __future__ import annotations

import base64
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferscale_engine.errors import PlanError
from inferscale_engine.protocol.plan import (
    PLAN_VERSION,
    InjectionPlan,
    SavePlan,
    SaveSpan,
    Segment,
    cache_salt,
    client_salted,
    from_params,
    pack_token_ids,
    save_salt,
    tenant_salt,
    text_salt,
)

SECRET = b"k" * 32


def packed(code: str, *values: int) -> str:
    """Base64 of little-endian values, as plans carry slab keys (q), lengths and tokens (i)."""
    return base64.b64encode(struct.pack(f"<{len(values)}{code}", *values)).decode()


def make_plan() -> InjectionPlan:
    segments = (Segment(1, 0, (5, 6, 7)), Segment(9, 3, (8, 9)), Segment(4, 5, (1,)))
    return InjectionPlan.from_segments("alice", segments, "salt").signed(SECRET)


def test_round_trip_and_mac():
    plan = make_plan()
    assert "tokens" not in plan.to_params()["inferscale"]  # the prompt's ids are what it binds
    parsed = from_params(plan.to_params())
    assert parsed.tokens == b"" and parsed.num_tokens == 6 and parsed.wire == plan.wire
    bound = InjectionPlan.bound(plan.to_params(), [5, 6, 7, 8, 9, 1, 42], SECRET)
    assert bound == plan and bound.verify(SECRET)
    assert bound.segments[1] == Segment(9, 3, (8, 9)) and bound.starts == [0, 3, 5]
    assert bound.matches([5, 6, 7, 8, 9, 1, 42]) and not bound.matches([5, 6, 7, 8, 9, 2, 42])
    prompt = list(range(100, 110)) + [1, 2, 3]
    save = SavePlan.one("bob", 3, 10, 3, (0, 1)).signed(SECRET, prompt)
    assert from_params(save.to_params()) == save and save.verify(SECRET, prompt)
    run = run_plan().signed(SECRET, prompt)
    assert from_params(run.to_params()) == run and run.verify(SECRET, prompt) and run.end == 13


@pytest.mark.parametrize("size", [16, 32, 64, 65, 200])
def test_macs_take_secrets_of_any_allowed_length(size):
    """Keyed BLAKE2b takes keys of up to 64 bytes; longer secrets are hashed to 64 first."""
    secret, other = bytes(range(size)), bytes(range(1, size + 1))
    signed = make_plan().signed(secret)
    assert len(signed.mac) == 32 and signed.verify(secret) and not signed.verify(other)
    assert cache_salt(secret, "alice", [1, 2]) != cache_salt(other, "alice", [1, 2])


def run_plan() -> SavePlan:
    """Three facts of one save prompt of 13 tokens: [4, 6), [6, 10), [10, 13)."""
    return SavePlan("bob", (SaveSpan(3, 4, 2, (0,)), SaveSpan(5, 6, 4, (1,)),
                            SaveSpan(8, 10, 3, (2, 3))))


@pytest.mark.parametrize("make", [lambda: SavePlan.one("bob", 3, 10, 3, (0, 1)), run_plan])
def test_save_mac_covers_the_whole_prompt(make):
    prompt = list(range(100, 110)) + [1, 2, 3]
    save = make().signed(SECRET, prompt)
    other_prefix = [7] * 10 + [1, 2, 3]
    assert not save.verify(SECRET, other_prefix)
    assert not save.verify(SECRET, prompt[:-1]) and not save.verify(SECRET, prompt + [4])
    assert not save.verify(b"x" * 32, prompt)
    for field, value in [("user", "mallory"), ("key_scale", [0.5])]:
        params = save.to_params()
        params["inferscale"][field] = value
        assert not from_params(params).verify(SECRET, prompt), field
    for field, value in [("key", 4), ("start", 9), ("num_tokens", 2), ("pages", [0, 7])]:
        params = save.to_params()
        params["inferscale"]["spans"][-1][field] = value
        try:
            tampered = from_params(params)
        except PlanError:  # spans that no longer describe one prompt
            continue
        assert not tampered.verify(SECRET, prompt), field
    if len(save.spans) > 1:
        params = save.to_params()
        params["inferscale"]["spans"] = params["inferscale"]["spans"][-1:]
        assert not from_params(params).verify(SECRET, prompt), "a span dropped"
    with pytest.raises(PlanError, match="save prompt has 12 tokens"):
        make().signed(SECRET, prompt[:-1])


@pytest.mark.parametrize("spans,message", [
    ((), "at least one span"),
    ((SaveSpan(1, 4, 3, (0,)), SaveSpan(2, 6, 2, (1,))), "without overlap"),
    ((SaveSpan(1, 4, 0, (0,)),), "without overlap"),
    ((SaveSpan(1, 4, 2, ()),), "hold pages"),
    ((SaveSpan(1, 4, 2, (0,)), SaveSpan(1, 6, 2, (1,))), "distinct slab keys"),
])
def test_malformed_spans_are_refused(spans, message):
    with pytest.raises(PlanError, match=message):
        SavePlan("bob", spans).signed(SECRET, list(range(8)))
    raw = SavePlan("bob", spans).to_params()["inferscale"]
    with pytest.raises(PlanError, match=message if spans else "spans"):
        from_params({"inferscale": raw})


PROMPT = [5, 6, 7, 8, 9, 1, 42]
"""make_plan()'s prompt: its six ids and one more."""


@pytest.mark.parametrize("field,value", [("user", "mallory"), ("keys", packed("q", 1, 9, 5)),
                                         ("salt", "other"), ("lengths", packed("i", 2, 3, 1))])
def test_tampering_breaks_the_mac(field, value):
    params = make_plan().to_params()
    assert InjectionPlan.bound(params, PROMPT, SECRET) == make_plan()
    params["inferscale"][field] = value
    assert InjectionPlan.bound(params, PROMPT, SECRET) is None
    assert not make_plan().verify(b"x" * 32)


def test_the_mac_binds_the_prompts_ids_and_the_plan_carries_none():
    """A plan verifies only for the prompt it was made for; a 'tokens' field (the format
    before version 7 sent the ids, unread once the MAC bound the prompt's) is refused."""
    params = make_plan().to_params()
    for i in range(6):
        other = list(PROMPT)
        other[i] += 1
        assert InjectionPlan.bound(params, other, SECRET) is None, i
    assert InjectionPlan.bound(params, [*PROMPT[:6], 99], SECRET) == make_plan()
    params["inferscale"]["tokens"] = packed("i", *PROMPT[:6])
    with pytest.raises(PlanError, match="unknown fields"):
        from_params(params)
    assert InjectionPlan.bound(params, PROMPT, SECRET) is None


def test_mac_framing_keeps_user_and_salt_apart():
    signed = InjectionPlan.from_runs("a|b", [1], [pack_token_ids([5])], "c").signed(SECRET)
    params = signed.to_params()
    assert InjectionPlan.bound(params, [5, 0], SECRET) == signed
    params["inferscale"].update(user="a", salt="b|c")
    assert InjectionPlan.bound(params, [5, 0], SECRET) is None


def test_not_ours():
    assert from_params(None) is None and from_params({"other_connector": 1}) is None


K1, L1, T1 = packed("q", 1), packed("i", 1), packed("i", 1)  # T1: ids, as version 6 sent them
INJECT = {"v": PLAN_VERSION, "kind": "inject", "user": "u", "salt": "s", "mac": ""}
SAVE = {"v": PLAN_VERSION, "kind": "save", "user": "u", "mac": ""}


@pytest.mark.parametrize("raw,message", [
    ("str", "must be a mapping"), ({"v": 1}, "version 1"),
    ({"v": PLAN_VERSION, "kind": "inject"}, "'user'"),
    ({**INJECT, "keys": K1, "lengths": L1, "tokens": T1}, "unknown fields"),
    ({**INJECT, "keys": K1, "lengths": L1, "extra": 1}, "unknown fields"),
    ({**INJECT, "keys": packed("q", 1, 2), "lengths": L1}, "as many 'keys'"),
    ({**INJECT, "keys": "", "lengths": ""}, "at least one"),
    ({**INJECT, "keys": "not base64!", "lengths": L1}, "not valid base64"),
    ({**INJECT, "keys": [1], "lengths": L1}, "'keys' must be a base64 string"),
    ({**INJECT, "keys": K1, "lengths": [1]}, "'lengths' must be a base64"),
    ({**INJECT, "keys": L1, "lengths": L1}, "whole int64 slab keys"),
    ({**INJECT, "keys": K1, "lengths": "AQAA"}, "whole int32 run lengths"),
    ({**INJECT, "keys": packed("q", -1), "lengths": L1}, "non-negative 'keys'"),
    ({**INJECT, "keys": packed("q", 1, 2), "lengths": packed("i", 1, 0)}, "positive 'lengths'"),
    ({**INJECT, "v": 6, "keys": K1, "lengths": L1, "tokens": T1}, "version 6"),  # ids sent
    ({**INJECT, "v": 3, "keys": [1], "lengths": [1], "tokens": T1}, "version 3"),  # lists of ints
    ({**SAVE, "spans": [{"key": -1, "start": 0, "num_tokens": 1, "pages": [0]}]}, "'key'"),
    ({**SAVE, "spans": [{"key": 1, "start": 0, "num_tokens": 0, "pages": [0]}]}, "non-empty"),
    ({**SAVE, "spans": [{"key": 1, "start": 0, "num_tokens": 1, "pages": []}]}, "hold pages"),
    ({**SAVE, "spans": [{"key": True, "start": 0, "num_tokens": 1, "pages": [1]}]}, "'key'"),
    ({**SAVE, "spans": [[1, 0, 1, [0]]]}, "must be a mapping"),
    ({**SAVE, "spans": {"key": 1}}, "'spans' must be a list"),
    ({**SAVE, "spans": [{"key": i, "start": i, "num_tokens": 1, "pages": [0]}
                        for i in range(4097)]}, "1..4096 spans"),
    ({"v": 4, "kind": "save", "user": "u", "key": 1, "start": 0, "num_tokens": 1, "pages": [0],
      "mac": ""}, "version 4"),  # the version before a save prompt could hold a run of facts
    ({"v": 2, "kind": "save", "user": "u", "key": 1, "start": 0, "tokens": [1], "pages": [0],
      "mac": ""}, "version 2"),  # the version before saves were bound to their whole prompt
])
def test_malformed_params_raise_plan_error(raw, message):
    with pytest.raises(PlanError, match=message):
        from_params({"inferscale": raw})


def test_from_runs_joins_packed_runs_and_refuses_bad_ones():
    runs = [pack_token_ids(run) for run in [(5, 6, 7), [8, 9], (1,)]]
    plan = InjectionPlan.from_runs("alice", [1, 9, 4], runs, "salt")
    assert plan == InjectionPlan.from_segments("alice", make_plan().segments, "salt")
    assert plan.lengths == (3, 2, 1) and plan.starts == [0, 3, 5] and plan.num_tokens == 6
    assert not plan.matches([5, 6, 7, 8, 9]) and not plan.matches([5, 6, 7, 8, 9, 2**40])
    for keys, bad in [([1, 2], [runs[0], b""]), ([1, 2], runs[:1]), ([], []),
                      ([1], [runs[0][:-1]])]:
        with pytest.raises(PlanError, match="one slab key per non-empty run"):
            InjectionPlan.from_runs("alice", keys, bad, "salt")
    with pytest.raises(PlanError, match="ints in"):
        InjectionPlan.from_segments("alice", [Segment(1, 0, (2**31,))], "salt")


def test_wire_bytes_are_the_packed_keys_and_lengths():
    """Plans reuse their keys and lengths as packed on the wire: same bytes, same MAC."""
    plan = make_plan()
    parsed = from_params(plan.to_params())
    bare = InjectionPlan(plan.user_id, plan.slab_keys, plan.lengths, plan.tokens,
                         plan.cache_salt)  # no wire: packs them itself
    for with_wire in (plan, parsed):
        assert with_wire.wire == (struct.pack("<3q", 1, 9, 4), struct.pack("<3i", 3, 2, 1))
    assert bare.signed(SECRET).to_params() == plan.to_params()
    salted = InjectionPlan.from_runs("alice", [1, 9, 4], [b"\0" * 12, b"\0" * 8, b"\0" * 4],
                                     secret=SECRET)
    assert salted.cache_salt == cache_salt(SECRET, "alice", [1, 9, 4]) != cache_salt(
        SECRET, "bob", [1, 9, 4])


def test_every_salt_is_keyed_and_apart():
    """The salts of users' text prompts, tenants' requests, saves and plans never coincide,
    differ per owner and per client salt, and need the secret."""
    salts = [text_salt(SECRET, "alice"), text_salt(SECRET, "bob"), tenant_salt(SECRET, "alice"),
             tenant_salt(SECRET, "acme"), tenant_salt(SECRET, ""), save_salt(SECRET, "alice"),
             cache_salt(SECRET, "alice", [1]), text_salt(SECRET, "alice", "c1"),
             text_salt(SECRET, "alice", "c2"), tenant_salt(SECRET, "acme", "c1"),
             client_salted(SECRET, "s", "c1"), text_salt(b"o" * 32, "alice")]
    assert len(set(salts)) == len(salts)
    assert client_salted(SECRET, "s", "") == "s"  # no client salt: the server's alone


def test_a_client_salt_is_combined_into_a_signed_plan():
    plan = make_plan()
    assert plan.with_client_salt(SECRET, "") is plan
    mine = plan.with_client_salt(SECRET, "client-1")
    assert mine.cache_salt == client_salted(SECRET, plan.cache_salt, "client-1")
    assert mine.cache_salt != plan.cache_salt and mine.verify(SECRET)
    assert mine.with_client_salt(SECRET, "client-2").cache_salt != mine.cache_salt
    bound = InjectionPlan.bound(mine.to_params(), [5, 6, 7, 8, 9, 1], SECRET)
    assert bound is not None and bound.cache_salt == mine.cache_salt


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.text(max_size=5)
    | st.floats(allow_nan=False),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6),
                                                                       children, max_size=4),
    max_leaves=20,
)
packed_ints = st.builds(lambda code, values: packed(code, *values), st.sampled_from("qi"),
                        st.lists(st.integers(-3, 600), max_size=6))
plan_like = st.fixed_dictionaries({}, optional={
    "v": st.sampled_from([PLAN_VERSION] * 3 + [6, str(PLAN_VERSION), None]),
    "kind": st.sampled_from(["inject", "save", "x", 3]),
    "user": st.text(max_size=4) | json_values, "salt": st.text(max_size=4) | json_values,
    "keys": packed_ints | st.lists(st.integers(-3, 50), max_size=4) | json_values,
    "lengths": packed_ints | st.lists(st.integers(-3, 5), max_size=4) | json_values,
    "tokens": st.lists(st.integers(-3, 600), max_size=8) | json_values | packed_ints
    | st.binary(max_size=24).map(lambda b: base64.b64encode(b).decode()),
    "spans": st.lists(st.fixed_dictionaries({}, optional={
        "key": st.integers(-3, 50) | json_values, "start": st.integers(-3, 50) | json_values,
        "num_tokens": st.integers(-3, 50) | json_values,
        "pages": st.lists(st.integers(-3, 50), max_size=4) | json_values}) | json_values,
        max_size=3) | json_values,
    "mac": st.text(max_size=4) | json_values,
})


@settings(max_examples=4000, deadline=None)
@given(st.one_of(json_values, plan_like))
def test_parser_raises_only_plan_error(raw):
    try:
        plan = from_params({"inferscale": raw})
    except PlanError:
        return
    assert isinstance(plan, InjectionPlan | SavePlan)
    if isinstance(plan, SavePlan):  # nothing random is ever authentic
        assert not plan.verify(SECRET, list(range(plan.end)))
    else:
        prompt = list(range(plan.num_tokens + 1))
        assert InjectionPlan.bound({"inferscale": raw}, prompt, SECRET) is None


@pytest.mark.parametrize("num_ids", [1, 2, 3, 6, 100])
def test_bound_checks_mac_and_prompt_in_one_pass(num_ids):
    """The scheduler's usual path: the MAC computed over the prompt's ids. It accepts exactly
    the prompt the plan was made for (and any continuation of it), and yields the same plan."""
    ids = tuple(range(7, 7 + num_ids))
    plan = InjectionPlan.from_segments("alice", (Segment(3, 0, ids),), "salt").signed(SECRET)
    params = plan.to_params()
    prompt = [*ids, 42]
    bound = InjectionPlan.bound(params, prompt, SECRET)
    assert bound == plan and bound.wire == plan.wire
    assert InjectionPlan.bound(params, list(ids), SECRET) == plan  # the length rule is the caller's
    other = [*ids[:-1], ids[-1] + 1, 42]
    assert InjectionPlan.bound(params, other, SECRET) is None and not plan.matches(other)
    assert InjectionPlan.bound(params, list(ids[:-1]), SECRET) is None
    assert InjectionPlan.bound(params, prompt, b"x" * 32) is None
    for field, value in (("salt", "salt2"), ("user", "mallory"), ("mac", "0" * 32),
                         ("keys", packed("q", 4)), ("lengths", packed("i", num_ids + 1)),
                         ("v", PLAN_VERSION - 1), ("kind", "save")):
        forged = {"inferscale": {**params["inferscale"], field: value}}
        assert InjectionPlan.bound(forged, prompt, SECRET) is None, field
    last = ids[-1]  # ids outside int32, among them two that truncate to the plan's own
    for not_an_id in (last + 2**32, last - 2**32, 2**40, -(2**31) - 1, float(last), str(last),
                      None):  # no match, no error
        assert InjectionPlan.bound(params, [*ids[:-1], not_an_id, 42], SECRET) is None
    assert InjectionPlan.bound(None, prompt, SECRET) is None
    assert InjectionPlan.bound({"inferscale": "x"}, prompt, SECRET) is None
    assert InjectionPlan.bound(SavePlan.one("alice", 1, 0, 2, [0]).to_params(), prompt,
                               SECRET) is None
