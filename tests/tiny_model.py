"""Tiny random-init models with a locally trained tokenizer (no network).

Tests, the demo and CPU benchmarks need a model that vLLM loads in seconds and that exercises
the real architecture code (RoPE variants, GQA, qkv bias, MoE, QK-norm, sliding windows).
Weights are random but scaled up (std ~0.08) so attention is far from uniform and numerical
tests keep their power.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from inferscale_engine.model.small_model import default_cache_dir

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_NAMES = ["Alice", "Bob", "Caroline", "Melanie", "John", "Maria", "Wei", "Priya", "Omar", "Lena"]
_PLACES = ["Paris", "Boston", "Kyoto", "Lagos", "Lima", "Oslo", "Austin", "Seoul", "Rome", "Cairo"]
_THINGS = ["pottery", "hiking", "chess", "painting", "running", "jazz", "cooking", "camping",
           "reading", "swimming", "violin", "gardening", "photography", "yoga", "soccer"]
_VERBS = ["likes", "loves", "plays", "studies", "teaches", "started", "enjoys", "practices"]
_PETS = ["a dog", "two cats", "a parrot", "a rabbit", "no pets", "a turtle"]


@dataclass(frozen=True, slots=True)
class TinyModelSpec:
    """Shape of a tiny test model; the folder name is derived from it."""

    architecture: str = "llama"
    """'llama' (LlamaForCausalLM, llama3 rope scaling), 'qwen2' (Qwen2ForCausalLM, qkv bias) or a
    key of FAMILIES."""
    num_layers: int = 4
    hidden_size: int = 256
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 512
    vocab_size: int = 512
    max_position_embeddings: int = 4096
    weight_std: float = 0.08
    seed: int = 0

    def digest(self) -> str:
        """Short hash of the spec, used in the cache folder name."""
        family = FAMILIES.get(self.architecture)
        blob = json.dumps([asdict(self), family] if family else asdict(self),
                          sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def corpus_sentences(num_sentences: int = 3000, seed: int = 0) -> list[str]:
    """Synthetic English sentences about people, used to train the tiny tokenizer."""
    rng = random.Random(seed)
    out = []
    for _ in range(num_sentences):
        name, place = rng.choice(_NAMES), rng.choice(_PLACES)
        thing, verb, pet = rng.choice(_THINGS), rng.choice(_VERBS), rng.choice(_PETS)
        out.append(rng.choice([
            f"{name} {verb} {thing} and lives in {place}.",
            f"{name} has {pet} and went to {place} last year.",
            f"What does {name} like? {name} {verb} {thing}.",
            f"Where does {name} live? In {place}, near the river.",
            f"User: I {verb.rstrip('s')} {thing}. Assistant: That sounds fun, {name}!",
        ]))
    return out


def build_tokenizer(out_dir: Path, vocab_size: int, cover: int = 0) -> None:
    """Train a byte-level BPE tokenizer on the synthetic corpus and save it as a HF tokenizer.

    cover: if larger than vocab_size, ids vocab_size..cover-1 become filler tokens (decodable,
    never produced by encoding: no merge leads to them), so that every id a model with `cover`
    logits can sample decodes like a real tokenizer's (a model with dummy weights samples
    anywhere in its vocabulary; an id a tokenizer lacks decodes ~10x slower on this project's
    CPU and far slower on the H200 host, which made the H200 throughput runs measure
    detokenization instead of serving).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_sentences(), trainer=trainer)
    if cover > tok.get_vocab_size():
        tok = _with_fillers(tok, cover)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(str(out_dir))


def _with_fillers(tok: Any, size: int) -> Any:
    """`tok` with filler tokens (" q<letters>") for every id from its vocab size up to size."""
    from tokenizers import Tokenizer

    data = json.loads(tok.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    taken = set(vocab) | {t["content"] for t in data.get("added_tokens", [])}
    next_id = max(vocab.values()) + 1
    for i in range(size):  # names from a counter; a name already in the vocab is skipped
        if next_id >= size:
            break
        name, n = "\u0120q", i
        while True:
            name += "abcdefghijklmnopqrstuvwxyz"[n % 26]
            n //= 26
            if not n:
                break
        if name not in taken:
            vocab[name] = next_id
            next_id += 1
    return Tokenizer.from_str(json.dumps(data))


_LONGROPE = {  # Phi-3 LongRoPE: two factor sets for the 24 rotary pairs of 0.75 * 64 dims
    "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
    "short_factor": [1.0 + 0.04 * i for i in range(24)],
    "long_factor": [1.0 + 0.9 * i for i in range(24)],
    "original_max_position_embeddings": 512}
_GEMMA = dict(query_pre_attn_scalar=100, sliding_window=32, tie_word_embeddings=True,
              hidden_activation="gelu_pytorch_tanh")
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    # family: (transformers config class, fields on top of the spec's shape)
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2,
                                      sliding_window=None, rope_theta=1e6)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=128,
                                         shared_expert_intermediate_size=256,
                                         use_sliding_window=False, rope_theta=1e6)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=128, norm_topk_prob=True,
                                         rope_theta=1e6)),
    "olmo2": ("Olmo2Config", dict(rope_theta=500000.0)),
    "granite": ("GraniteConfig", dict(attention_multiplier=0.2, residual_multiplier=0.5,
                                      embedding_multiplier=4.0, logits_scaling=2.0)),
    "phi3": ("Phi3Config", dict(rope_parameters=_LONGROPE, original_max_position_embeddings=512,
                                tie_word_embeddings=True)),
    "gemma2": ("Gemma2Config", dict(
        _GEMMA, attn_logit_softcapping=50.0, final_logit_softcapping=30.0, rope_theta=10000.0,
        layer_types=["sliding_attention", "full_attention"] * 2)),
    "gemma3": ("Gemma3TextConfig", dict(
        _GEMMA, layer_types=["sliding_attention"] * 3 + ["full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1e6}})),
}
"""Tiny configs of the families the engine serves beyond Llama / Qwen2 (4 layers by default):
MoE (Mixtral, Qwen2-MoE, Qwen3-MoE), QK-norm (OLMo2), multipliers (Granite), partial rotary +
LongRoPE (Phi-3), sliding-window layers next to global ones (Gemma 2 / 3)."""


def _hf_config(spec: TinyModelSpec, vocab_size: int, eos_id: int, pad_id: int):
    import transformers

    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        torch_dtype="float32",
    )
    if spec.architecture == "llama":
        rope: dict[str, Any] = {  # legacy keys: transformers 5 maps them to rope_parameters
            "rope_theta": 10000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 256}}
        return transformers.LlamaConfig(head_dim=spec.head_dim, **rope, **common)
    if spec.architecture == "qwen2":
        if spec.hidden_size // spec.num_heads != spec.head_dim:
            raise ValueError("qwen2 derives head_dim from hidden_size // num_heads")
        qwen_rope: dict[str, Any] = {"rope_theta": 1_000_000.0}
        return transformers.Qwen2Config(use_sliding_window=False, **qwen_rope, **common)
    if spec.architecture in FAMILIES:
        class_name, extra = FAMILIES[spec.architecture]
        layer_types = extra.get("layer_types")
        if layer_types is not None and len(layer_types) != spec.num_layers:
            extra = dict(extra, layer_types=[layer_types[i % len(layer_types)]
                                             for i in range(spec.num_layers)])
        return getattr(transformers, class_name)(head_dim=spec.head_dim,
                                                 **{**common, **extra})
    raise ValueError(f"unknown tiny architecture {spec.architecture!r}; use one of "
                     f"{['llama', 'qwen2', *FAMILIES]}")


def build_tiny_model(out_dir: str | os.PathLike, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Write a random-init model + tokenizer folder that vLLM and transformers can load.

    Args:
        out_dir: destination folder (created; an existing complete build is reused).
        spec: model shape and seed.

    Returns:
        The folder path.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    marker = out / "inferscale-tiny.json"
    if marker.exists() and json.loads(marker.read_text()) == asdict(spec):
        return out
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out, spec.vocab_size)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    config = _hf_config(spec, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                continue
            if name.endswith("bias"):
                param.normal_(0.0, 0.02)
            else:
                param.normal_(0.0, spec.weight_std)
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)
    marker.write_text(json.dumps(asdict(spec)))
    return out


def tiny_model_path(spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Build (once) and return the cached folder of a tiny model."""
    return build_tiny_model(default_cache_dir() / f"tiny-{spec.architecture}-{spec.digest()}", spec)


_PHI4_MINI_LONG_FACTOR = [  # rope_scaling.long_factor of microsoft/Phi-4-mini-instruct
    1.0, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817,
    2.187582649, 2.446418898, 2.735880826, 3.059592084, 3.421605075, 3.826451687, 4.279200023,
    4.785517845, 5.351743533, 5.984965424, 6.693110555, 7.485043894, 8.370679318, 9.36110372,
    10.4687158, 11.70738129, 13.09260651, 14.64173252, 16.37415215, 18.31155283, 20.47818807,
    22.90118105, 25.61086418, 28.64115884, 32.03, 32.1, 32.13, 32.23, 32.6, 32.61, 32.64,
    32.66, 32.7, 32.71, 32.93, 32.97, 33.28, 33.49, 33.5, 44.16, 47.77]
REFERENCE_CONFIGS: dict[str, dict[str, object]] = {
    # Public architecture numbers; used with load_format="dummy" (timing does not depend on
    # weight values) and the tiny ChatML tokenizer (its ids are valid in any larger vocab).
    "llama-3.1-8b": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        hidden_act="silu", torch_dtype="bfloat16",
    ),
    "qwen3-8b": dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=4096,
        intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
        hidden_act="silu", torch_dtype="bfloat16", attention_bias=False,
    ),
    "mixtral-8x7b": dict(  # Mixtral-8x7B-v0.1
        architectures=["MixtralForCausalLM"], model_type="mixtral", hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, num_local_experts=8, num_experts_per_tok=2,
        vocab_size=32000, max_position_embeddings=32768, rms_norm_eps=1e-5,
        rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False,
        hidden_act="silu", torch_dtype="bfloat16",
    ),
    "qwen3-30b-a3b": dict(  # Qwen3-30B-A3B: 128 experts, 8 active, every layer sparse
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=2048,
        intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_theta=1000000.0, use_sliding_window=False, sliding_window=None,
        tie_word_embeddings=False, attention_bias=False, hidden_act="silu",
        torch_dtype="bfloat16",
    ),
    "gemma-3-12b": dict(  # Gemma-3-12B's text model: 5 sliding layers, then 1 global
        architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", hidden_size=3840,
        intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
        num_key_value_heads=8, head_dim=256, vocab_size=262208, max_position_embeddings=131072,
        rms_norm_eps=1e-6, query_pre_attn_scalar=256, sliding_window=1024,
        attn_logit_softcapping=None, final_logit_softcapping=None,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, torch_dtype="bfloat16",
        # transformers 5 reads layer_types + rope_parameters by layer type; the hub's own
        # (transformers 4) keys say the same and are kept for readers of either version.
        layer_types=[("full_attention" if (i + 1) % 6 == 0 else "sliding_attention")
                     for i in range(48)],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}},
        sliding_window_pattern=6, rope_local_base_freq=10000.0, rope_theta=1000000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
    ),
    "phi-4-mini": dict(  # Phi-4-mini-instruct: partial rotary (96 of 128 dims), LongRoPE
        architectures=["Phi3ForCausalLM"], model_type="phi3", hidden_size=3072,
        intermediate_size=8192, num_hidden_layers=32, num_attention_heads=24,
        num_key_value_heads=8, vocab_size=200064, max_position_embeddings=131072,
        original_max_position_embeddings=4096, partial_rotary_factor=0.75, rope_theta=10000.0,
        rope_scaling={"type": "longrope", "short_factor": [1.0] * 48,
                      "long_factor": _PHI4_MINI_LONG_FACTOR},
        rms_norm_eps=1e-5, sliding_window=262144, tie_word_embeddings=True, hidden_act="silu",
        torch_dtype="bfloat16",
    ),
}


def dummy_model_path(name: str) -> Path:
    """A folder with a reference architecture's config.json and the tiny tokenizer, no weights.

    The tokenizer's vocabulary is filled up to the config's vocab_size (build_tokenizer's
    cover), so every id the model samples decodes.

    Load it with load_format="dummy". Args:
        name: a key of REFERENCE_CONFIGS.
    """
    if name not in REFERENCE_CONFIGS:
        raise ValueError(f"unknown reference config {name!r}; known: {sorted(REFERENCE_CONFIGS)}")
    folder = default_cache_dir() / f"dummy-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    vocab_size = cast(int, REFERENCE_CONFIGS[name]["vocab_size"])
    tokenizer = folder / "tokenizer.json"
    if not tokenizer.exists() or len(json.loads(tokenizer.read_text())["model"]["vocab"]) < (
            vocab_size):  # folders made before the fillers
        build_tokenizer(folder, TinyModelSpec().vocab_size, cover=vocab_size)
    config = json.dumps(REFERENCE_CONFIGS[name], indent=1)
    path = folder / "config.json"
    if not path.exists() or path.read_text() != config:  # an edited entry replaces the old one
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(config)
        tmp.replace(path)
    return folder
