"""The arms of the LoCoMo benchmark: the ways one question is answered from its k facts.

An arm is a name, a kind and the engine's own prompt Layout (inferscale_engine.prompting.layout):
  kind     'text' prefills the facts as text; 'kv' injects their stored KV, encoded with
           context window W (`window`)
  layout   the engine's Layout: which of the k facts are repaired as text (the top r by
           retrieval score) and where ('end': the end of the memory block, 'user': a
           "More memories:" block in the user turn, 'also': injected AND repeated at the end)
Names spell the setting: text, text-user4, text-end4, kv-w64, kv-w64-user4, kv-w256-end2,
kv-w64-also4, kv-w64-a0.9 (facts encoded with key temperature: keys scaled by 0.9),
kv-w256r512 (the conversation's facts encoded in runs of up to 512 fact tokens, one save
request per run: each fact after the W tokens before its run and the run's facts before it;
prompting/contexts.py RunContext), kv-s256 (each fact encoded after the earlier facts of its
conversation MOST SIMILAR to it, up to W tokens, in conversation order; prompting/contexts.py
similar_contexts).
Every request is one handle, facts in chronological order with their retrieval scores, so the
ENGINE picks the repaired facts; a text arm of a layout prefills the same prompt
a kv arm of that layout sends. Text arms run first, so cached text answers are reused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferscale_engine.prompting.layout import Layout

KINDS = ("text", "kv")
CONTEXTS = ("recent", "similar")
PLACEMENTS = {"end": "memory", "user": "user", "also": "memory"}
_NAME = re.compile(r"(?P<kind>text|kv-(?P<source>[ws])(?P<window>\d+)(?:r(?P<run>\d+))?"
                   r"(?:-a(?P<alpha>\d+(?:\.\d+)?))?)"
                   r"(?:-(?P<where>end|user|also)(?P<r>\d+))?")


def layout_of(where: str | None, r: int) -> Layout:
    """The engine Layout of a name's suffix (None: every fact in the memory block)."""
    if where is None:
        return Layout()
    return Layout(repair_facts=r, repair_placement=PLACEMENTS[where],
                  repair_also_inject=where == "also")


@dataclass(frozen=True, slots=True)
class Arm:
    """One way of answering: see the module docstring."""

    name: str
    kind: str
    layout_name: str = "system"
    """The layout part of the name ('system', 'user4', 'end2', 'also4'): arms of one layout
    name are compared with each other."""
    window: int | None = None
    """kv: the context window W the injected facts were encoded with; text: None."""
    layout: Layout = Layout()
    key_scale: float = 1.0
    """kv: the key temperature the facts were encoded with (EngineConfig.key_scale)."""
    run_tokens: int = 0
    """kv: R of runs of facts encoded together (EngineConfig.context_run_tokens); 0: each
    fact alone after its last W tokens."""
    context: str = "recent"
    """kv: what a fact is encoded after: 'recent' (the facts right before it, name kv-wW) or
    'similar' (the earlier facts most similar to it, name kv-sW)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"arm {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
        if (self.kind == "kv") != (self.window is not None) or (self.window or 0) < 0:
            raise ValueError(f"arm {self.name!r}: a kv arm needs a window >= 0, a text arm none")
        if self.context not in CONTEXTS or (self.context == "similar" and self.run_tokens):
            raise ValueError(f"arm {self.name!r}: context {self.context!r} (one of {CONTEXTS}; "
                             "runs only with 'recent')")

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of Engine.generate_many besides requests and sampling."""
        return {"mode": self.kind, "layout": self.layout}

    def describe(self) -> dict[str, Any]:
        """JSON form, for result records."""
        return {"name": self.name, "kind": self.kind, "layout": self.layout_name,
                "window": self.window, "repair_facts": self.layout.repair_facts,
                "repair_placement": self.layout.repair_placement,
                "repair_also_inject": self.layout.repair_also_inject,
                "key_scale": self.key_scale, "run_tokens": self.run_tokens,
                **({"context": self.context} if self.context != "recent" else {})}


def get_arm(name: str) -> Arm:
    """The arm a name spells: text[-WHERE r] or kv-wW[-WHERE r], WHERE in end/user/also."""
    match = _NAME.fullmatch(name)
    if match is None or (match["kind"] == "text" and match["where"] == "also"):
        raise ValueError(f"unknown arm {name!r}; names are text[-end|-user R] or "
                         "kv-wW[rRUN][-aALPHA][-end|-user|-also R] (kv-sW: similar-facts "
                         "context), e.g. text-user4, kv-w64-end2, kv-w256r512-user2, kv-s256")
    where, r = match["where"], int(match["r"] or 0)
    if where is not None and r < 1:
        raise ValueError(f"arm {name!r}: repair at least one fact")
    window = int(match["window"]) if match["window"] is not None else None
    alpha = float(match["alpha"]) if match["alpha"] is not None else 1.0
    if not 0 < alpha < 100:
        raise ValueError(f"arm {name!r}: the key scale must be positive")
    run = int(match["run"] or 0)
    if match["run"] is not None and run < 1:
        raise ValueError(f"arm {name!r}: a run holds at least one token")
    if match["source"] == "s" and match["run"] is not None:
        raise ValueError(f"arm {name!r}: runs (rR) encode facts after the facts right before "
                         "them; a similar-facts context (kv-sW) takes no runs")
    return Arm(name, "kv" if window is not None else "text",
               f"{where}{r}" if where else "system", window, layout_of(where, r), alpha, run,
               "similar" if match["source"] == "s" else "recent")


DEFAULT_ARMS = ("text", "kv-w64", "kv-w0")


def parse_arms(spec: str | Sequence[str]) -> list[Arm]:
    """Arms from 'text,kv-w64' (or a list of names), in run order, without duplicates."""
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [n.strip() for n in names if n.strip()]
    if len(set(names)) != len(names):
        raise ValueError(f"arms {names} name one arm twice")
    return run_order([get_arm(n) for n in names])


def run_order(arms: Iterable[Arm]) -> list[Arm]:
    """Text arms first (their answers may come from the cache), then kv arms; stable."""
    arms = list(arms)
    return [a for a in arms if a.kind == "text"] + [a for a in arms if a.kind != "text"]


def reference_text_arm(arm: Arm, arms: Sequence[Arm]) -> Arm | None:
    """The text arm of `arm`'s layout among `arms`, or None ('also' compares with 'end')."""
    name = arm.layout_name.replace("also", "end")
    twins = [a for a in arms if a.kind == "text" and a.layout_name == name and a is not arm]
    return twins[0] if twins else None


def arm_request(arm: Arm, ranked: Sequence[int], scores: Sequence[float], question: str,
                fact_ids: Mapping[int, Any]) -> tuple[tuple[list[Any], list[float]],
                                                      list[dict[str, str]]]:
    """((fact ids, scores) of the handle, chat) of one question.

    Facts go in chronological order (conversation position) with their retrieval scores; the
    engine's Layout decides what is repaired.

    Args:
        ranked: positions of the question's k facts in the conversation, best first.
        scores: their retrieval scores, in the same order.
        question: the question as asked (with its category hint).
        fact_ids: engine fact id of each needed position (of the arm's user).
    """
    chronological = sorted(zip(ranked, scores, strict=True))
    return (([fact_ids[p] for p, _ in chronological], [s for _, s in chronological]),
            [{"role": "user", "content": question}])
