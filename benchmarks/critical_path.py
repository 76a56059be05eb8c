"""The KV-injection read path, step by step, on the CPU: what a request pays on top of a prompt.

Times each step of one kv-mode request in isolation, with the objects the engine and the
connector really build (no vLLM engine, no GPU kernel): a prompt of a preamble, k facts of
~--fact-tokens tokens and a --question-tokens question, as in benchmarks/ttft.py.

  app        prompt        PromptBuilder.build + token_ids (text and resident modes pay it too)
             plan          RequestPlanner.plan: preamble key, segments, cache_salt, sign
             plan_local    the same unsigned (the in-process handoff's plan, handoff.py)
             to_params     InjectionPlan.to_params (the kv_transfer_params)
             prepare       RequestPlanner.prepare end to end (prompt + plan + params)
  vLLM       params_copy   SamplingParams.clone of the request's params (vLLM deep-copies them)
             pickle_params pickle round trip of the kv_transfer_params (MP=1 sends them)
  scheduler  from_params / bind_mac (InjectionPlan.bound: the MAC over the prompt's ids), and
             check (InferScaleScheduler._verify: the signed plan bound to the prompt)
             check_local   the plan put by reference and _verify taking it (handoff.py),
                           the prompt's ids compared with the plan's
             check_vouched the same with the prompt list the engine vouched for (its default:
                           the prompt recognized by identity)
             meta          update_state_after_alloc + build_connector_meta (the LoadSpec)
             pickle_meta   pickle round trip of the step metadata (MP=1, every step)
  worker     fill          the load's index alone (_write_index)
             load          InferScaleWorker.start_load with a no-op kernel: the index math
             stepN         the same for one step of --batch loads (a prefill of N requests)
  sum        kv_only       plan + to_params + params_copy + check + meta + load
             kv_only_local plan_local + params_copy + check_local + meta + load
             kv_only_vouched  the same with check_vouched (MP=0 default)

Median microseconds over --repeats calls per step, steps interleaved in rounds so that load
from other processes spreads evenly. Writes one JSON record. Asserts nothing about speed.

--cold flushes the CPU caches before every timed call (it sweeps a 64 MiB buffer): inside a
serving engine each step runs once per request between vLLM's own work, so its code and data
are cold; measured in-process, the first plan after a generate() took ~5x the warm median.

  python benchmarks/critical_path.py --ks 10,50,100 --repeats 2000
  python benchmarks/critical_path.py --profile          # cProfile top entries at the largest k
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pickle
import pstats
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import environment, synthetic_texts, write_tagged  # noqa: E402

SUMMED = ("plan", "to_params", "params_copy", "check", "meta", "load")
SUMMED_LOCAL = ("plan_local", "params_copy", "check_local", "meta", "load")
SUMMED_VOUCHED = ("plan_local", "params_copy", "check_vouched", "meta", "load")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ks", default="10,50,100")
    parser.add_argument("--fact-tokens", type=int, default=30)
    parser.add_argument("--question-tokens", type=int, default=48)
    parser.add_argument("--block-size", type=int, default=16, help="vLLM block size (GPU: 16)")
    parser.add_argument("--repeats", type=int, default=2000, help="timed calls per step and k")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile every step at the largest k; print the top entries")
    parser.add_argument("--cold", action="store_true",
                        help="flush the CPU caches before every timed call (as in a server)")
    parser.add_argument("--batch", type=int, default=64,
                        help="also time the worker's index math for one step of this many "
                             "loads; 0: off")
    parser.add_argument("--tag", default="")
    parser.add_argument("--no-record", action="store_true", help="print only, write no JSON")
    return parser.parse_args(argv)


class _Writer:
    """FactWriter stand-in: the preamble gets slab pages without a vLLM save request."""

    def __init__(self, residency: Any) -> None:
        self._residency = residency

    def save_preamble(self, owner: str, preamble: Any, pinned: Any) -> tuple[int, tuple]:
        pages, _ = self._residency.allocate(len(preamble), set(), False)
        return self._residency.next_slab_key(), pages


class _NoKernel:
    """PagedKV stand-in: the worker's index math runs, the copy does not."""

    num_layers = 1

    def inject_(self, *args: Any) -> None:
        return


def build(args: argparse.Namespace, k_max: int) -> SimpleNamespace:
    """Engine-side and connector-side objects, as Engine and vLLM build them."""
    from transformers import AutoConfig, AutoTokenizer
    from vllm import SamplingParams

    from inferscale_engine.config import SECRET_ENV, ConnectorConfig, EngineConfig
    from inferscale_engine.connector.scheduler import InferScaleScheduler
    from inferscale_engine.connector.slab import KVSlab
    from inferscale_engine.connector.worker import InferScaleWorker
    from inferscale_engine.facts import Fact, FactId
    from inferscale_engine.prompting.prompt import PromptBuilder
    from inferscale_engine.runtime.preambles import PreambleCache
    from inferscale_engine.runtime.read_path import RequestPlanner
    from inferscale_engine.runtime.residency import FactRecord, Residency, SlabAllocator
    from tests.tiny_model import tiny_model_path

    secret = os.urandom(32)
    os.environ[SECRET_ENV] = secret.hex()
    model = tiny_model_path()
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    config = EngineConfig(model=str(model), max_model_len=8192, context_window_tokens=0,
                          max_fact_tokens=128)
    prompts = PromptBuilder(tokenizer, config.system_prompt)
    texts = synthetic_texts(tokenizer, k_max, args.fact_tokens, seed=0)
    page_tokens = config.slab_page_tokens
    residency = Residency(SlabAllocator(64 * k_max + 64, page_tokens))
    counters: Counter[str] = Counter()
    writer = _Writer(residency)
    preambles = PreambleCache(writer, residency, None, counters,  # type: ignore[arg-type]
                              prompts.preamble())
    facts: dict = {}
    records = []
    for i, text in enumerate(texts, start=1):
        record = FactRecord(Fact(FactId(i), "u1", text, prompts.fact_ids(text)), ())
        pages, _ = residency.allocate(len(record.fact.token_ids), set(), False)
        residency.admit(record, residency.next_slab_key(), pages)
        facts[record.fact.fact_id] = record
        records.append(record)
    planner = RequestPlanner(config, prompts, facts, residency, writer,  # type: ignore[arg-type]
                             preambles, secret, counters)
    question = synthetic_texts(tokenizer, 1, args.question_tokens, seed=1, fmt="{text}")[0]

    connector = ConnectorConfig(slab_pages=residency._allocator.num_pages,
                                page_tokens=page_tokens, max_positions=8192)
    scheduler = InferScaleScheduler(None, connector)  # type: ignore[arg-type]
    hf_config = AutoConfig.from_pretrained(str(tiny_model_path()))
    vllm_config = SimpleNamespace(
        model_config=SimpleNamespace(hf_config=hf_config, max_model_len=8192,
                                     get_num_kv_heads=lambda parallel: 1,
                                     get_head_size=lambda: 8),
        parallel_config=None,
        cache_config=SimpleNamespace(block_size=args.block_size, cache_dtype="auto"))
    worker = InferScaleWorker(vllm_config, connector)  # type: ignore[arg-type]
    import torch

    worker.slab = KVSlab(1, connector.slab_pages, page_tokens, 1, 8, torch.float32,
                         torch.device("cpu"))
    worker.paged = _NoKernel()  # type: ignore[assignment]
    worker._rope = SimpleNamespace()  # type: ignore[assignment]
    return SimpleNamespace(planner=planner, prompts=prompts, preambles=preambles,
                           records=records, question=question, scheduler=scheduler,
                           worker=worker, sampling=SamplingParams(max_tokens=1, temperature=0.0),
                           config=config)


def steps_for(env: SimpleNamespace, k: int, block_size: int, seed: int
              ) -> tuple[dict[str, Callable[[], object]], int, Any]:
    """One closure per step for a request with k facts; its prompt length and step metadata."""
    import numpy as np

    from inferscale_engine.connector.metadata import InferScaleMetadata
    from inferscale_engine.connector.slab import SlabEntry
    from inferscale_engine.facts import MemoryHandle
    from inferscale_engine.prompting.layout import Layout
    from inferscale_engine.protocol.handoff import PlanHandoff
    from inferscale_engine.protocol.plan import SYSTEM_OWNER, InjectionPlan, from_params

    rng = random.Random(seed)
    records = rng.sample(env.records, k)
    handle = MemoryHandle("u1", tuple(r.fact.fact_id for r in records))
    messages = [{"role": "user", "content": env.question}]
    pinned = {r.fact.fact_id for r in records}
    planner, scheduler, worker, secret = env.planner, env.scheduler, env.worker, env.planner._secret

    prompt = planner.build(messages, records, [], Layout())
    ids = prompt.token_ids()
    plan = planner.plan(handle, prompt, records, pinned)
    env.preambles.end_batch()
    prepared = planner.prepare(handle, records, messages, env.sampling, "kv", pinned, Layout())
    params = prepared.params.clone().extra_args["kv_transfer_params"]
    assert isinstance(from_params(params), InjectionPlan)

    # Worker state: every segment resident (the preamble is the system's), encoded elsewhere.
    owners = {r.slab_key: ("u1", r.pages) for r in env.records}
    owners.update({key: (SYSTEM_OWNER, pages) for key, pages in env.preambles._entries.values()})
    for key, start, length in zip(plan.slab_keys, plan.starts, plan.lengths):
        if key not in worker.slab.entries:
            owner, pages = owners[key]
            worker.slab.entries[key] = SlabEntry(owner, worker.slab.rows_for(list(pages), length),
                                                 length, start + 7 * (key % 5))
    num_blocks = -(-len(ids) // block_size)
    block_ids = rng.sample(range(1, 4 * num_blocks + 64), num_blocks)
    rid = f"req-{k}-{seed}"
    request = SimpleNamespace(request_id=rid, kv_transfer_params=params,
                              prompt_token_ids=list(ids), cache_salt=plan.cache_salt)
    checked = scheduler._verify(request)
    assert checked.status == "inject", checked.reason
    num_external = plan.num_tokens

    def step_output() -> SimpleNamespace:
        new = SimpleNamespace(req_id=rid, block_ids=(block_ids,), num_computed_tokens=num_external)
        cached = SimpleNamespace(req_ids=[], new_block_ids=[], resumed_req_ids=set(),
                                 num_computed_tokens=[])
        return SimpleNamespace(num_scheduled_tokens={rid: len(ids) - num_external},
                               scheduled_new_reqs=[new], scheduled_cached_reqs=cached)

    output = step_output()

    def meta() -> InferScaleMetadata:
        scheduler.update_state_after_alloc(request, None, num_external)
        return scheduler.build_connector_meta(output)

    step_meta = meta()
    assert len(step_meta.loads) == 1
    first = step_meta.loads[0]
    host = np.empty((4, first.load_end - first.load_start), np.int64)
    scheduler._checked[rid] = checked  # update_state_after_alloc caches it; keep it there

    def plan_step() -> object:
        out = planner.plan(handle, prompt, records, pinned)
        env.preambles.end_batch()
        return out

    def plan_local_step() -> object:
        out = planner.plan(handle, prompt, records, pinned, signed=False)
        env.preambles.end_batch()
        return out

    courier = PlanHandoff(secret)
    unsigned = plan_local_step()

    def local_check(vouched: bool) -> Callable[[], object]:
        """The plan put by reference and _verify taking it; with the prompt list vouched for
        (the engine's default) or without (its ids compared with the plan's)."""
        ids = request.prompt_token_ids

        def check() -> object:
            ref_params = courier.put(unsigned, ids if vouched else None)[1]
            checked = scheduler._verify(SimpleNamespace(
                request_id=rid, prompt_token_ids=ids, kv_transfer_params=ref_params,
                cache_salt=plan.cache_salt))
            assert checked.status == "inject"
            return checked

        return check

    def prepare_step() -> object:
        out = planner.prepare(handle, records, messages, env.sampling, "kv", pinned, Layout())
        env.preambles.end_batch()
        return out

    parsed = from_params(params)
    assert isinstance(parsed, InjectionPlan)
    steps: dict[str, Callable[[], object]] = {
        "prompt": lambda: planner.build(messages, records, [], Layout()).token_ids(),
        "plan": plan_step,
        "plan_local": plan_local_step,
        "to_params": plan.to_params,
        "prepare": prepare_step,
        "params_copy": prepared.params.clone,
        "pickle_params": lambda: pickle.loads(pickle.dumps(params)),
        "from_params": lambda: from_params(params),
        "bind_mac": lambda: InjectionPlan.bound(params, request.prompt_token_ids, secret),
        "check": lambda: scheduler._verify(request),
        "check_local": local_check(vouched=False),
        "check_vouched": local_check(vouched=True),
        "meta": meta,
        "pickle_meta": lambda: pickle.loads(pickle.dumps(step_meta)),
        "fill": lambda: worker._write_index(step_meta.loads[0], host, 0),
        "load": lambda: worker.start_load(step_meta),
    }
    for fn in steps.values():  # every step runs cleanly before it is timed
        fn()
    assert worker.counters["load_errors"] == 0
    return steps, len(ids), step_meta


def step_of(env: SimpleNamespace, k: int, block_size: int, batch: int
            ) -> dict[str, Callable[[], object]]:
    """The worker's start_load for one engine step of `batch` loads (distinct fact sets and
    block tables), as vLLM hands it over when `batch` requests are scheduled together."""
    from inferscale_engine.connector.metadata import InferScaleMetadata

    loads = [steps_for(env, k, block_size, seed=k * 1000 + i)[2].loads[0] for i in range(batch)]
    meta = InferScaleMetadata(loads=loads)
    return {f"step{batch}": lambda: env.worker.start_load(meta)}


def time_steps(steps: dict[str, Callable[[], object]], repeats: int, rounds: int,
               cold: bool = False) -> dict[str, dict[str, float]]:
    """Median / p10 / p90 microseconds of each step, rounds interleaved across steps."""
    import numpy as np

    samples: dict[str, list[int]] = {name: [] for name in steps}
    per_round = max(1, repeats // rounds)
    clock = time.perf_counter_ns
    sweep = np.ones(64 << 20, dtype=np.uint8) if cold else None
    for _ in range(rounds):
        for name, fn in steps.items():
            out = samples[name]
            for _ in range(per_round):
                if sweep is not None:  # evict this step's code and data from every cache level
                    sweep += 1
                start = clock()
                fn()
                out.append(clock() - start)
    result = {}
    for name, values in samples.items():
        values.sort()
        n = len(values)
        result[name] = {"median_us": statistics.median(values) / 1e3,
                        "p10_us": values[n // 10] / 1e3, "p90_us": values[(9 * n) // 10] / 1e3,
                        "n": n}
    for total, parts in (("kv_only", SUMMED), ("kv_only_local", SUMMED_LOCAL),
                         ("kv_only_vouched", SUMMED_VOUCHED)):
        if all(p in result for p in parts):
            result[total] = {"median_us": sum(result[p]["median_us"] for p in parts)}
    return result


def profile(steps: dict[str, Callable[[], object]], repeats: int, top: int = 30) -> str:
    """cProfile of every step `repeats` times; the top entries by own time."""
    profiler = cProfile.Profile()
    profiler.enable()
    for fn in steps.values():
        for _ in range(repeats):
            fn()
    profiler.disable()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(top)
    return stream.getvalue()


def print_table(results: dict[int, dict[str, dict[str, float]]]) -> None:
    ks = sorted(results)
    names = list(results[ks[0]])
    print(f"{'step (median us)':<16}" + "".join(f"{'k=' + str(k):>10}" for k in ks))
    for name in names:
        print(f"{name:<16}" + "".join(f"{results[k][name]['median_us']:>10.1f}" for k in ks))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    ks = [int(k) for k in args.ks.split(",")]
    env = build(args, max(ks))
    results: dict[int, dict[str, dict[str, float]]] = {}
    prompt_tokens: dict[int, int] = {}
    profiles = ""
    for k in ks:
        steps, prompt_tokens[k], _ = steps_for(env, k, args.block_size, seed=k)
        if args.batch:
            steps.update(step_of(env, k, args.block_size, args.batch))
        results[k] = time_steps(steps, args.repeats, args.rounds, args.cold)
        if args.profile and k == max(ks):
            profiles = profile(steps, max(1, args.repeats // 10))
    print_table(results)
    print("prompt tokens:", prompt_tokens)
    if profiles:
        print(profiles)
    record = {"benchmark": "critical_path", "config": vars(args), "environment": environment(),
              "num_prompt_tokens": prompt_tokens, "results": results, "profile_top": profiles}
    if not args.no_record:
        write_tagged("critical-path", args.tag, record)
    return record


if __name__ == "__main__":
    main()
