"""RopeSpec: the model's own rotary embedding, read from its Hugging Face config.

Stored keys are re-rotated from one position to another (Chunked RoPE). That is exact only if we
use the same frequencies as the serving engine, so inverse frequencies are computed with the same
fp32 formulas vLLM uses (default, linear, llama3, yarn, longrope). Magnitude scaling (yarn's and
LongRoPE's mscale) is already inside the stored keys and is never applied again: re-rotation is
a pure rotation. A model may rotate its layer types differently (Gemma 3: local layers with
one base, global layers with another): `layer_rope_specs` gives one spec per layer.

LongRoPE (Phi-3 / Phi-4-mini) has a short and a long factor set. vLLM (0.26 and 0.32, since
vllm-project/vllm#27431) picks ONE set per engine: long iff max_model_len >
original_max_position_embeddings, for every position of every request, so no request ever
switches sets mid-sequence. Stored keys are re-rotated with that same set, chosen from the
same max_model_len; no request has to fall back to text mode.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

import torch

from inferscale_engine.errors import UnsupportedModelError
from inferscale_engine.kernels.rope_tables import RopeTables

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")

# Architectures whose attention we have checked (tests/invariants/test_model_families.py): RoPE
# style and the config fields we rely on. GPT-J applies RoPE to adjacent pairs (interleaved) and
# only to `rotary_dim` of each head; Phi-3 to the first partial_rotary_factor of each head.
_ARCHITECTURE_STYLES = {
    "LlamaForCausalLM": "rotate_half",
    "MistralForCausalLM": "rotate_half",
    "Qwen2ForCausalLM": "rotate_half",
    "Qwen3ForCausalLM": "rotate_half",
    "GPTJForCausalLM": "interleaved",
    "MixtralForCausalLM": "rotate_half",
    "Qwen2MoeForCausalLM": "rotate_half",
    "Qwen3MoeForCausalLM": "rotate_half",
    "Olmo2ForCausalLM": "rotate_half",
    "GraniteForCausalLM": "rotate_half",
    "Phi3ForCausalLM": "rotate_half",
    "Gemma2ForCausalLM": "rotate_half",
    "Gemma3ForCausalLM": "rotate_half",
}
SUPPORTED_ARCHITECTURES = tuple(sorted(_ARCHITECTURE_STYLES))


class RopeStyle(enum.Enum):
    """Which dimensions form a rotation pair."""

    ROTATE_HALF = "rotate_half"
    """Pairs (i, i + rotary_dim/2): GPT-NeoX / Llama / Qwen ("neox")."""
    INTERLEAVED = "interleaved"
    """Pairs (2i, 2i+1): GPT-J."""


@dataclass(frozen=True, slots=True)
class RopeSpec:
    """Everything needed to rotate a key from one position to another."""

    style: RopeStyle
    head_dim: int
    rotary_dim: int
    rope_type: str
    theta: float
    params: tuple[tuple[str, Any], ...] = ()
    """Scaling parameters (factor, low_freq_factor, ...) as sorted (key, value) pairs."""

    def __post_init__(self) -> None:
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(_unsupported_message(self.rope_type))
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise UnsupportedModelError(
                f"rotary_dim {self.rotary_dim} must be even and in (0, head_dim={self.head_dim}]"
            )

    @property
    def param_dict(self) -> dict[str, Any]:
        """Scaling parameters as a dict."""
        return dict(self.params)

    @property
    def position_divisor(self) -> float:
        """Linear scaling divides positions by its factor before multiplying by inv_freq."""
        return float(self.param_dict["factor"]) if self.rope_type == "linear" else 1.0

    def inv_freq(self) -> torch.Tensor:
        """Inverse frequencies, fp32, shape [rotary_dim // 2], computed as vLLM computes them."""
        dim = self.rotary_dim
        exponents = torch.arange(0, dim, 2, dtype=torch.float) / dim
        if self.rope_type in ("default", "linear"):
            return 1.0 / (self.theta ** exponents)
        if self.rope_type == "longrope":  # vLLM Phi3LongRoPEScaledRotaryEmbedding
            factors = torch.tensor(self.param_dict["factors"], dtype=torch.float32)
            return 1.0 / (factors * (self.theta ** exponents))
        if self.rope_type == "llama3":
            return _llama3_inv_freq(1.0 / (self.theta ** exponents), self.param_dict)
        return _yarn_inv_freq(self.theta ** exponents, dim, self.theta, self.param_dict)

    def cos_sin(self, num_positions: int, device: torch.device | str = "cpu"
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotation tables for positions 0..num_positions-1.

        Returns:
            cos, sin: fp32 [num_positions, rotary_dim // 2] (no yarn mscale: pure rotations).
        """
        inv_freq = self.inv_freq()
        positions = torch.arange(num_positions, dtype=torch.float)
        if self.rope_type == "linear":
            positions = positions / self.position_divisor
        angles = torch.einsum("i,j -> ij", positions, inv_freq)
        return angles.cos().to(device), angles.sin().to(device)

    def tables(self, num_positions: int, device: torch.device | str = "cpu") -> RopeTables:
        """cos_sin() and the pairing style as the one record every KV mover takes."""
        return RopeTables(*self.cos_sin(num_positions, device), self.style.value)

    @classmethod
    def from_hf_config(cls, config: Any, max_model_len: int | None = None,
                       layer_type: str | None = None) -> RopeSpec:
        """Read the spec from a transformers PretrainedConfig; refuse what we cannot re-rotate.

        Args:
            config: the model's config (its text config is used).
            max_model_len: the engine's max_model_len; LongRoPE picks its factor set from it.
            layer_type: an entry of config.layer_types, for models whose rope_parameters are
                nested by layer type (Gemma 3); default: the full-attention layers'.
        """
        architectures = list(getattr(config, "architectures", None) or [])
        arch = next((a for a in architectures if a in _ARCHITECTURE_STYLES), None)
        if arch is None:
            raise UnsupportedModelError(
                f"architecture {architectures or '(none)'} is not supported; supported: "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}. Stored KV must be re-rotated with the "
                "model's exact RoPE, so each architecture is enabled only once it is tested."
            )
        config = getattr(config, "get_text_config", lambda: config)()
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads)
        params = _rope_parameters(config, layer_type)
        rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
        theta = float(params.pop("rope_theta"))
        partial = params.pop("partial_rotary_factor", None) or getattr(
            config, "partial_rotary_factor", 1.0)
        rotary_dim = int(getattr(config, "rotary_dim", None) or head_dim * partial)
        if rope_type == "yarn":
            params.setdefault("original_max_position_embeddings",
                              config.max_position_embeddings)
        if rope_type == "longrope":
            params = _longrope_factor_set(config, params, max_model_len)
        keep = _PARAM_KEYS.get(rope_type, ())
        return cls(
            style=RopeStyle(_ARCHITECTURE_STYLES[arch]),
            head_dim=int(head_dim),
            rotary_dim=rotary_dim,
            rope_type=rope_type,
            theta=theta,
            params=tuple(sorted((k, v) for k, v in params.items() if k in keep)),
        )


def layer_rope_specs(config: Any, max_model_len: int) -> tuple[RopeSpec, ...]:
    """One RopeSpec per decoder layer, in layer order (equal specs where the layers share one).

    Gemma 3 nests rope_parameters by layer type (`layer_types`): its sliding-window layers
    rotate with a local base, its global layers with another (and linear scaling).
    """
    text_config = getattr(config, "get_text_config", lambda: config)()
    num_layers = int(text_config.num_hidden_layers)
    if not _is_nested(getattr(text_config, "rope_parameters", None)):
        return (RopeSpec.from_hf_config(config, max_model_len),) * num_layers
    layer_types = list(getattr(text_config, "layer_types", None) or [])
    if len(layer_types) != num_layers:
        raise UnsupportedModelError(
            f"rope_parameters are given per layer type but layer_types has {len(layer_types)} "
            f"entries for {num_layers} layers; the config is inconsistent")
    specs = {t: RopeSpec.from_hf_config(config, max_model_len, t) for t in set(layer_types)}
    return tuple(specs[t] for t in layer_types)


_PARAM_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate"),
    "longrope": ("factors", "long", "original_max_position_embeddings"),
}


def _is_nested(rope_parameters: Any) -> bool:
    """rope_parameters keyed by layer type ({"full_attention": {...}, ...}), as Gemma 3's."""
    return isinstance(rope_parameters, dict) and bool(rope_parameters) and all(
        isinstance(v, dict) for v in rope_parameters.values())


def _rope_parameters(config: Any, layer_type: str | None) -> dict[str, Any]:
    """A flat copy of the rope parameters of `layer_type`'s layers (with rope_theta set)."""
    params = getattr(config, "rope_parameters", None) or {}
    if _is_nested(params):
        layer_type = layer_type or "full_attention"
        if layer_type not in params:
            raise UnsupportedModelError(
                f"rope_parameters has no entry for layer type {layer_type!r} (has "
                f"{sorted(params)}); the config is inconsistent")
        params = params[layer_type]
    params = dict(params)
    legacy = getattr(config, "rope_scaling", None)
    if legacy and not params:
        params = dict(legacy)
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return params


def _longrope_factor_set(config: Any, params: dict[str, Any], max_model_len: int | None
                         ) -> dict[str, Any]:
    """LongRoPE's parameters with the one factor set vLLM uses for this max_model_len."""
    if max_model_len is None:
        raise ValueError("LongRoPE picks its factor set from max_model_len; pass it")
    params.setdefault("original_max_position_embeddings", getattr(
        config, "original_max_position_embeddings", None) or config.max_position_embeddings)
    # short_mscale / long_mscale are magnitudes: already inside the stored keys, never re-applied.
    long = max_model_len > int(params["original_max_position_embeddings"])
    factors = params["long_factor" if long else "short_factor"]
    return dict(params, factors=tuple(float(f) for f in factors), long=long)


def _unsupported_message(rope_type: str) -> str:
    reason = {
        "dynamic": "changes frequencies with sequence length, so stored keys cannot be re-rotated",
        "mrope": "uses multi-dimensional positions",
    }.get(rope_type, "is not implemented")
    return (f"rope_type {rope_type!r} {reason}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}. "
            "Serve this model in text mode or choose a model with a supported RoPE.")


def _llama3_inv_freq(inv_freq: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 frequency smoothing (vLLM Llama3RotaryEmbedding._compute_inv_freq)."""
    factor, low = float(p["factor"]), float(p["low_freq_factor"])
    high = float(p["high_freq_factor"])
    orig = float(p["original_max_position_embeddings"])
    low_freq_wavelen, high_freq_wavelen = orig / low, orig / high
    wave_len = 2 * math.pi / inv_freq
    smooth = (orig / wave_len - low) / (high - low) if low != high else 0
    return torch.where(
        wave_len < high_freq_wavelen,
        inv_freq,
        torch.where(wave_len > low_freq_wavelen, inv_freq / factor,
                    (1 - smooth) * inv_freq / factor + smooth * inv_freq),
    )


def _yarn_inv_freq(pos_freqs: torch.Tensor, dim: int, base: float, p: dict[str, Any]
                   ) -> torch.Tensor:
    """YaRN frequency blend (vLLM YaRNScalingRotaryEmbedding._compute_inv_freq)."""
    factor = float(p["factor"])
    beta_fast, beta_slow = p.get("beta_fast", 32), p.get("beta_slow", 1)
    orig = p["original_max_position_embeddings"]

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float) - low) / (high - low), 0, 1)
    mask = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - mask) + (1.0 / pos_freqs) * mask
