"""mem0 OSS behind a pipe: runs in mem0's own virtual environment (peers_mem0.py makes it), never
in ours, and imports nothing of this repository.

One JSON request per line on stdin, one JSON reply per line on the original stdout (mem0's own
prints and logs go to stderr):
  {"op": "open", "config": {...}, "llm_timeout_s": 300}   Memory.from_config
  {"op": "add", "user_id": ..., "messages": [...], "infer": true, "metadata": {...}}
  {"op": "search", "user_id": ..., "query": ..., "top_k": 20}
  {"op": "close"}
Each reply carries `seconds` (the mem0 call alone, timed here: the pipe is not counted), `ok`,
and what mem0 logged at WARNING or above during the call (`logged`): mem0 answers an extraction
it cannot parse with an empty result and an ERROR log line, so that is how such a failure is
counted. With infer=True each reply also lists the LLM calls mem0 made (seconds, reply length).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from typing import Any


class _Recorder(logging.Handler):
    """mem0's log records at WARNING or above, per call."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.levelname} {record.name}: {record.getMessage()}"[:500])


class Worker:
    """One mem0 Memory and the calls made on it."""

    def __init__(self) -> None:
        self.memory: Any = None
        self.recorder = _Recorder()
        logging.getLogger("mem0").addHandler(self.recorder)
        self.llm_calls: list[dict[str, Any]] = []

    def open(self, config: dict[str, Any], llm_timeout_s: float) -> dict[str, Any]:
        from mem0 import Memory

        self.memory = Memory.from_config(config)
        llm = self.memory.llm
        # mem0's client waits 600 s and retries twice by default; one bounded try counts a
        # timeout as a failure instead of hiding it in a retry
        llm.client = llm.client.with_options(timeout=llm_timeout_s, max_retries=0)
        generate = llm.generate_response

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            call: dict[str, Any] = {"ok": False}
            try:
                reply = generate(*args, **kwargs)
                call.update(ok=True, reply_chars=len(reply or "") if isinstance(reply, str)
                            else None, reply=reply if isinstance(reply, str) else None)
                return reply
            except Exception as exc:
                call["error"] = f"{type(exc).__name__}: {exc}"[:500]
                raise
            finally:
                call["seconds"] = time.perf_counter() - start
                self.llm_calls.append(call)

        llm.generate_response = timed
        import mem0

        return {"mem0": getattr(mem0, "__version__", None)}

    def add(self, user_id: str, messages: list[dict[str, str]], infer: bool,
            metadata: dict[str, Any] | None) -> dict[str, Any]:
        out = self.memory.add(messages, user_id=user_id, infer=infer, metadata=metadata)
        return {"results": [{"id": str(r.get("id")), "memory": r.get("memory"),
                             "event": r.get("event")} for r in out.get("results", [])]}

    def search(self, user_id: str, query: str, top_k: int) -> dict[str, Any]:
        out = self.memory.search(query, top_k=top_k, filters={"user_id": user_id})
        return {"results": [{"id": str(r.get("id")), "memory": r.get("memory"),
                             "score": r.get("score"), "metadata": r.get("metadata") or {}}
                            for r in out.get("results", [])]}

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.pop("op")
        self.recorder.records.clear()
        self.llm_calls.clear()
        start = time.perf_counter()
        try:
            if op == "open":
                reply = self.open(request["config"], float(request.get("llm_timeout_s", 300)))
            elif op == "add":
                reply = self.add(request["user_id"], request["messages"],
                                 bool(request["infer"]), request.get("metadata"))
            elif op == "search":
                reply = self.search(request["user_id"], request["query"],
                                    int(request["top_k"]))
            elif op == "close":
                reply = {}
            else:
                raise ValueError(f"unknown op {op!r}: use open, add, search or close")
            reply["ok"] = True
        except Exception as exc:  # every failure goes back to the benchmark, which counts it
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:1000],
                     "traceback": traceback.format_exc()[-3000:]}
        reply["seconds"] = time.perf_counter() - start
        reply["logged"] = list(self.recorder.records)
        reply["llm_calls"] = list(self.llm_calls)
        return reply


def main() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything mem0 (or a library under it) prints must not corrupt the replies
    sys.stdout = sys.stderr
    worker = Worker()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        closing = request.get("op") == "close"
        replies.write(json.dumps(worker.handle(request), default=str) + "\n")
        if closing:
            break


if __name__ == "__main__":
    main()
