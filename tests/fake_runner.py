"""FakeRunner: the Engine's Runner without vLLM, for second-long tests of runtime/ and memory/.

As vLLM's own connector unit tests drive the connector with a fake scheduler, this drives the
Engine (and a Memory over it) with a fake of what runs vLLM: no engine starts, no model runs,
no KV moves. Each request is answered at once from its plan alone, as the connector would
report it:

- a save request (a SavePlan in its kv_transfer_params) "captures" its spans: their slab keys
  become resident on the one fake worker; status "save";
- a kv request (an InjectionPlan) is "injected" when every key of its plan is resident: status
  "inject", claimed = the plan's tokens; else "rejected" (vLLM would have prefilled);
- a text request: status "none".

The answer's text is FakeRunner.ANSWER. `requests` keeps every (prompt, params) run, so a test
can see what the Engine sent. What it cannot tell: anything about the KV's values (exactness,
rotation) or vLLM's scheduling; tests of those run the real engine.

    engine = Engine(engine_config(model), runner=FakeRunner)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

from inferscale_engine.config import ConnectorConfig, EngineConfig
from inferscale_engine.protocol.plan import InjectionPlan, from_params
from inferscale_engine.protocol.save_plan import SavePlan
from inferscale_engine.runtime.generation import RESULT_KEY
from inferscale_engine.runtime.runner import WorkerClient


class FakeRunner:
    """A Runner (runtime/runner.py) that answers every request from its plan, at once."""

    ANSWER = "fake answer"

    def __init__(self, config: EngineConfig, connector: ConnectorConfig) -> None:
        self.config, self.connector = config, connector
        self.llm: Any = None
        self.in_process = False  # plans travel signed in the params, as to another process
        self.resident: set[int] = set()
        """Slab keys the fake worker holds."""
        self.requests: list[tuple[Any, Any]] = []
        """(prompt, params) of every request run, in order."""
        self.workers = WorkerClient(self._rpc)

    def run(self, prompts: list[Any], params: list[Any], use_tqdm: bool = False,
            ranks: Sequence[int] | None = None) -> list[Any]:
        """One finished output per prompt, its status what the connector would report."""
        return [self._answer(prompt, p) for prompt, p in zip(prompts, params, strict=True)]

    def stream(self, prompt: Any, params: Any, rank: int = 0) -> Iterator[Any]:
        """The finished output, as the one step of a stream."""
        yield self._answer(prompt, params)

    def workers_for(self, rank: int) -> WorkerClient:
        """The one fake worker."""
        return self.workers

    def close(self) -> None:
        """Nothing to release."""

    def _answer(self, prompt: Any, params: Any) -> Any:
        self.requests.append((prompt, params))
        plan = from_params((getattr(params, "extra_args", None) or {}).get("kv_transfer_params"))
        result: dict[str, Any] = {"status": "none"}
        if isinstance(plan, SavePlan):
            self.resident.update(span.slab_key for span in plan.spans)
            result = {"status": "save"}
        elif isinstance(plan, InjectionPlan):
            found = all(key in self.resident for key in plan.slab_keys)
            result = ({"status": "inject", "claimed": plan.num_tokens} if found
                      else {"status": "rejected"})
        completion = SimpleNamespace(text=self.ANSWER, token_ids=[0], logprobs=None)
        return SimpleNamespace(outputs=[completion], kv_transfer_params={RESULT_KEY: result},
                               num_cached_tokens=0, finished=True, metrics=None,
                               request_id=f"fake-{len(self.requests)}")

    def _rpc(self, method: str, args: tuple[Any, ...]) -> list[Any]:
        """The worker extension's calls (connector/control.py), on one fake worker."""
        if method == "inferscale_stats":
            return [{"resident_entries": len(self.resident)}]
        if method == "inferscale_free":
            keys = set(args[0])
            freed = len(keys & self.resident)
            self.resident -= keys
            return [freed]
        if method == "inferscale_resident":
            return [[key in self.resident for key in args[0]]]
        if method in ("inferscale_flush_disk", "inferscale_forget"):
            return [0]
        if method == "inferscale_recent_loads":
            return [[]]
        raise NotImplementedError(f"FakeRunner has no {method}: use the real engine for tiers")
