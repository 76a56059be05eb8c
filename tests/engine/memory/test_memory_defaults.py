"""The product defaults out of the box: facts added together are encoded at W=256 in runs of
512 tokens (one save request per run), and every read repairs the 2 facts most relevant to the
query as text before the question (layout.QUALITY_LAYOUT), through Memory and KVMemory alike.
"""

from __future__ import annotations

import dataclasses

import pytest

from inferscale_engine.config import EngineConfig
from inferscale_engine.layout import QUALITY_LAYOUT, USER_BLOCK_HEADER, Layout
from inferscale_engine.memory import Memory
from tests.conftest import FACTS, greedy, running_engine
from tests.engine.memory.memory_support import HashEmbedder

pytestmark = pytest.mark.vllm

DEFAULTS = {f.name: f.default for f in dataclasses.fields(EngineConfig)
            if f.name in ("context_window_tokens", "context_run_tokens", "layout")}


def test_the_defaults_are_the_dev_grid_choice():
    assert DEFAULTS == {"context_window_tokens": 256, "context_run_tokens": 512,
                        "layout": QUALITY_LAYOUT}
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


def test_memory_uses_runs_and_the_quality_layout(engine, tmp_path):
    with Memory(engine, str(tmp_path / "d.db"), HashEmbedder(), progress_bar=False) as mem:
        before = engine.stats().counters.get("save_requests", 0)
        mem.add(user_id="dee", texts=FACTS)
        assert engine.stats().counters["save_requests"] - before == 1  # one run
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
