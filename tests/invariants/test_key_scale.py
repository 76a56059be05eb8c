"""Key temperature: facts encoded with key_scale store scaled keys (values untouched); the
plan's MAC covers the scale; 1.0 leaves the stored keys exact."""

from __future__ import annotations

import pytest
import torch

from inferscale_engine.errors import ConfigError
from tests.conftest import FACTS, engine_config, running_engine

pytestmark = pytest.mark.vllm


def test_stored_keys_are_scaled_and_values_are_not(tiny_models):
    with running_engine(tiny_models["llama"]) as engine:
        (plain,) = engine.add_facts("u", [FACTS[0]])
        (cool,) = engine.add_facts("u", [FACTS[0]], key_scale=0.5)
        (keys, values, _), = engine.workers.read_entry(engine._facts[plain].slab_key)
        (cool_keys, cool_values, _), = engine.workers.read_entry(engine._facts[cool].slab_key)
        assert torch.equal(values, cool_values)
        torch.testing.assert_close(cool_keys, keys * 0.5, rtol=1e-6, atol=1e-7)
        per_layer = tuple(float(i + 1) for i in range(keys.shape[0]))
        (layered,) = engine.add_facts("u", [FACTS[0]], key_scale=per_layer)
        (layered_keys, _, _), = engine.workers.read_entry(engine._facts[layered].slab_key)
        factor = torch.tensor(per_layer).view(-1, 1, 1, 1)
        torch.testing.assert_close(layered_keys, keys * factor, rtol=1e-6, atol=1e-6)
        (one,) = engine.add_facts("u", [FACTS[2]], key_scale=1.0)
        assert engine._facts[one].key_scale == ()  # 1.0 is no scale at all
        with pytest.raises(Exception, match="key_scale"):
            engine.add_facts("u", [FACTS[1]], key_scale=-1.0)


def test_bad_key_scales_fail_at_start():
    with pytest.raises(ConfigError, match="key_scale"):
        engine_config("unused", key_scale=0.0)
    with pytest.raises(ConfigError, match="key_scale"):
        engine_config("unused", key_scale=(1.0, float("nan")))
