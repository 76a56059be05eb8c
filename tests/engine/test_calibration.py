"""Key temperature calibration: a fit round-trips, binds to its model, refused for another."""

from __future__ import annotations

import math

import pytest

from inferscale_engine.errors import ConfigError
from inferscale_engine.model.calibration import Calibration, first_token_kl, fit
from tests.conftest import FACTS, engine_config, running_engine

pytestmark = pytest.mark.vllm


def test_fit_round_trip_and_refusal_for_another_model(tiny_models, tmp_path):
    path = tmp_path / "calibration.json"
    with running_engine(tiny_models["qwen2"]) as engine:
        result = fit(engine, FACTS, [None] * len(FACTS), scales=(0.5, 1.0), num_sets=3, k=3)
        assert set(result.mean_kl) == {"0.5", "1"} and all(v >= 0 for v in result.mean_kl.values())
        assert result.mean_kl["1"] < result.mean_kl["0.5"]  # halving keys moves kv away
        assert result.key_scale == 1.0 and result.fingerprint == engine.fingerprint
        assert engine.get_facts("inferscale-calibration-0.5") == []  # scratch users removed
        Calibration(0.9, engine.fingerprint, result.mean_kl, 3, 0.0).save(path)
        assert Calibration.load(path, engine.fingerprint).key_scale == 0.9
    with running_engine(tiny_models["qwen2"], calibration=str(path)) as engine:
        (fact,) = engine.add_facts("u", [FACTS[0]])
        assert engine._facts[fact].key_scale == (0.9,)  # the fit is applied
    with pytest.raises(ConfigError, match="fitted for another model"):
        with running_engine(tiny_models["llama"], calibration=str(path)):
            pass
    with pytest.raises(ConfigError, match="not both"):
        engine_config(tiny_models["llama"], calibration=str(path), key_scale=0.8)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot be read"):
        Calibration.load(path, "x")


def test_first_token_kl_is_exact_on_full_distributions():
    p = {0: math.log(0.5), 1: math.log(0.3), 2: math.log(0.2)}
    q = {0: math.log(0.2), 1: math.log(0.3), 2: math.log(0.5)}
    exact = sum(math.exp(p[t]) * (p[t] - q[t]) for t in p)
    assert first_token_kl(p, q) == pytest.approx(exact, rel=1e-9) and first_token_kl(p, p) == 0.0
