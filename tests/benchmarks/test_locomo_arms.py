"""The arm table: names, kinds, layouts, run order and how a request is built."""

from __future__ import annotations

import pytest

from benchmarks.locomo_arms import (
    DEFAULT_ARMS,
    Arm,
    arm_request,
    get_arm,
    parse_arms,
    reference_text_arm,
)
from inferscale_engine.prompting.layout import Layout


def test_names_spell_the_setting():
    assert [get_arm(n).name for n in DEFAULT_ARMS] == list(DEFAULT_ARMS)
    assert get_arm("kv-w48") == Arm("kv-w48", "kv", "system", 48, Layout())
    assert get_arm("kv-w64").engine_kwargs() == {"mode": "kv", "layout": Layout()}
    assert get_arm("text").engine_kwargs() == {"mode": "text", "layout": Layout()}
    user = get_arm("kv-w256-user4")
    assert (user.window, user.layout_name) == (256, "user4")
    assert user.layout == Layout(repair_facts=4, repair_placement="user")
    assert get_arm("text-end2").layout == Layout(repair_facts=2)
    assert get_arm("kv-w64-also4").layout == Layout(repair_facts=4, repair_also_inject=True)
    runs = get_arm("kv-w256r512-a0.9-user2")
    assert (runs.window, runs.run_tokens, runs.key_scale, runs.layout_name) == (
        256, 512, 0.9, "user2")
    assert runs.describe()["run_tokens"] == 512 and get_arm("kv-w64").run_tokens == 0
    similar = get_arm("kv-s256-user2")
    assert (similar.window, similar.context, similar.run_tokens) == (256, "similar", 0)
    assert similar.describe()["context"] == "similar" and "context" not in runs.describe()
    for bad in ("kv-64", "text-also4", "kv-w64-user0", "kv-w64-side4", "kv-w64r0", "textr5",
                "kv-s256r512", "kv-x64"):
        with pytest.raises(ValueError):
            get_arm(bad)
    with pytest.raises(ValueError):
        Arm("bad", "kv")  # kv needs a window
    with pytest.raises(ValueError):
        Arm("bad", "text", window=64)


def test_run_order_puts_text_arms_first():
    assert [a.name for a in parse_arms("kv-w64,text-user4,kv-w0,text")] == [
        "text-user4", "text", "kv-w64", "kv-w0"]
    with pytest.raises(ValueError):
        parse_arms("text,text")


def test_reference_text_arm_is_the_same_layout():
    arms = parse_arms("text,text-user4,text-end4,kv-w64,kv-w64-user4,kv-w64-also4")
    assert reference_text_arm(get_arm("kv-w64"), arms).name == "text"
    assert reference_text_arm(get_arm("kv-w64-user4"), arms).name == "text-user4"
    assert reference_text_arm(get_arm("kv-w64-also4"), arms).name == "text-end4"
    assert reference_text_arm(get_arm("kv-w64-user4"), parse_arms("text,kv-w64-user4")) is None


def test_requests_are_chronological_with_their_scores():
    ids = {p: 100 + p for p in range(10)}
    ranked, scores = [7, 2, 9, 0], [0.9, 0.8, 0.7, 0.6]  # best first
    (fact_ids, fact_scores), chat = arm_request(get_arm("kv-w64-user2"), ranked, scores, "Q?",
                                                ids)
    assert fact_ids == [100, 102, 107, 109] and fact_scores == [0.6, 0.8, 0.9, 0.7]
    assert chat == [{"role": "user", "content": "Q?"}]
