"""Property-based tests of Memory's public API on the real engine (tiny Qwen2 fixture).

Arbitrary arguments (junk types, bytes, lone surrogates, blanks, over-long texts, other users'
ids) either succeed with the documented result or raise an InferScaleError subclass, and a
refused call changes nothing. A state machine checks random add / update / delete / reset /
search / generate sequences (real KV encoding and injection) against a dict model, and random
corruptions of a valid plan's kv_transfer_params are never injected while the engine keeps
serving. Cheap cases run by the thousand (facts registered lazily: no vLLM call), engine-bound
ones by the dozen. With tests/engine/test_plan.py's parser test (4,000) the total exceeds 10,000.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from inferscale_engine.checks import has_visible
from inferscale_engine.errors import (
    FactNotFoundError,
    HandleError,
    InferScaleError,
    InvalidUserIdError,
)
from inferscale_engine.facts import MemoryHandle
from inferscale_engine.memory import Memory
from inferscale_engine.memory.store.fact_store import FactStore
from inferscale_engine.runtime.generation import from_output as _generation
from tests.conftest import FACTS, greedy, running_engine
from tests.engine.memory.memory_support import HashEmbedder

pytestmark = pytest.mark.vllm

USERS = ["alice", "bob", "carol"]
JUNK = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.binary(max_size=6),
                 st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2),
                                                                      st.integers(), max_size=2))
SURROGATES = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1,
                     max_size=2)
TEXT = st.one_of(st.text(max_size=30), st.sampled_from(FACTS), st.text(" \t\n\x0b\x1c", max_size=4),
                 st.builds(str.__add__, st.text(max_size=8), SURROGATES), st.just("many " * 300))
USER_ID = st.one_of(st.sampled_from(USERS), st.text(max_size=6), SURROGATES, JUNK)
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
                    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(
                        st.text(max_size=3), inner, max_size=2), max_leaves=4)
METADATA = st.one_of(st.none(), st.dictionaries(st.text(max_size=12), JSON, max_size=3), JUNK)
SESSION = st.one_of(st.none(), st.sampled_from(["s1", "s2"]), st.text(max_size=3), JUNK)
MESSAGE = st.one_of(st.fixed_dictionaries({"role": st.sampled_from(
    ["user", "assistant", "system", "tool", "robot", ""]), "content": st.one_of(TEXT, JUNK)}),
    JUNK)


def cases(num: int) -> settings:
    """Settings of a property test with `num` generated cases (reproducible)."""
    return settings(max_examples=num, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))


class TestArbitraryArguments:
    """Thousands of cheap calls on one Memory whose facts get their KV lazily."""

    @pytest.fixture(scope="class")
    def memory(self, tiny_models):
        with running_engine(tiny_models["qwen2"]) as engine:
            store = FactStore(":memory:")
            with Memory(engine, store, HashEmbedder(), encode_on_add=False,
                        progress_bar=False) as mem:
                mem.add(user_id="alice", texts=FACTS[:3])
                mem.add(user_id="bob", texts=FACTS[3:])
                yield mem
            store.close()

    @staticmethod
    def snapshot(memory):
        facts = {u: [(f.fact_id, f.text) for f in memory.get_all(user_id=u)] for u in USERS}
        turns = {u: len(memory.turns(user_id=u, session_id="s1", limit=10**6)) for u in USERS}
        return facts, turns, memory._store.count()

    @cases(3000)
    @given(user_id=USER_ID, texts=st.one_of(st.lists(st.one_of(TEXT, TEXT, JUNK), max_size=4),
                                           TEXT, JUNK),
           metadata=METADATA, session_id=SESSION)
    def test_add_texts(self, memory, user_id, texts, metadata, session_id):
        before = memory._store.count()
        try:
            results = memory.add(user_id=user_id, texts=texts, metadata=metadata,
                                 session_id=session_id)
        except InferScaleError:
            assert memory._store.count() == before  # refused: nothing stored
            return
        assert len(results) == len(texts) and all(r.event in ("ADD", "DUPLICATE")
                                                   for r in results)
        added = [r.fact_id for r in results if r.event == "ADD"]
        assert memory._store.count() == before + len(added)
        owned = {f.fact_id for f in memory.get_all(user_id=user_id)}
        assert {r.fact_id for r in results} <= owned  # duplicates name the user's own facts

    @cases(1200)
    @given(user_id=st.one_of(st.sampled_from(USERS), USER_ID),
           messages=st.one_of(st.lists(MESSAGE, max_size=4), JUNK), session_id=SESSION)
    def test_add_messages(self, memory, user_id, messages, session_id):
        before = self.snapshot(memory)
        try:
            results = memory.add(user_id=user_id, messages=messages, session_id=session_id)
        except InferScaleError:
            assert self.snapshot(memory) == before
            return
        facts = [m["content"].strip() for m in messages
                 if m["role"] in ("user", "assistant") and has_visible(m["content"])]
        assert [r.text for r in results] == facts
        if session_id == "s1" and user_id in USERS:
            assert self.snapshot(memory)[1][user_id] == before[1][user_id] + len(messages)

    @cases(2500)
    @given(data=st.data(), verb=st.sampled_from(
        ["search", "get", "get_all", "delete", "update", "turns", "generate", "reset"]))
    def test_other_verbs(self, memory, data, verb):
        user_id = data.draw(USER_ID if verb != "reset" else st.sampled_from(["carol", "zed"]))
        existing = sorted({i for u in USERS for i, _ in self.snapshot(memory)[0][u]})
        # an existing fact by position: the strategy must not depend on the memory's state,
        # which earlier examples change (hypothesis replays draws: FlakyStrategyDefinition)
        fact_id = data.draw(st.one_of(
            st.integers(0, 10**6).map(lambda i: existing[i % len(existing)] if existing else 1),
            st.integers(-3, 10**6), JUNK))
        before = self.snapshot(memory)
        try:
            if verb == "search":
                k = data.draw(st.one_of(st.integers(-2, 8), JUNK))
                found = memory.search(user_id=user_id, query=data.draw(TEXT), k=k)
                assert found.handle.user_id == user_id and len(found.hits) <= k
                assert all(f.user_id == user_id for f in found.facts)
            elif verb == "get":
                assert memory.get(user_id=user_id, fact_id=fact_id).user_id == user_id
            elif verb == "get_all":
                assert all(f.user_id == user_id for f in memory.get_all(user_id=user_id))
            elif verb == "delete":
                ids = data.draw(st.one_of(st.lists(st.just(fact_id), max_size=2), JUNK))
                memory.delete(user_id=user_id, fact_ids=ids)
                assert not set(ids) & {f.fact_id for f in memory.get_all(user_id=user_id)}
            elif verb == "update":
                fact = memory.update(user_id=user_id, fact_id=fact_id, text=data.draw(TEXT))
                assert memory.get(user_id=user_id, fact_id=fact_id).text == fact.text
            elif verb == "turns":
                limit = data.draw(st.one_of(st.integers(-1, 5), JUNK))
                turns = memory.turns(user_id=user_id, session_id=data.draw(SESSION), limit=limit)
                assert all(t.user_id == user_id for t in turns)
            elif verb == "generate":  # only foreign or junk handles: refused before vLLM runs
                owner = data.draw(st.sampled_from(USERS))
                handle = data.draw(st.one_of(JUNK, st.just(MemoryHandle(owner, (fact_id,)))))
                if handle is None or user_id == owner:
                    return
                with pytest.raises((HandleError, InvalidUserIdError)):
                    memory.generate(user_id=user_id, query="hi", handle=handle)
            else:
                memory.reset(user_id=user_id)
                assert memory.get_all(user_id=user_id) == []
        except InferScaleError:
            assert self.snapshot(memory) == before  # a refused call changes nothing

    @cases(1000)
    @given(raw=st.one_of(st.fixed_dictionaries({}, optional={
        "user_id": st.one_of(st.text(max_size=4), JUNK),
        "fact_ids": st.one_of(st.lists(st.one_of(st.integers(), JUNK), max_size=3), JUNK)}),
        JUNK))
    def test_handle_from_dict(self, raw):
        try:
            handle = MemoryHandle.from_dict(raw)
        except HandleError:
            return
        assert MemoryHandle.from_dict(handle.to_dict()) == handle

    @cases(30)
    @given(data=st.data())
    def test_corrupted_kv_transfer_params_are_never_injected(self, memory, data):
        from vllm import TokensPrompt

        handle = memory.search(user_id="alice", query=FACTS[0], k=2).handle
        prompt, plan = memory.engine.prepare_request(handle, "What does Alice like?")
        params = copy.deepcopy(plan.to_params())
        raw = params["inferscale"]
        field = data.draw(st.sampled_from([*sorted(raw), "unknown-field"]))
        value = data.draw(st.one_of(st.sampled_from(mutations(raw.get(field))), JUNK,
                                    st.text(max_size=4), st.lists(st.integers(0, 600), max_size=3)))
        if raw.get(field, object()) == value:
            return
        raw[field] = value
        sampling = greedy(2)
        sampling.extra_args = {"kv_transfer_params": params}
        out = _generation(memory.engine.llm.generate(
            [TokensPrompt(prompt_token_ids=prompt.token_ids(), cache_salt=plan.cache_salt)],
            [sampling], use_tqdm=False)[0], "kv", 0, 0.0)
        if field == "unknown-field":  # changes neither the content nor the MAC
            assert out.plan_status in ("inject", "rejected")
        else:
            assert out.plan_status in ("rejected", "mismatch") and out.num_injected_tokens == 0
        assert memory.generate(user_id="alice", query=FACTS[0], k=2,
                               sampling=greedy(1)).plan_status == "inject"


def mutations(value: object) -> list[object]:
    """Small corruptions of one plan field's value (the subtle forgeries)."""
    if isinstance(value, str):
        return [value + "A", value[:-1], value[::-1], ""]
    if isinstance(value, list):
        return [value[:-1], [*value, 1], value[::-1], [v + 1 if isinstance(v, int) else v
                                                     for v in value]]
    if isinstance(value, int):
        return [value + 1, value - 1, str(value)]
    return [None]


class MemoryMachine(RuleBasedStateMachine):
    """Random verb sequences with real KV encoding and injection, against a dict model."""

    engine = None  # set by test_memory_matches_model

    def __init__(self) -> None:
        super().__init__()
        self.store = FactStore(":memory:")
        self.memory = Memory(self.engine, self.store, HashEmbedder(), progress_bar=False)
        self.model: dict[int, tuple[str, str]] = {}  # fact id -> user, text

    def ids_of(self, user_id: str) -> list[int]:
        return sorted(i for i, (u, _) in self.model.items() if u == user_id)

    @rule(user_id=st.sampled_from(USERS), texts=st.lists(st.one_of(
        st.sampled_from(FACTS), st.text(min_size=1, max_size=16).filter(has_visible)),
        min_size=1, max_size=3))
    def add(self, user_id, texts):
        for result in self.memory.add(user_id=user_id, texts=texts):
            if result.event == "ADD":
                assert result.fact_id not in self.model
                self.model[result.fact_id] = (user_id, result.text)
            else:
                assert self.model[result.fact_id][0] == user_id

    @precondition(lambda self: self.model)
    @rule(data=st.data(), user_id=st.sampled_from(USERS))
    def delete(self, data, user_id):
        ids = data.draw(st.lists(st.sampled_from(sorted(self.model)), min_size=1, max_size=2))
        if all(self.model[i][0] == user_id for i in ids):
            self.memory.delete(user_id=user_id, fact_ids=ids)
            for fact_id in ids:
                self.model.pop(fact_id, None)
        else:
            with pytest.raises(FactNotFoundError):
                self.memory.delete(user_id=user_id, fact_ids=ids)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), text=st.sampled_from(FACTS))
    def update(self, data, text):
        fact_id = data.draw(st.sampled_from(sorted(self.model)))
        user_id = self.model[fact_id][0]
        assert self.memory.update(user_id=user_id, fact_id=fact_id, text=text).text == text
        self.model[fact_id] = (user_id, text)

    @rule(user_id=st.sampled_from(USERS))
    def reset(self, user_id):
        assert self.memory.reset(user_id=user_id) == len(self.ids_of(user_id))
        self.model = {i: v for i, v in self.model.items() if v[0] != user_id}

    @rule(user_id=st.sampled_from(USERS), query=st.sampled_from(FACTS), k=st.integers(1, 4))
    def generate(self, user_id, query, k):
        found = self.memory.search(user_id=user_id, query=query, k=k)
        assert list(found.handle.fact_ids) == [f.fact_id for f in found.facts]
        assert set(found.handle.fact_ids) <= set(self.ids_of(user_id))
        out = self.memory.generate(user_id=user_id, query=query, k=k, sampling=greedy(1))
        assert out.plan_status == "inject"  # the preamble at least

    @invariant()
    def matches_model(self):
        for user_id in USERS:
            facts = self.memory.get_all(user_id=user_id)
            assert [(f.fact_id, f.text) for f in facts] == [
                (i, self.model[i][1]) for i in self.ids_of(user_id)]
        assert self.memory.stats().num_indexed == len(self.model)

    def teardown(self) -> None:
        self.memory.close()  # the engine forgets this example's facts
        self.store.close()


def test_memory_matches_model(tiny_models):
    with running_engine(tiny_models["qwen2"]) as engine:
        MemoryMachine.engine = engine
        run_state_machine_as_test(MemoryMachine, settings=settings(
            cases(30), stateful_step_count=8))
