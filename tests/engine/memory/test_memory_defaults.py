"""The product defaults out of the box: a fact added as text is encoded after the user's
earlier facts most similar to it (W=256, context_source 'similar'), and every read repairs the 2
facts most relevant to the query as text before the question (layout.QUALITY_LAYOUT), through
Memory and KVMemory alike.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from inferscale_engine.config import EngineConfig
from inferscale_engine.memory import Memory
from inferscale_engine.memory.store.reserved import CONTEXT_KEY
from inferscale_engine.prompting.layout import QUALITY_LAYOUT, USER_BLOCK_HEADER, Layout
from tests.conftest import FACTS, greedy, running_engine
from tests.engine.memory.memory_support import HashEmbedder

pytestmark = pytest.mark.vllm

DEFAULTS = {f.name: f.default for f in dataclasses.fields(EngineConfig)
            if f.name in ("context_window_tokens", "context_run_tokens", "context_source",
                          "layout")}


def test_the_defaults_are_the_dev_grid_choice():
    assert DEFAULTS == {"context_window_tokens": 256, "context_run_tokens": 512,
                        "context_source": "similar", "layout": QUALITY_LAYOUT}
    with pytest.raises(Exception, match="context_source must be one of"):
        EngineConfig(model="unused", context_source="neighbours")
    assert QUALITY_LAYOUT == Layout(repair_facts=2, repair_placement="user")
    with pytest.raises(Exception, match="must be below max_model_len"):
        EngineConfig(model="unused", max_model_len=1024)  # 256 + 256 + 512: say which to lower
    assert EngineConfig(model="unused").user_block_header == USER_BLOCK_HEADER
    assert "facts about the user" in USER_BLOCK_HEADER  # continues DEFAULT_SYSTEM_PROMPT
    with pytest.raises(Exception, match="user_block_header must be a non-empty string"):
        EngineConfig(model="unused", user_block_header=" \n")


@pytest.fixture(scope="module")
def engine(tiny_models):
    with running_engine(tiny_models["qwen2"], max_model_len=2048, **DEFAULTS) as eng:
        yield eng


def test_memory_uses_similar_contexts_and_the_quality_layout(engine, tmp_path):
    with Memory(engine, str(tmp_path / "d.db"), HashEmbedder(), progress_bar=False) as mem:
        before = engine.stats().counters.get("save_requests", 0)
        ids = [r.fact_id for r in mem.add(user_id="dee", texts=FACTS)]
        # each fact after the earlier facts most similar to it; these five all fit W, so each
        # is encoded after every fact before it, and the write path chains the contexts into
        # one save request
        stored = mem._store.get(user_id="dee", fact_ids=ids)
        assert CONTEXT_KEY not in stored[0].metadata
        assert [f.metadata[CONTEXT_KEY] for f in stored[1:]] == [
            "".join(f"- {t}\n" for t in FACTS[:i]) for i in range(1, len(FACTS))]
        assert engine.stats().counters["save_requests"] - before == 1
        out = mem.generate(user_id="dee", query="Where does John play?", k=5,
                           sampling=greedy(4))
        assert out.plan_status == "inject" and out.num_repaired_facts == 2
        prompt = mem.prepare(user_id="dee", query="Where does John play?", k=5,
                             messages=[{"role": "user", "content": "Where does John play?"}])
        text = engine.tokenizer.decode(prompt.token_ids)
        assert USER_BLOCK_HEADER.strip() in text
        repaired = text[text.index(USER_BLOCK_HEADER.strip()):]
        assert sum(f in repaired for f in FACTS) == 2
        # Layout() is one argument away: every fact injected.
        plain = mem.generate(user_id="dee", query="Where does John play?", k=5,
                             sampling=greedy(4), layout=Layout())
        assert plain.num_repaired_facts == 0
        assert plain.num_injected_tokens > out.num_injected_tokens


def test_similar_contexts_are_rebuilt_exactly_after_a_restart(engine, tmp_path):
    db = str(tmp_path / "r.db")
    with Memory(engine, db, HashEmbedder(), progress_bar=False) as mem:
        ids = [r.fact_id for r in mem.add(user_id="rae", texts=FACTS[:3])]
        ids += [r.fact_id for r in mem.add(user_id="rae", texts=FACTS[3:])]
        contexts = [f.metadata.get(CONTEXT_KEY) for f in mem._store.get(user_id="rae",
                                                                       fact_ids=ids)]
        before = {i: engine.workers.read_entry(engine._facts[i].slab_key)[0][:2] for i in ids}
    # the second call's facts were encoded after similar facts of the first call
    assert all(any(f"- {t}\n" in c for t in FACTS[:3]) for c in contexts[3:])
    with Memory(engine, db, HashEmbedder(), startup="encode", progress_bar=False) as mem:
        for i in ids:
            keys, values = engine.workers.read_entry(engine._facts[i].slab_key)[0][:2]
            assert torch.equal(keys, before[i][0]) and torch.equal(values, before[i][1])
