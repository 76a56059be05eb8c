"""contexts.similar_contexts: a fact's context is made of its most similar EARLIER facts."""

import numpy as np
import pytest

from inferscale_engine.prompting.contexts import similar_contexts
from inferscale_engine.prompting.prompt import FACT_FORMAT


def _unit(rows: list[list[float]]) -> np.ndarray:
    matrix = np.asarray(rows, dtype=np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def test_picks_most_similar_earlier_facts_within_the_budget_in_added_order() -> None:
    texts = ["dog A", "cat B", "dog C", "car D", "dog E"]
    vectors = _unit([[1, 0, 0], [0, 1, 0], [0.9, 0.1, 0], [0, 0, 1], [1, 0.05, 0]])
    out = similar_contexts(vectors, [10] * 5, texts, window=20)
    assert out[0] is None  # nothing before the first fact
    assert out[1] == FACT_FORMAT.format(text="dog A")  # the only earlier fact fits
    # fact 4 ('dog E'): the two most similar earlier facts are 'dog A' and 'dog C', written in
    # the order they were added; 'cat B' and 'car D' do not fit the 20-token budget
    assert out[4] == FACT_FORMAT.format(text="dog A") + FACT_FORMAT.format(text="dog C")


def test_first_new_skips_stored_facts_and_a_zero_window_gives_no_context() -> None:
    texts = ["a", "b", "c"]
    vectors = _unit([[1, 0], [0, 1], [1, 1]])
    assert similar_contexts(vectors, [3, 3, 3], texts, window=100, first_new=2) == [
        FACT_FORMAT.format(text="a") + FACT_FORMAT.format(text="b")]
    assert similar_contexts(vectors, [3, 3, 3], texts, window=0) == [None, None, None]


def test_long_facts_are_skipped_but_shorter_less_similar_ones_still_fill_the_budget() -> None:
    texts = ["long twin", "short cousin", "new"]
    vectors = _unit([[1, 0], [0.5, 0.5], [1, 0.01]])
    assert similar_contexts(vectors, [50, 5, 5], texts, window=10)[2] == FACT_FORMAT.format(
        text="short cousin")


def test_mismatched_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="2 vectors, 3 lengths"):
        similar_contexts(np.zeros((2, 4)), [1, 1, 1], ["a", "b", "c"], window=8)
