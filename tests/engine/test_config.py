"""EngineConfig / ConnectorConfig validation."""

from __future__ import annotations

import pytest

from inferscale_engine.config import SECRET_ENV, ConnectorConfig, EngineConfig, plan_secret
from inferscale_engine.errors import ConfigError


@pytest.mark.parametrize("kwargs,match", [
    ({"model": ""}, "model"),
    ({"model": "m", "dtype": "int8"}, "dtype"),
    ({"model": "m", "slab_capacity_bytes": 0}, "slab_capacity_bytes"),
    ({"model": "m", "context_window_tokens": -1}, "context_window_tokens"),
    ({"model": "m", "max_fact_tokens": 4050, "max_model_len": 4096}, "below max_model_len"),
    ({"model": "m", "vllm_overrides": {"kv_transfer_config": None}}, "engine owns"),
    ({"model": "m", "gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
])
def test_bad_engine_config(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        EngineConfig(**kwargs)


def test_connector_config_round_trip_and_unknown_keys(monkeypatch):
    config = ConnectorConfig(slab_pages=4, page_tokens=16, max_positions=128)
    assert ConnectorConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="unknown connector options"):
        ConnectorConfig.from_dict({"inferscale": {**config.to_dict()["inferscale"], "x": 1}})
    with pytest.raises(ConfigError, match="inferscale"):
        ConnectorConfig.from_dict({})
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(ConfigError, match=SECRET_ENV):
        _ = config.secret
    key = plan_secret()
    assert config.secret == key and len(key) == 32 and plan_secret() == key
