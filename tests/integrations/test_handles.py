"""Handle transport and tool-call text, without an engine."""

from __future__ import annotations

import pytest

from inferscale_engine.errors import HandleError
from inferscale_engine.facts import FactId, MemoryHandle
from inferscale_integrations.handles import (
    HANDLES_KEY,
    MARKER_RE,
    ChatTurn,
    HandleRegistry,
    is_handle_message,
    make_handle_message,
    merge_handles,
    prepare_chat,
    strip_markers,
)
from inferscale_integrations.tools import (
    tool_choice_name,
    with_tool_choice,
)

ALICE = MemoryHandle("alice", (FactId(3), FactId(1)))


def test_handle_message_carries_the_handle_twice():
    marker, extra = make_handle_message(ALICE)
    assert MARKER_RE.fullmatch(marker) and extra == {HANDLES_KEY: [ALICE.to_dict()]}
    assert strip_markers(f"before {marker} after") == ("before  after", [ALICE], 0)
    assert is_handle_message(marker, extra) and not is_handle_message("hi " + marker, extra)
    assert not is_handle_message(marker, {})


def test_markers_are_random_and_the_registry_is_bounded():
    registry = HandleRegistry(capacity=2)
    markers = [registry.marker(ALICE) for _ in range(3)]
    assert len(set(markers)) == 3
    ids = [MARKER_RE.fullmatch(m).group(1) for m in markers]
    assert registry.resolve(ids[0]) is None and registry.resolve(ids[2]) == ALICE
    assert strip_markers("[[inferscale:NOT-KNOWN-ID]] q") == (" q", [], 1)


def test_prepare_chat_collects_strips_drops_and_merges():
    marker, extra = make_handle_message(ALICE)
    turns = [ChatTurn("system", "Be brief."), ChatTurn("system", "Really."),
             ChatTurn("user", marker, extra[HANDLES_KEY]),
             ChatTurn("user", f"History: {marker}\nQ: hi"),
             ChatTurn("assistant", "")]
    prepared = prepare_chat(turns, MemoryHandle("alice", (FactId(7), FactId(3))))
    assert prepared.messages == [
        {"role": "system", "content": "Be brief.\n\nReally."},
        {"role": "user", "content": "History: \nQ: hi"},
        {"role": "assistant", "content": ""}]
    assert prepared.handle == MemoryHandle("alice", (FactId(7), FactId(3), FactId(1)))
    assert prepared.carriers == [2]


def test_handles_of_several_users_or_a_foreign_user_are_refused():
    bob = MemoryHandle("bob", (FactId(2),))
    with pytest.raises(HandleError, match="several users"):
        merge_handles([ALICE, bob])
    with pytest.raises(HandleError, match="serves user_id='bob'"):
        prepare_chat([ChatTurn("user", "q")], ALICE, user_id="bob")
    with pytest.raises(HandleError):
        prepare_chat([ChatTurn("user", "q")], [{"user_id": "alice"}])
    with pytest.raises(HandleError):
        prepare_chat([ChatTurn("user", "q")], 42)
    assert merge_handles([]) is None


def test_tool_choice_is_said_in_words():
    messages = with_tool_choice([{"role": "user", "content": "q"}], "any")
    assert messages[0]["role"] == "system" and "must call" in messages[0]["content"]
    named = with_tool_choice([{"role": "system", "content": "Be brief."}], "weather")
    assert named == [{"role": "system", "content": "Be brief.\n\nYou must call the function "
                                                   "'weather'."}]
    assert with_tool_choice([{"role": "user", "content": "q"}], "auto") == [
        {"role": "user", "content": "q"}]
    assert tool_choice_name({"type": "function", "function": {"name": "weather"}}) == "weather"
    assert tool_choice_name(True) == "any" and tool_choice_name(None) is None
