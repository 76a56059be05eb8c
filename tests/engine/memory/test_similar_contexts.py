"""Similar-facts contexts (EngineConfig.context_source 'similar') in the memory layer: a new
fact is encoded after the user's earlier facts most similar to it, stored ones and this call's,
within W tokens, in the order they were added; other users' facts never take part."""

from __future__ import annotations

import torch

from inferscale_engine.memory.ingest import similar_fact_contexts
from inferscale_engine.memory.search.index import RetrievalIndex
from inferscale_engine.prompting.prompt import FACT_FORMAT

STORED = {1: "Alice plays chess in Paris.", 2: "Bob feeds his two cats.",
          3: "Alice won a chess cup in Paris.", 4: "Bob repairs old bikes."}
OTHER = {5: "Alice chess Paris champion."}  # another user's, most similar of all


def unit(*rows: list[float]) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.tensor(rows, dtype=torch.float32), dim=-1)


VECTORS = {1: [1, 0, 0], 2: [0, 1, 0], 3: [0.9, 0.1, 0], 4: [0, 0.8, 0.2], 5: [1, 0, 0]}


def index() -> RetrievalIndex:
    out = RetrievalIndex(device="cpu")
    out.add(user_id="ann", fact_ids=list(STORED), embeddings=unit(*(VECTORS[i] for i in STORED)))
    out.add(user_id="zed", fact_ids=list(OTHER), embeddings=unit(VECTORS[5]))
    return out


def stored(fact_id: int) -> tuple[str, int] | None:
    return (STORED[fact_id], 10) if fact_id in STORED else None


def test_new_facts_see_their_most_similar_earlier_facts_in_added_order():
    new = ["Alice drew at chess in Paris.", "Bob adopted a third cat."]
    vectors = unit([0.95, 0.05, 0], [0.05, 1, 0])
    chess, cats = similar_fact_contexts(index(), "ann", vectors, new, [10, 10], window=20,
                                        stored=stored)
    lines = lambda *texts: "".join(FACT_FORMAT.format(text=t) for t in texts)  # noqa: E731
    assert chess == lines(STORED[1], STORED[3])  # not the other user's fact 5
    # the cat fact: Bob's stored facts beat the chess fact added just before it in this call
    assert cats == lines(STORED[2], STORED[4])


def test_this_calls_earlier_facts_count_and_come_after_stored_ones():
    new = ["Alice trains chess daily.", "Alice chess in Paris again."]
    vectors = unit([1, 0, 0], [1, 0, 0])
    _, second = similar_fact_contexts(index(), "ann", vectors, new, [10, 10], window=20,
                                      stored=stored)
    # best: fact 1 (1.0) and the call's first fact (1.0); written stored first, then the call's
    assert second == "".join(FACT_FORMAT.format(text=t) for t in (STORED[1], new[0]))


def test_no_window_or_no_history_gives_no_context():
    vectors = unit([1, 0, 0])
    assert similar_fact_contexts(index(), "ann", vectors, ["x"], [3], window=0,
                                 stored=stored) == [None]
    assert similar_fact_contexts(RetrievalIndex(device="cpu"), "new", vectors, ["x"], [3],
                                 window=64, stored=stored) == [None]
    # a fact whose stored twin was deleted meanwhile is skipped, not written
    assert similar_fact_contexts(index(), "ann", vectors, ["x"], [3], window=64,
                                 stored=lambda i: None) == [None]
