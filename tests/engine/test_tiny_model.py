"""Reference configs (load_format="dummy" on the GPU) are valid where it matters, on CPU."""

from __future__ import annotations

import pytest

from tests.tiny_model import REFERENCE_CONFIGS, dummy_model_path


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("INFERSCALE_CACHE", str(tmp_path_factory.getbasetemp() / "reference"))


@pytest.mark.parametrize("name", list(REFERENCE_CONFIGS))
def test_reference_config_loads_and_is_served(name):
    from transformers import AutoConfig, AutoTokenizer

    from inferscale_engine.config import EngineConfig
    from inferscale_engine.model.check import check_model

    path = dummy_model_path(name)
    config = AutoConfig.from_pretrained(path)
    assert config.architectures == REFERENCE_CONFIGS[name]["architectures"]
    assert len(AutoTokenizer.from_pretrained(path)) == config.vocab_size  # every id decodes
    for max_model_len in (4096, 8192):
        _, specs = check_model(EngineConfig(model=str(path), dtype="bfloat16",
                                            max_model_len=max_model_len, load_format="dummy"))
        assert len(specs) == config.num_hidden_layers


def test_gemma3_rotates_local_and_global_layers_apart():
    from transformers import AutoConfig

    from inferscale_engine.model.rope import layer_rope_specs

    specs = layer_rope_specs(AutoConfig.from_pretrained(dummy_model_path("gemma-3-12b")), 4096)
    assert [(s.rope_type, s.theta) for s in specs[:6]] == (
        [("default", 10000.0)] * 5 + [("linear", 1000000.0)])
    assert specs[5].position_divisor == 8.0 and specs[47] == specs[5]


def test_phi4_mini_picks_its_longrope_set_from_max_model_len():
    from transformers import AutoConfig

    from inferscale_engine.model.rope import layer_rope_specs

    config = AutoConfig.from_pretrained(dummy_model_path("phi-4-mini"))
    short, long = layer_rope_specs(config, 4096)[0], layer_rope_specs(config, 8192)[0]
    assert short.rotary_dim == 96 and len(short.param_dict["factors"]) == 48
    assert not short.param_dict["long"] and set(short.param_dict["factors"]) == {1.0}
    assert long.param_dict["long"] and long.param_dict["factors"][-1] == 47.77


def test_an_edited_entry_replaces_the_cached_config(monkeypatch):
    import json

    path = dummy_model_path("qwen3-8b")
    edited = dict(REFERENCE_CONFIGS["qwen3-8b"], num_hidden_layers=2)
    monkeypatch.setitem(REFERENCE_CONFIGS, "qwen3-8b", edited)
    assert json.loads((dummy_model_path("qwen3-8b") / "config.json").read_text()) == edited
    assert dummy_model_path("qwen3-8b") == path


def test_dummy_tokenizer_decodes_every_id_and_encodes_as_the_tiny_one():
    """Filler ids decode to text (a dummy-weight model samples anywhere in its vocabulary) and
    encoding never produces them (prompts are the tiny tokenizer's)."""
    from transformers import AutoTokenizer

    from tests.tiny_model import TinyModelSpec, corpus_sentences

    tokenizer = AutoTokenizer.from_pretrained(dummy_model_path("llama-3.1-8b"))
    top = REFERENCE_CONFIGS["llama-3.1-8b"]["vocab_size"] - 1
    fillers = [TinyModelSpec().vocab_size, 70_000, top]
    pieces = [tokenizer.decode([i]) for i in fillers]
    assert all(p.startswith(" q") and len(p) > 2 for p in pieces) and len(set(pieces)) == 3
    text = " ".join(corpus_sentences()[:50]) + "".join(pieces)
    assert max(tokenizer(text).input_ids) < TinyModelSpec().vocab_size
