"""The kv_transfer_params format: round trip, authentication, strict parsing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferscale_engine.errors import PlanError
from inferscale_engine.plan import InjectionPlan, SavePlan, Segment, from_params

SECRET = b"k" * 32


def make_plan() -> InjectionPlan:
    segments = (Segment(1, 0, (5, 6, 7)), Segment(9, 3, (8, 9)), Segment(4, 5, (1,)))
    return InjectionPlan.from_segments("alice", segments, "salt").signed(SECRET)


def test_round_trip_and_mac():
    plan = make_plan()
    parsed = from_params(plan.to_params())
    assert parsed == plan and parsed.verify(SECRET) and parsed.num_tokens == 6
    assert parsed.segments[1] == Segment(9, 3, (8, 9)) and parsed.starts == [0, 3, 5]
    assert parsed.matches([5, 6, 7, 8, 9, 1, 42]) and not parsed.matches([5, 6, 7, 8, 9, 2, 42])
    prompt = list(range(100, 110)) + [1, 2, 3]
    save = SavePlan("bob", 3, 10, 3, (0, 1)).signed(SECRET, prompt)
    assert from_params(save.to_params()) == save and save.verify(SECRET, prompt)


def test_save_mac_covers_the_whole_prompt():
    prompt = list(range(100, 110)) + [1, 2, 3]
    save = SavePlan("bob", 3, 10, 3, (0, 1)).signed(SECRET, prompt)
    other_prefix = [7] * 10 + [1, 2, 3]
    assert not save.verify(SECRET, other_prefix)
    assert not save.verify(SECRET, prompt[:-1]) and not save.verify(SECRET, prompt + [4])
    assert not save.verify(b"x" * 32, prompt)
    for field, value in [("user", "mallory"), ("key", 4), ("start", 9), ("num_tokens", 2),
                         ("pages", [0, 2]), ("key_scale", [0.5])]:
        params = save.to_params()
        params["inferscale"][field] = value
        assert not from_params(params).verify(SECRET, prompt), field
    with pytest.raises(PlanError, match="save prompt has 12 tokens"):
        SavePlan("bob", 3, 10, 3, (0, 1)).signed(SECRET, prompt[:-1])


@pytest.mark.parametrize("field,value", [("user", "mallory"), ("keys", [1, 9, 5]),
                                         ("salt", "other"), ("lengths", [2, 3, 1]),
                                         ("tokens", "BQAAAAYAAAAHAAAACAAAAAkAAAACAAAA")])
def test_tampering_breaks_the_mac(field, value):
    params = make_plan().to_params()
    params["inferscale"][field] = value
    assert not from_params(params).verify(SECRET)
    assert not make_plan().verify(b"x" * 32)


def test_not_ours():
    assert from_params(None) is None and from_params({"other_connector": 1}) is None


@pytest.mark.parametrize("raw", [
    "str", {"v": 1}, {"v": 3, "kind": "inject"},
    {"v": 3, "kind": "inject", "user": "u", "salt": "s", "keys": [1], "lengths": [2],
     "tokens": "AQAAAA==", "mac": ""},  # lengths do not match the tokens
    {"v": 3, "kind": "inject", "user": "u", "salt": "s", "keys": [1, 2], "lengths": [1],
     "tokens": "AQAAAA==", "mac": ""},
    {"v": 3, "kind": "inject", "user": "u", "salt": "s", "keys": [1], "lengths": [1],
     "tokens": "not base64!", "mac": ""},
    {"v": 3, "kind": "inject", "user": "u", "salt": "s", "keys": [1], "lengths": [1],
     "tokens": [1], "mac": ""},
    {"v": 3, "kind": "save", "user": "u", "key": -1, "start": 0, "num_tokens": 1, "pages": [0],
     "mac": ""},
    {"v": 3, "kind": "save", "user": "u", "key": 1, "start": 0, "num_tokens": 0, "pages": [0],
     "mac": ""},
    {"v": 3, "kind": "save", "user": "u", "key": 1, "start": 0, "num_tokens": 1, "pages": [],
     "mac": ""},
    {"v": 3, "kind": "save", "user": "u", "key": True, "start": 0, "num_tokens": 1,
     "pages": [1], "mac": ""},
    {"v": 2, "kind": "save", "user": "u", "key": 1, "start": 0, "tokens": [1], "pages": [0],
     "mac": ""},  # the version before saves were bound to their whole prompt
])
def test_malformed_params_raise_plan_error(raw):
    with pytest.raises(PlanError):
        from_params({"inferscale": raw})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.text(max_size=5)
    | st.floats(allow_nan=False),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6),
                                                                       children, max_size=4),
    max_leaves=20,
)
plan_like = st.fixed_dictionaries({}, optional={
    "v": st.sampled_from([3, 3, 3, 2, "3", None]),
    "kind": st.sampled_from(["inject", "save", "x", 3]),
    "user": st.text(max_size=4) | json_values, "salt": st.text(max_size=4) | json_values,
    "keys": st.lists(st.integers(-3, 50), max_size=4) | json_values,
    "lengths": st.lists(st.integers(-3, 5), max_size=4) | json_values,
    "tokens": st.lists(st.integers(-3, 600), max_size=8) | json_values
    | st.binary(max_size=24).map(lambda b: __import__("base64").b64encode(b).decode()),
    "key": st.integers(-3, 50) | json_values, "start": st.integers(-3, 50) | json_values,
    "num_tokens": st.integers(-3, 50) | json_values,
    "pages": st.lists(st.integers(-3, 50), max_size=4) | json_values,
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
        assert not plan.verify(SECRET)
