"""Key temperature calibration: fit the key_scale that brings injected KV closest to text.

`inferscale calibrate` encodes a sample of a user's own facts at each candidate scale and
compares the first answer token's distribution with the facts injected (kv) and prefilled
(text) on random fact sets: the scale with the lowest mean KL(text || kv) wins. No gold
answers are needed. The fit is saved with the model's fingerprint and refused for another
model (EngineConfig.calibration).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferscale_engine.errors import ConfigError, InvalidFactError
from inferscale_engine.facts import MemoryHandle

PROBES = ("What do you remember about me?", "Tell me one thing you know about me.")
"""Questions asked of every fact set: generic, so no gold answer is needed."""


@dataclass(frozen=True, slots=True)
class Calibration:
    """A fitted key temperature and what it was fitted on."""

    key_scale: float
    fingerprint: str
    """Model identity (see model_fingerprint): the fit is refused for any other model."""
    mean_kl: dict[str, float]
    """Mean first-token KL(text || kv) per candidate scale."""
    num_sets: int
    created_at: float

    def save(self, path: str | Path) -> None:
        """Write the fit as JSON."""
        Path(path).write_text(json.dumps({
            "key_scale": self.key_scale, "fingerprint": self.fingerprint,
            "mean_kl": self.mean_kl, "num_sets": self.num_sets,
            "created_at": self.created_at}, indent=1))

    @classmethod
    def load(cls, path: str | Path, fingerprint: str) -> Calibration:
        """Read a fit made for the model of `fingerprint`.

        Raises:
            ConfigError: unreadable, or fitted for another model.
        """
        try:
            raw = json.loads(Path(path).read_text())
            fit = cls(float(raw["key_scale"]), str(raw["fingerprint"]),
                      {str(k): float(v) for k, v in raw["mean_kl"].items()},
                      int(raw["num_sets"]), float(raw["created_at"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"calibration {str(path)!r} cannot be read ({exc!r}); run "
                              "`inferscale calibrate` again") from None
        if fit.fingerprint != fingerprint:
            raise ConfigError(f"calibration {str(path)!r} was fitted for another model "
                              f"(fingerprint {fit.fingerprint}, this model {fingerprint}); "
                              "calibrate this model with `inferscale calibrate`")
        return fit


def model_fingerprint(hf_config: Any, tokenizer: Any, dtype: str) -> str:
    """What a key scale depends on: the architecture, its weights' identity, the tokenizer."""
    config = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(vars(hf_config))
    config.pop("_name_or_path", None)
    vocab = getattr(tokenizer, "backend_tokenizer", None)
    blob = json.dumps({"config": config, "dtype": dtype,
                       "tokenizer": vocab.to_str() if vocab is not None else repr(tokenizer)},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def fit(engine: Any, texts: Sequence[str], contexts: Sequence[str | None],
        scales: Sequence[float] = (0.8, 0.9, 1.0, 1.1), num_sets: int = 12, k: int = 8,
        seed: int = 0, logprobs: int = 20) -> Calibration:
    """Fit the key scale on a user's facts (their texts and encoding contexts).

    Each candidate scale encodes the sampled facts under a scratch user (deleted afterwards);
    every fact set is asked PROBES in text mode once and in kv mode per scale.
    """
    from vllm import SamplingParams

    if len(texts) < 2:
        raise ConfigError("calibration needs at least 2 facts of the user")
    rng = random.Random(seed)
    size = min(k, len(texts))
    sets = [rng.sample(range(len(texts)), size) for _ in range(num_sets)]
    used = sorted({i for s in sets for i in s})
    sampling = SamplingParams(max_tokens=1, temperature=0.0, logprobs=logprobs)
    kl: dict[str, float] = {}
    reference: list[dict[int, float]] | None = None
    for scale in scales:
        user = f"inferscale-calibration-{scale:g}-{time.time_ns()}"
        ids = engine.add_facts(user, [texts[i] for i in used], [contexts[i] for i in used],
                               key_scale=scale)
        by_index = dict(zip(used, ids, strict=True))
        try:
            requests = [(MemoryHandle(user, tuple(by_index[i] for i in s)), probe)
                        for s in sets for probe in PROBES]
            if reference is None:
                reference = [g.first_token_logprobs for g in engine.generate_many(
                    requests, sampling, mode="text")]
            kv = engine.generate_many(requests, sampling, mode="kv")
            kl[f"{scale:g}"] = sum(first_token_kl(r, g.first_token_logprobs)
                                   for r, g in zip(reference, kv, strict=True)) / len(kv)
        finally:
            engine.delete(user, ids)
    best = min(scales, key=lambda s: kl[f"{s:g}"])
    return Calibration(float(best), engine.fingerprint, kl, num_sets, time.time())


def first_token_kl(reference: Mapping[int, float], other: Mapping[int, float]) -> float:
    """KL(reference || other) of two next-token distributions known only by their top-N.

    The distributions are coarse-grained onto the union U of both top-N token sets plus one
    bucket for every other token. A token of U missing from one side's top-N gets, on that
    side, the smaller of that side's N-th probability (its upper bound) and an even share of
    the side's leftover mass; the bucket holds what is left, so each side sums to 1. With
    N = vocabulary size this is the exact KL. Otherwise it is an estimate whose error is bounded by
    the mass outside the top-N (reported per answer as top_n_mass; ~0.9+ at N=100 here).
    """
    union = set(reference) | set(other)
    p = _coarse_grained(reference, union)
    q = _coarse_grained(other, union)
    total = 0.0
    for token, p_token in p.items():
        if p_token > 0.0:
            total += p_token * (math.log(p_token) - math.log(max(q[token], 1e-30)))
    return max(total, 0.0)


def _coarse_grained(logprobs: Mapping[int, float], union: set[int]) -> dict[object, float]:
    probs: dict[object, float] = {int(t): math.exp(lp) for t, lp in logprobs.items()}
    leftover = max(0.0, 1.0 - sum(probs.values()))
    missing = [t for t in union if t not in probs]
    if missing:
        fill = min(min(probs.values()), leftover / (len(missing) + 1))
        for token in missing:
            probs[token] = fill
        leftover -= fill * len(missing)
    probs["rest"] = max(leftover, 0.0)
    return probs


def engine_key_scale(config: Any, fingerprint: str, num_layers: int) -> tuple[float, ...]:
    """An engine's per-layer key scale (ConfigError if it does not fit the model).

    Its calibration's (bound to `fingerprint`), else EngineConfig.key_scale.
    """
    scale = (config.key_scale if config.calibration is None
             else Calibration.load(config.calibration, fingerprint).key_scale)
    return key_scale_tuple(scale, num_layers, ConfigError)


def key_scale_tuple(value: float | tuple[float, ...], num_layers: int,
                    error: type[Exception] = InvalidFactError) -> tuple[float, ...]:
    """A key_scale as stored in plans: () for 1, else one value or one per layer."""
    scales = tuple(float(v) for v in (value if isinstance(value, tuple) else (value,)))
    if len(scales) not in (1, num_layers) or not all(0 < v < 100 for v in scales):
        raise error(f"key_scale={value!r} must be a positive number or one per layer "
                    f"({num_layers})")
    return () if scales == (1.0,) else scales
