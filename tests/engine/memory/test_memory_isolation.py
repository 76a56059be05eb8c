"""Isolation: 100 users, >= 2,000 randomized interleaved add / search / generate calls on the real
engine. No search result, handle or injection plan ever names another user's fact, and forged
handles and forged kv_transfer_params are refused: by Memory and the engine (handle owner), by
the scheduler-side connector (plan MAC) and by the worker-side connector (slab entry owner)."""

from __future__ import annotations

import copy
import dataclasses
import random
import time
from collections import Counter, defaultdict

import pytest

from inferscale_engine.errors import HandleError
from inferscale_engine.facts import MemoryHandle
from inferscale_engine.memory import Memory
from inferscale_engine.runtime.generation import from_output as _generation
from tests.conftest import greedy, plain_prefill, running_engine
from tests.engine.memory.memory_support import SHORT_SYSTEM_PROMPT, HashEmbedder
from tests.tiny_model import corpus_sentences

pytestmark = pytest.mark.vllm

NUM_USERS = 100
NUM_CALLS = 2_000
USERS = [f"user-{i:03d}" for i in range(NUM_USERS)]
POOL = sorted(set(corpus_sentences(400, seed=7)))[:150]
"""Facts are drawn from one shared pool, so many users hold identical texts: a plan that mixed
users up would still type-check and tokenize; only ownership tells them apart."""


class PlanAuditor:
    """Wraps RequestPlanner.plan: checks every plan the engine builds against the owners."""

    def __init__(self, engine, owned: dict[str, set[int]]) -> None:
        self.engine, self.owned, self.num_plans = engine, owned, 0
        self.salt_owner: dict[str, str] = {}
        self._plan = engine._planner.plan

    def __call__(self, handle, prompt, records, *args, **kwargs):
        plan = self._plan(handle, prompt, records, *args, **kwargs)
        owner_of_key = {r.slab_key: r.fact.user_id for r in self.engine._facts.values()
                        if r.slab_key is not None}
        assert plan.user_id == handle.user_id
        # vLLM's prefix cache is keyed by cache_salt: never shared between two users
        assert self.salt_owner.setdefault(plan.cache_salt, plan.user_id) == plan.user_id
        assert len(plan.segments) == len(records) + 1  # preamble + one segment per fact
        for segment, record in zip(plan.segments[1:], records, strict=True):
            assert record.fact.user_id == plan.user_id
            assert record.fact.fact_id in self.owned[plan.user_id]
            assert owner_of_key[segment.slab_key] == plan.user_id
            assert segment.token_ids == record.fact.token_ids
        self.num_plans += 1
        return plan


def send_params(engine, token_ids, params, salt):
    from vllm import TokensPrompt

    sampling = greedy(1, logprobs=None)
    sampling.extra_args = {"kv_transfer_params": params}
    out = engine.llm.generate([TokensPrompt(prompt_token_ids=token_ids, cache_salt=salt)],
                              [sampling], use_tqdm=False)[0]
    return _generation(out, "kv", len(token_ids), 0.0)


def forge(rng, memory, engine, owned, calls: Counter) -> None:
    """One forgery attempt of a random kind; each must be refused."""
    victim, thief = rng.sample([u for u in USERS if owned[u]], 2)
    stolen = tuple(rng.sample(sorted(owned[victim]), min(2, len(owned[victim]))))
    kind = rng.choice(["memory_handle", "engine_handle", "mixed_handle", "params", "params",
                       "insider_plan"])
    if kind == "memory_handle":  # A's handle used for B through Memory
        with pytest.raises(HandleError, match="belongs to"):
            memory.generate(user_id=thief, query="hi", handle=MemoryHandle(victim, stolen))
    elif kind == "engine_handle":  # A's fact ids relabelled as B's
        with pytest.raises(HandleError, match="does not belong"):
            engine.generate(MemoryHandle(thief, stolen), "hi", greedy(1, logprobs=None))
    elif kind == "mixed_handle":  # one of B's own facts plus one of A's
        mixed = (rng.choice(sorted(owned[thief])), stolen[0])
        with pytest.raises(HandleError):
            memory.generate(user_id=thief, query="hi", handle=MemoryHandle(thief, mixed))
    elif kind == "params":  # a valid plan of A re-labelled for B: the MAC check refuses it
        prompt, plan = engine.prepare_request(MemoryHandle(victim, stolen), "hi")
        params = copy.deepcopy(plan.to_params())
        params["inferscale"]["user"] = thief
        out = send_params(engine, prompt.token_ids(), params, plan.cache_salt)
        assert out.plan_status == "rejected" and out.num_injected_tokens == 0
    else:  # B's plan naming A's slab entries, signed with the engine's own secret (as if the
        # engine's check had a bug): the worker-side connector checks each entry's owner,
        # injects nothing and vLLM recomputes those tokens
        prompt, plan = engine.prepare_request(MemoryHandle(victim, stolen), "hi")
        insider = dataclasses.replace(plan, user_id=thief).signed(engine._secret)
        errors = engine.stats().workers[0].get("load_errors", 0)
        out = send_params(engine, prompt.token_ids(), insider.to_params(), plan.cache_salt)
        assert engine.stats().workers[0].get("load_errors", 0) == errors + 1
        assert out.token_ids == plain_prefill(engine, prompt.token_ids(),
                                              greedy(1, logprobs=None)).token_ids
    calls[f"forged_{kind}"] += 1


def test_one_hundred_users_never_see_each_others_facts(tiny_models, tmp_path, monkeypatch):
    rng = random.Random(2024)
    owned: dict[str, set[int]] = defaultdict(set)
    calls: Counter[str] = Counter()
    start = time.perf_counter()
    with running_engine(tiny_models["qwen2"], system_prompt=SHORT_SYSTEM_PROMPT,
                        slab_capacity_bytes=64 * 2**20) as engine:
        auditor = PlanAuditor(engine, owned)
        monkeypatch.setattr(engine._planner, "plan", auditor)
        memory = Memory(engine, tmp_path / "iso.db", HashEmbedder(), progress_bar=False)
        schedule = [("add", user) for user in USERS]  # every user starts with some facts
        schedule += [(rng.choices(["add", "search", "generate"], [1, 6, 2])[0], rng.choice(USERS))
                     for _ in range(NUM_CALLS - NUM_USERS)]
        seconds: Counter[str] = Counter()
        for step, (verb, user) in enumerate(schedule):
            began = time.perf_counter()
            if verb == "add":
                results = memory.add(user_id=user, texts=rng.sample(POOL, rng.randint(1, 4)))
                for result in results:
                    if result.event == "ADD":
                        assert result.fact_id not in {i for ids in owned.values() for i in ids}
                        owned[user].add(result.fact_id)
                    else:
                        assert result.fact_id in owned[user], "duplicate of another user's fact"
            elif verb == "search":
                k = rng.randint(1, 6)
                found = memory.search(user_id=user, query=rng.choice(POOL), k=k)
                assert found.handle.user_id == user
                assert len(found.hits) == min(k, len(owned[user]))
                assert all(f.user_id == user and f.fact_id in owned[user] for f in found.facts)
            else:
                out = memory.generate(user_id=user, query=rng.choice(POOL), k=rng.randint(1, 4),
                                      sampling=greedy(1, logprobs=None))
                assert out.plan_status == "inject", out
            calls[verb] += 1
            seconds[verb] += time.perf_counter() - began
            if step % 20 == 19:
                forge(rng, memory, engine, owned, calls)
        stats = memory.stats()
        worker = stats.engine.workers[0]
        memory.close()
    elapsed = time.perf_counter() - start
    num_forged = sum(v for k, v in calls.items() if k.startswith("forged"))
    print(f"\n[isolation] {NUM_USERS} users, {sum(calls[v] for v in ('add', 'search', 'generate'))}"
          f" calls (add {calls['add']}, search {calls['search']}, generate {calls['generate']}),"
          f" {stats.num_facts} facts, {auditor.num_plans} plans audited, {num_forged} forgeries "
          f"refused ({dict((k, v) for k, v in calls.items() if k.startswith('forged'))}); "
          f"evicted {stats.engine.counters.get('evicted_facts', 0)}, re-encoded "
          f"{stats.engine.counters.get('reencoded_facts', 0)}; {elapsed:.0f} s "
          f"({', '.join(f'{v} {s:.0f} s' for v, s in seconds.items())})")
    assert calls["add"] + calls["search"] + calls["generate"] == NUM_CALLS
    assert len([u for u in USERS if owned[u]]) == NUM_USERS
    assert auditor.num_plans >= calls["generate"]
    assert num_forged >= NUM_CALLS // 20
    # The worker refused exactly the insider plans: honest plans never named a foreign entry.
    assert worker.get("load_errors", 0) == calls["forged_insider_plan"] > 0
    assert stats.engine.counters.get("foreign_handles", 0) >= calls["forged_engine_handle"]
