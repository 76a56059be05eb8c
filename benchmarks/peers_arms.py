"""The memories peers.py compares: each stores an episode and recalls memories for a question.

  mem0-infer       mem0 OSS, add(infer=True): its LLM (the served model) extracts memories from
                   the dialogue turns, a chunk of turns per add; memories pasted as text
  mem0-raw         mem0 OSS, add(infer=False): the same facts as ours, stored as they are
  inferscale-kv    `inferscale serve` with its defaults: facts added through POST /v1/memories,
                   answered with memory.k = k (retrieval and KV injection in the server)
  inferscale-text  the same stored facts, retrieved by POST /v1/memories/search, pasted as text
  langgraph        LangGraph's InMemoryStore with the same embedder; items pasted as text
Every arm answers with the same served model and the same prompt. The kv arm's server builds
it: ANSWER_INSTRUCTIONS as the system message, the server's memory header and the k memories
('- text' lines, best first), of which its default layout (layout.QUALITY_LAYOUT) moves the
`repair` most relevant into a block at the start of the question. A pasting arm writes the same
prompt itself (paste layout 'server', the default: inferscale-text is then the kv arm's prompt
prefilled, token for token but for tokenizer merges at the fact boundaries), or every memory in
the system message (paste layout 'system', as mem0's docs show it).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.peers_data import Episode, Session
from inferscale_engine.config import DEFAULT_SYSTEM_PROMPT
from inferscale_engine.prompting.layout import QUALITY_LAYOUT, USER_BLOCK_HEADER
from inferscale_engine.prompting.prompt import FACT_FORMAT

ANSWER_INSTRUCTIONS = (
    "You answer questions about a long conversation between two people, using memories taken "
    "from it. Each memory starts with the date of the conversation it comes from. Answer with a "
    "short phrase of a few words, using exact words from the memories whenever possible. Do not "
    "explain and do not repeat the question.")
"""locomo.py's SYSTEM_PROMPT without its 'Memory:' line: the server adds its own header."""
ARM_NAMES = ("mem0-infer", "mem0-raw", "inferscale-kv", "inferscale-text", "langgraph")


@dataclass(frozen=True, slots=True)
class Recalled:
    """The memories one arm recalled for one question, best first."""

    texts: tuple[str, ...]
    """As pasted (with their date)."""
    sources: tuple[tuple[str, ...], ...]
    """Per memory, the dialogue turn ids it comes from (for gold-evidence recall)."""
    seconds: float
    """Retrieval time the asker waits before the model is called (0 for kv: in the server)."""
    error: str | None = None


@dataclass(slots=True)
class AddCall:
    """One add call of an arm."""

    num_inputs: int
    """Facts given (raw arms) or dialogue turns given (mem0-infer)."""
    seconds: float
    num_stored: int = 0
    error: str | None = None
    events: dict[str, int] = field(default_factory=dict)
    logged: list[str] = field(default_factory=list)
    llm_calls: list[dict[str, Any]] = field(default_factory=list)


def answer_messages(question: str, memories: Sequence[str] | None, repair: int = 0
                    ) -> list[dict[str, str]]:
    """The chat every arm sends: memories None = the server adds them (kv); else the first
    `repair` memories go in a block before the question (where the server's layout puts
    them), the rest in the system message."""
    system, user = ANSWER_INSTRUCTIONS, question
    if memories is not None:
        system += "\n\n" + DEFAULT_SYSTEM_PROMPT + "".join(FACT_FORMAT.format(text=t)
                                                           for t in memories[repair:])
        if repair and memories:
            user = (USER_BLOCK_HEADER + "".join(FACT_FORMAT.format(text=t)
                                                for t in memories[:repair]) + "\n" + question)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def paste_repair(layout: str) -> int:
    """Memories a pasting arm puts before the question: 'server' = as the kv arm's server
    does (its default layout's repair_facts, placement 'user'), 'system' = none."""
    if layout == "system":
        return 0
    if QUALITY_LAYOUT.repair_placement != "user" or QUALITY_LAYOUT.repair_token_budget:
        raise SystemExit(f"the server's default layout {QUALITY_LAYOUT} is not one peers.py "
                         "can paste (a fixed r in the user turn); pass --paste-layout system")
    return QUALITY_LAYOUT.repair_facts


def batches(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """`items` in slices of `size` (0: all at once)."""
    size = size or max(1, len(items))
    for lo in range(0, len(items), size):
        yield items[lo:lo + size]


class Mem0Arm:
    """mem0 OSS through its worker (peers_mem0.py); one user per episode, and one store (qdrant
    folder and history) per episode, so that episodes can be filled side by side."""

    kind = "text"

    def __init__(self, name: str, open_worker: Callable[[str], Any], infer: bool,
                 turns_per_add: int, facts_per_add: int, root: Path | None = None) -> None:
        """open_worker(episode_id): a worker on that episode's store, root/episode_id."""
        self.name, self.infer, self._open, self.root = name, infer, open_worker, root
        self.turns_per_add, self.facts_per_add = turns_per_add, facts_per_add
        self.worker: Any = None
        self.episode: str | None = None
        self.store, self.persistent = name, True
        """One store per sub-arm and episode, kept on disk across resumes."""

    def use(self, episode_id: str) -> None:
        """Work on this episode's store from now on (its worker opened, the last one closed)."""
        if episode_id != self.episode:
            self.close()
            self.worker, self.episode = self._open(episode_id), episode_id

    def fork(self) -> Mem0Arm:
        """The same sub-arm with a worker of its own (for a fill beside this arm's)."""
        return Mem0Arm(self.name, self._open, self.infer, self.turns_per_add,
                       self.facts_per_add, self.root)

    def filling(self, episode_id: str) -> str | None:
        """The attempt whose fill this episode's store on disk holds (None: no store)."""
        marker = self.root / episode_id / "attempt" if self.root else None
        return marker.read_text().strip() if marker and marker.exists() else None

    def begin(self, episode_id: str, attempt: str) -> None:
        """Mark the episode's store as filled by `attempt` (what `filling` reads back)."""
        if self.root:
            (self.root / episode_id).mkdir(parents=True, exist_ok=True)
            (self.root / episode_id / "attempt").write_text(attempt)

    def ingest(self, user_id: str, session: Session) -> Iterator[AddCall]:
        if self.infer:
            for chunk in batches(session.turns, self.turns_per_add):
                yield self._add(user_id, chunk, {"date": session.date, "source_ids": sorted(
                    {s for t in chunk for s in t.source_ids})})
        else:
            for chunk in batches(session.facts, self.facts_per_add):
                yield self._add(user_id, chunk, {"date": session.date})

    def warm_up(self, user_id: str) -> dict[str, Any]:
        """infer=True: one untimed add, so the served model has mem0's extraction prompt (~8k
        tokens, the same in every call) in its prefix cache, as a server in use would; a cold
        prefill of it can outlast --llm-timeout-s on the CPU, and then the next try goes on
        from the blocks already cached."""
        if not self.infer:
            return {}
        reply: dict[str, Any] = {}
        for _ in range(3):
            reply = self.worker.call("add", user_id=user_id, infer=True, messages=[
                {"role": "user", "content": "[1 January 2023] Sam: I moved to Lisbon."}])
            if reply["ok"]:
                break
        return {"ok": reply["ok"], "seconds": reply["seconds"], "error": reply.get("error"),
                "llm_calls": [{**{k: v for k, v in c.items() if k != "reply"},
                               "reply_head": (c.get("reply") or "")[:300]}
                              for c in reply["llm_calls"]]}

    def _add(self, user_id: str, items: Sequence[Any], metadata: dict[str, Any]) -> AddCall:
        reply = self.worker.call("add", user_id=user_id, infer=self.infer, metadata=metadata,
                                 messages=[{"role": "user", "content": f.text} for f in items])
        results = reply.get("results", [])
        events: dict[str, int] = {}
        for result in results:
            events[str(result.get("event"))] = events.get(str(result.get("event")), 0) + 1
        llm_calls = [{k: v for k, v in c.items() if k != "reply"} for c in reply["llm_calls"]]
        for call, raw in zip(llm_calls, reply["llm_calls"], strict=True):
            call["reply_head"] = (raw.get("reply") or "")[:200]
        return AddCall(len(items), reply["seconds"], num_stored=len(results),
                       error=reply.get("error"), events=events, logged=reply["logged"],
                       llm_calls=llm_calls)

    def recall(self, user_id: str, episode: Episode, query: str, k: int) -> Recalled:
        reply = self.worker.call("search", user_id=user_id, query=query, top_k=k)
        if not reply["ok"]:
            return Recalled((), (), reply["seconds"], reply.get("error"))
        sources = episode.sources_by_text()
        texts, cited = [], []
        for result in reply["results"]:
            meta = result.get("metadata") or {}
            text = str(result["memory"])
            if self.infer and meta.get("date") and not text.startswith("["):
                text = f"[{meta['date']}] {text}"  # raw facts carry their date already
            texts.append(text)
            cited.append(tuple(meta.get("source_ids") or sources.get(str(result["memory"]), ())))
        return Recalled(tuple(texts), tuple(cited), reply["seconds"])

    def kill(self) -> None:
        """End the worker now, mid-call (a run that is stopping)."""
        if self.worker is not None:
            self.worker.kill()

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
        self.worker, self.episode = None, None


class InferScaleArm:
    """The server's own memory: kv (the server injects) or text (search, then pasted)."""

    def __init__(self, name: str, client: httpx.Client, kind: str, facts_per_add: int) -> None:
        self.name, self.client, self.kind = name, client, kind
        self.facts_per_add = facts_per_add
        self.store, self.persistent = "inferscale", True
        """kv and text answer from the same stored facts (one server, one store, two modes)."""

    def use(self, episode_id: str) -> None:
        """One store for every episode (a user per episode)."""

    def warm_up(self, user_id: str) -> dict[str, Any]:
        """Nothing to warm: the server's embedder and engine are warm after start-up."""
        return {}

    def ingest(self, user_id: str, session: Session) -> Iterator[AddCall]:
        for chunk in batches(session.facts, self.facts_per_add):
            start = time.perf_counter()
            try:
                response = self.client.post("/v1/memories", json={
                    "user_id": user_id, "texts": [f.text for f in chunk]}, timeout=3600)
                seconds = time.perf_counter() - start
                response.raise_for_status()
            except httpx.HTTPError as exc:
                yield AddCall(len(chunk), time.perf_counter() - start,
                              error=f"{type(exc).__name__}: {exc}"[:300])
                continue
            events: dict[str, int] = {}
            for result in response.json()["results"]:
                events[result["event"]] = events.get(result["event"], 0) + 1
            yield AddCall(len(chunk), seconds, num_stored=events.get("ADD", 0), events=events)

    def recall(self, user_id: str, episode: Episode, query: str, k: int) -> Recalled:
        start = time.perf_counter()
        try:
            response = self.client.post("/v1/memories/search", json={
                "user_id": user_id, "query": query, "top_k": k}, timeout=600)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            return Recalled((), (), time.perf_counter() - start, f"{type(exc).__name__}: {exc}")
        seconds = time.perf_counter() - start
        sources = episode.sources_by_text()
        texts = tuple(str(r["memory"]) for r in response.json()["results"])
        return Recalled(texts, tuple(sources.get(t, ()) for t in texts),
                        0.0 if self.kind == "kv" else seconds)

    def close(self) -> None:
        """The server belongs to peers.py."""


class LangGraphArm:
    """LangGraph's InMemoryStore, semantic index over the same MiniLM; a namespace per episode."""

    kind = "text"

    def __init__(self, embedder_path: str, facts_per_add: int, device: str = "cpu") -> None:
        from langgraph.store.memory import InMemoryStore
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(embedder_path, device=device, local_files_only=True)
        self.name, self.facts_per_add = "langgraph", facts_per_add
        self.store, self.persistent = "langgraph", False
        self.items = InMemoryStore(index={
            "dims": 384, "fields": ["text"],
            "embed": lambda texts: model.encode(list(texts)).tolist()})

    def use(self, episode_id: str) -> None:
        """One store for every episode (a namespace per episode)."""

    def warm_up(self, user_id: str) -> dict[str, Any]:
        """One untimed put: the embedder's first call pays its one-time costs."""
        self.items.put(("peers", user_id), "warmup", {"text": "warm up"})
        return {}

    def ingest(self, user_id: str, session: Session) -> Iterator[AddCall]:
        from langgraph.store.base import PutOp

        namespace = ("peers", user_id)
        for chunk in batches(session.facts, self.facts_per_add):
            start = time.perf_counter()
            self.items.batch([PutOp(namespace, hashlib.sha1(f.text.encode()).hexdigest()[:20],
                                    {"text": f.text}) for f in chunk])
            yield AddCall(len(chunk), time.perf_counter() - start, num_stored=len(chunk))

    def recall(self, user_id: str, episode: Episode, query: str, k: int) -> Recalled:
        start = time.perf_counter()
        items = self.items.search(("peers", user_id), query=query, limit=k)
        seconds = time.perf_counter() - start
        sources = episode.sources_by_text()
        texts = tuple(str(item.value["text"]) for item in items)
        return Recalled(texts, tuple(sources.get(t, ()) for t in texts), seconds)

    def close(self) -> None:
        """Nothing to release: the store lives in this process."""
