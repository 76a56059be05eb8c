"""RopeSpec: the model's own rotary embedding, read from its Hugging Face config.

Stored keys are re-rotated from one position to another (Chunked RoPE). That is exact only if we
use the same frequencies as the serving engine, so inverse frequencies are computed with the same
fp32 formulas vLLM uses (default, linear, llama3, yarn). Magnitude scaling (yarn's mscale) is
already inside the stored keys and is never applied again: re-rotation is a pure rotation.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

import torch

from inferscale_engine.errors import UnsupportedModelError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")

# Architectures whose attention we have checked: RoPE style and the config fields we rely on.
# GPT-J applies RoPE to adjacent pairs (interleaved) and only to `rotary_dim` of each head.
_ARCHITECTURE_STYLES = {
    "LlamaForCausalLM": "rotate_half",
    "MistralForCausalLM": "rotate_half",
    "Qwen2ForCausalLM": "rotate_half",
    "Qwen3ForCausalLM": "rotate_half",
    "GPTJForCausalLM": "interleaved",
}


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

    @classmethod
    def from_hf_config(cls, config: Any) -> RopeSpec:
        """Read the spec from a transformers PretrainedConfig; refuse what we cannot re-rotate."""
        architectures = list(getattr(config, "architectures", None) or [])
        arch = next((a for a in architectures if a in _ARCHITECTURE_STYLES), None)
        if arch is None:
            raise UnsupportedModelError(
                f"architecture {architectures or '(none)'} is not supported; supported: "
                f"{', '.join(sorted(_ARCHITECTURE_STYLES))}. Stored KV must be re-rotated with the "
                "model's exact RoPE, so each architecture is enabled only once it is tested."
            )
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads)
        params = dict(getattr(config, "rope_parameters", None) or {})
        legacy = getattr(config, "rope_scaling", None)
        if legacy and not params:
            params = dict(legacy)
        params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
        rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
        theta = float(params.pop("rope_theta"))
        partial = params.pop("partial_rotary_factor", None) or getattr(
            config, "partial_rotary_factor", 1.0)
        rotary_dim = int(getattr(config, "rotary_dim", None) or head_dim * partial)
        if rope_type == "yarn":
            params.setdefault("original_max_position_embeddings",
                              config.max_position_embeddings)
        keep = _PARAM_KEYS.get(rope_type, ())
        return cls(
            style=RopeStyle(_ARCHITECTURE_STYLES[arch]),
            head_dim=int(head_dim),
            rotary_dim=rotary_dim,
            rope_type=rope_type,
            theta=theta,
            params=tuple(sorted((k, v) for k, v in params.items() if k in keep)),
        )


_PARAM_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate"),
}


def _unsupported_message(rope_type: str) -> str:
    reason = {
        "dynamic": "changes frequencies with sequence length, so stored keys cannot be re-rotated",
        "longrope": "switches frequency tables at a length threshold, so stored keys cannot be "
                    "re-rotated",
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
