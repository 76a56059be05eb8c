"""Answering LoCoMo questions with the engine: retrieval, fact encoding, one batch per arm.

Per conversation: the questions' top-k facts are retrieved once (all-MiniLM-L6-v2 cosine), and
only those facts are registered: under '<conv>/text' without KV for the text arms, and under
'<conv>/wW' encoded with context window W for each kv arm's W (a fact's KV depends only on its
own context string, so encoding a subset changes nothing). Arms run in run order (text first);
a text answer found in the text-answer cache is not asked again. Every answer and every new
question is appended to the results JSONL as it is made (resumable per question and arm).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from benchmarks.common import open_text, resolve_model
from benchmarks.locomo_arms import Arm, arm_request
from benchmarks.locomo_cache import TextAnswerCache, text_cache_key
from benchmarks.locomo_data import CONTEXT_FACTS, Conversation, Question
from benchmarks.locomo_protocol import Selection

CATEGORY_HINTS = {2: " Use the dates of the memories to answer with an approximate date."}
"""Appended to the question (LoCoMo's own evaluation adds a date hint to category 2)."""


def sampling_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Every SamplingParams field the benchmark sets (greedy); part of the cache key."""
    return {"max_tokens": args.max_tokens, "temperature": 0.0, "logprobs": args.logprobs}


def gguf_sha256(model: str) -> str | None:
    """sha256 of the GGUF a --model alias is built from ('small', 'medium'), else None."""
    from inferscale_engine.model.small_model import MEDIUM_MODEL, SMALL_MODEL

    spec = {"small": SMALL_MODEL, "medium": MEDIUM_MODEL}.get(model)
    return spec.sha256 if spec else None


def model_identity(args: argparse.Namespace, folder: str) -> dict[str, Any]:
    """What fixes a text answer besides the prompt: weights, dtype, device, vLLM version."""
    import torch
    import vllm

    from benchmarks.common import environment

    if sha256 := gguf_sha256(args.model):
        weights = f"gguf-sha256:{sha256}"
    else:  # names, sizes and mtimes of the weight files, and the config itself
        digest = hashlib.sha256()
        for path in sorted(Path(folder).iterdir()):
            if path.suffix in (".safetensors", ".bin", ".pt") or path.name == "config.json":
                stat = path.stat()
                digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        digest.update((Path(folder) / "config.json").read_bytes())
        weights = f"files-sha256:{digest.hexdigest()}"
    device = (torch.cuda.get_device_name(0) if torch.cuda.is_available()
              else environment()["cpu"])
    return {"name": Path(folder).name, "weights": weights, "dtype": args.dtype,
            "device": device, "vllm": vllm.__version__}


def build_engine(args: argparse.Namespace, arms: Sequence[Arm]) -> Any:
    from inferscale_engine import Engine, EngineConfig

    model, _, load_format = resolve_model(args.model)
    windows = [a.window for a in arms if a.window is not None]
    config = EngineConfig(
        model=model, dtype=args.dtype, load_format=load_format, max_model_len=args.max_model_len,
        context_window_tokens=max(windows, default=0),
        context_run_tokens=max((a.run_tokens for a in arms), default=0),
        system_prompt=args.system_prompt, user_block_header=args.user_block_header,
        block_size=args.block_size, max_fact_tokens=args.max_fact_tokens,
        slab_capacity_bytes=args.slab_mib * 2**20, on_slab_full="error",
        kv_cache_memory_bytes=int(args.kv_cache_gib * 2**30),
        vllm_overrides={"max_logprobs": args.logprobs})
    return Engine(config)


NEIGHBOR_SHARE = 0.3
"""--search-mode hybrid-neighbors: the share chosen on the dev fold's evidence recall."""


def retrieve(embedder: Any, conv: Conversation, questions: Sequence[Question], k: int,
             mode: str = "vector") -> list[tuple[list[int], list[float]]]:
    """Per question, the positions of its top-k facts, best first, and their cosines.

    mode 'hybrid': the k chosen by cosine fused with keyword BM25, ordered by cosine, as
    Memory's default search (search/hybrid.py; the versions rule is not applied);
    'hybrid-neighbors': and NEIGHBOR_SHARE of the k given to the facts beside the best ones
    (search/neighbors.py; facts are in conversation order); 'hybrid-context': hybrid with
    keyword context (Memory(keyword_context=True), search/lexical.py).
    """
    from inferscale_engine.memory.search import hybrid, lexical, neighbors
    from inferscale_engine.memory.search.index import RetrievalIndex

    keywords = mode.startswith("hybrid")
    share = NEIGHBOR_SHARE if mode == "hybrid-neighbors" else 0.0
    texts = [f.retrieval_text for f in conv.facts]
    index = RetrievalIndex(device="cpu", context_facts=lexical.context_facts(
        mode == "hybrid-context"))
    index.add(user_id="u", fact_ids=list(range(len(texts))), embeddings=embedder.encode(texts),
              texts=texts if keywords else None)
    vectors = embedder.encode([q.question for q in questions])
    if keywords:
        hits = [hybrid.by_score(neighbors.scored(
            hybrid.hybrid_search(index, "u", q.question, vectors[i], k)[0], k, share,
            lambda a: index.adjacent(user_id="u", fact_ids=a), (),
            lambda ids, i=i: index.scores(user_id="u", query_embedding=vectors[i],
                                          fact_ids=ids))[0])
                for i, q in enumerate(questions)]
    else:
        hits = [index.search(user_id="u", query_embedding=vectors[i], k=k)
                for i in range(len(questions))]
    return [([int(fid) for fid, _ in found], [float(s) for _, s in found]) for found in hits]


def evidence_recall(conv: Conversation, positions: Sequence[int], question: Question
                    ) -> float | None:
    """Fraction of the question's evidence turns cited by the retrieved facts."""
    if not question.evidence:
        return None
    covered = {s for p in positions for s in conv.facts[p].source_ids}
    return sum(e in covered for e in question.evidence) / len(question.evidence)


def question_record(conv: Conversation, question: Question,
                    retrieved: tuple[list[int], list[float]]) -> dict:
    ranked, scores = retrieved
    return {"type": "question", "conversation": conv.sample_id, "index": question.index,
            "category": question.category, "question": question.question,
            "gold": question.answer, "evidence": list(question.evidence), "ranked": ranked,
            "scores": scores,
            "retrieved": [conv.facts[p].source_ids for p in sorted(ranked)],
            "recall": evidence_recall(conv, ranked, question)}


_OPTIONAL_FIELDS = ("fallback", "num_repaired_facts", "num_repaired_tokens")
"""Generation fields of newer engines (quality repairs), kept when present."""


def _generation(out: Any, seconds: float) -> dict[str, Any]:
    """The fields of an engine Generation a record (and the cache) keeps."""
    return {"text": out.text, "token_ids": list(out.token_ids),
            "first_token_logprobs": [[int(t), round(lp, 6)]
                                     for t, lp in out.first_token_logprobs.items()],
            "num_prompt_tokens": out.num_prompt_tokens,
            "num_injected_tokens": out.num_injected_tokens, "plan_status": out.plan_status,
            "mode": out.mode, "seconds": seconds,
            **{name: getattr(out, name) for name in _OPTIONAL_FIELDS if hasattr(out, name)}}


def answer_record(conv: Conversation, question: Question, arm: Arm, generation: Mapping,
                  from_cache: bool, cache_key: str | None) -> dict[str, Any]:
    token_ids = generation["token_ids"]
    return {"type": "answer", "conversation": conv.sample_id, "index": question.index,
            "arm": arm.name, "kind": arm.kind,
            "answer": generation["text"].strip().split("\n")[0].strip(),
            "raw": generation["text"], "first_token": token_ids[0] if token_ids else None,
            "first_token_logprobs": generation["first_token_logprobs"],
            "num_answer_tokens": len(token_ids),
            "num_prompt_tokens": generation["num_prompt_tokens"],
            "num_injected_tokens": generation["num_injected_tokens"],
            "plan_status": generation["plan_status"], "served_mode": generation["mode"],
            "seconds": generation["seconds"], "from_cache": from_cache, "cache_key": cache_key,
            **{name: generation[name] for name in _OPTIONAL_FIELDS if name in generation}}


class ConversationRun:
    """One conversation's facts in the engine: a text user and one user per window."""

    def __init__(self, engine: Any, conv: Conversation, positions: Sequence[int],
                 out: IO[str], embedder: Any = None) -> None:
        self.engine, self.conv, self.positions, self._out = engine, conv, list(positions), out
        self.embedder = embedder
        """Embeds the facts for similar-facts contexts (kv-sW arms)."""
        self.users: dict[str, dict[int, Any]] = {}
        """User id -> {fact position: engine fact id}."""

    def user(self, arm: Arm) -> tuple[str, dict[int, Any]]:
        """The arm's user and fact ids, registering (and for kv arms encoding) on first use."""
        name = f"{self.conv.sample_id}/" + ("text" if arm.window is None else f"w{arm.window}"
                                             f"r{arm.run_tokens}a{arm.key_scale:g}"
                                             f"{arm.context[0]}")
        if name not in self.users:
            texts = [self.conv.facts[p].text for p in self.positions]
            start = time.perf_counter()
            if arm.window is None:
                ids = self.engine.add_facts(name, texts, encode=False)
            else:
                before = self.engine.stats().counters.get("save_requests", 0)
                contexts = self.contexts(arm)
                ids = self.engine.add_facts(name, texts, [contexts[p] for p in self.positions],
                                            window=arm.window, key_scale=arm.key_scale)
                self._out.write(json.dumps({
                    "type": "ingest", "conversation": self.conv.sample_id, "window": arm.window,
                    "run_tokens": arm.run_tokens, "context": arm.context,
                    "num_facts": len(texts),
                    "save_requests": self.engine.stats().counters.get("save_requests", 0)
                    - before, "seconds": time.perf_counter() - start}) + "\n")
            self.users[name] = dict(zip(self.positions, ids, strict=True))
        return name, self.users[name]

    def contexts(self, arm: Arm) -> Sequence[Any]:
        """Every fact's encoding context: its context string, or with runs its RunContext
        (runs cut over the whole conversation, so a fact's KV never depends on which facts
        the questions need), or its similar-facts context (over the whole conversation too)."""
        run_tokens = arm.run_tokens
        if arm.context == "similar":
            from inferscale_engine.prompting.contexts import similar_contexts

            texts = [f.text for f in self.conv.facts]
            vectors = self.embedder.encode([f.retrieval_text for f in self.conv.facts])
            lengths = [len(self.engine.tokenize_fact(t, check_length=False)) for t in texts]
            return similar_contexts(vectors.cpu().numpy() if hasattr(vectors, "cpu")
                                    else vectors, lengths, texts, window=arm.window or 0)
        if not run_tokens:
            return self.conv.contexts
        if self.conv.context_kind != "memory":
            raise SystemExit("runs of facts (kv-wWrR arms) encode facts after the facts "
                             "before them: use --context memory")
        from inferscale_engine.prompting.contexts import run_contexts

        texts = [f.text for f in self.conv.facts]
        lengths = [len(self.engine.tokenize_fact(t)) for t in texts]
        return run_contexts([], texts, lengths, run_tokens=run_tokens, lead_facts=CONTEXT_FACTS)

    def close(self) -> None:
        for name, ids in self.users.items():
            self.engine.delete(name, list(ids.values()))


def answer_arm(run: ConversationRun, arm: Arm, questions: Sequence[Question],
               ranked: Mapping[int, tuple[list[int], list[float]]], args: argparse.Namespace,
               cache: TextAnswerCache, model: Mapping[str, Any]) -> list[dict]:
    """One batch of questions answered by one arm; text answers from the cache when there."""
    from vllm import SamplingParams

    from inferscale_engine import MemoryHandle

    user, fact_ids = run.user(arm)
    requests, keys = [], []
    for q in questions:
        asked = q.question + (CATEGORY_HINTS.get(q.category, "") if args.hints else "")
        (ids, scores), chat = arm_request(arm, *ranked[q.index], asked, fact_ids)
        requests.append((MemoryHandle(user, tuple(ids), tuple(scores)), chat))
        keys.append(text_key(run.engine, arm, f"{run.conv.sample_id}/{q.index}", requests[-1],
                             args, model) if arm.kind == "text" else None)
    found = [cache.get(key[0], key[2]) if key else None for key in keys]
    todo = [i for i, hit in enumerate(found) if hit is None]
    if todo:
        sampling = SamplingParams(**sampling_settings(args))
        start = time.perf_counter()
        outs = run.engine.generate_many([requests[i] for i in todo], sampling,
                                        **arm.engine_kwargs())
        seconds = (time.perf_counter() - start) / len(todo)
        for i, out in zip(todo, outs, strict=True):
            found[i] = _generation(out, seconds)
            if keys[i]:
                if out.num_prompt_tokens != keys[i][1]:
                    raise RuntimeError(f"arm {arm.name}: the engine sent {out.num_prompt_tokens} "
                                       f"prompt tokens, the cache key hashed {keys[i][1]}")
                cache.put(keys[i][0], found[i], {"arm": arm.name, "model": model["name"],
                                                 "question": f"{run.conv.sample_id}/"
                                                             f"{questions[i].index}"})
    fresh = set(todo)
    return [answer_record(run.conv, q, arm, found[i], i not in fresh,
                          keys[i][0] if keys[i] else None) for i, q in enumerate(questions)]


def text_key(engine: Any, arm: Arm, question_id: str, request: tuple[Any, list],
             args: argparse.Namespace, model: Mapping[str, Any]) -> tuple[str, int, str]:
    """(cache key, prompt length, legacy key) of a text request, from the exact token ids the
    engine sends: its own prompt builder over the facts' stored token ids.

    The key leaves out run_tokens (kv-only: a text answer does not depend on it); the legacy
    key has it as 0, as the runs of 2026-12-02 before this fix wrote it.
    """
    handle, chat = request
    prompt = engine.render_prompt(handle, chat, layout=arm.layout).token_ids()
    options = arm.describe()
    keys = [text_cache_key(model=model, question_id=question_id, k=args.k,
                           prompt_token_ids=prompt, layout=arm.layout_name,
                           options=opts, system_prompt=args.system_prompt,
                           sampling=sampling_settings(args))
            for opts in ({k: v for k, v in options.items() if k != "run_tokens"},
                         {**options, "run_tokens": 0})]
    return keys[0], len(prompt), keys[1]


def run(args: argparse.Namespace, arms: Sequence[Arm], selection: Selection,
        answered: Mapping[tuple[str, int], Mapping[str, Any]], known: set[tuple[str, int]],
        out_path: Path, cache: TextAnswerCache) -> None:
    """Answer every (question, arm) of `selection` not in `answered`, appending to out_path.

    Args:
        answered: (conversation, index) -> {arm name: answer record} already in the file.
        known: questions whose question record is already in the file.
    """
    from tqdm import tqdm
    from vllm import SamplingParams

    from inferscale_engine.memory.search.embedder import Embedder

    pending = {(conv.sample_id, q.index): [a for a in arms
                                           if a.name not in answered.get((conv.sample_id,
                                                                          q.index), {})]
               for conv, qs in selection.groups for q in qs}
    if not any(pending.values()):
        return
    engine = build_engine(args, arms)
    model = model_identity(args, engine.config.model)
    # one-time costs (first kernels, the preamble's prefill) outside every timed batch
    engine.generate(None, "Hello", SamplingParams(max_tokens=2, temperature=0.0))
    embedder = Embedder(args.embedder, device="cpu")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open_text(out_path, "a") as out:
        config = {k: v for k, v in vars(args).items() if k != "arm_list"}
        config["arms"] = [a.name for a in arms]
        out.write(json.dumps({"type": "config", "config": config}, default=str) + "\n")
        bar = tqdm(total=sum(len(v) for v in pending.values()), desc="answers")
        try:
            for conv, questions in selection.groups:
                todo = [q for q in questions if pending[(conv.sample_id, q.index)]]
                if not todo:
                    continue
                ranked = dict(zip((q.index for q in todo), retrieve(embedder, conv, todo, args.k,
                                                                    args.search_mode),
                                  strict=True))
                for q in todo:
                    if (conv.sample_id, q.index) not in known:
                        out.write(json.dumps(question_record(conv, q, ranked[q.index])) + "\n")
                conv_run = ConversationRun(engine, conv, sorted({p for r, _ in ranked.values()
                                                                 for p in r}), out, embedder)
                try:
                    for arm in arms:
                        mine = [q for q in todo if arm in pending[(conv.sample_id, q.index)]]
                        bar.set_postfix_str(f"{conv.sample_id} {arm.name}")
                        for lo in range(0, len(mine), args.batch_size):
                            batch = mine[lo:lo + args.batch_size]
                            for record in answer_arm(conv_run, arm, batch, ranked, args, cache,
                                                     model):
                                out.write(json.dumps(record) + "\n")
                            out.flush()
                            bar.update(len(batch))
                finally:
                    conv_run.close()
        finally:
            bar.close()
            engine.close()
