"""`make_tiny_model`: writes the built-in tiny model directory, offline and deterministically.

Owns the files of docs/design.md section 6: `config.json` (HF layout for qwen3, qwen2 or llama;
a Gemma 4 replica's config and weights come from `gemma4_replica`),
`model.safetensors` with seeded random float32 weights scaled so next-token distributions
have varied, clearly non-uniform entropy, `generation_config.json`, and the tokenizer files
(from `tokenizer.py`). The same seed gives the same bytes. The model's `vocab_size` equals the
tokenizer's length, so no padded id exists (except in `real_size` models).

`make_tiny_model(dir, like=NAME)` writes the same tiny sizes and tokenizer with the config
keys and features of a real checkpoint (`LIKE_PRESETS`): its architecture, RoPE theta and
scaling, tied or untied embeddings, norm epsilon, dtype and generation defaults. With
`real_size=True` (presets that carry `real`) it also takes the checkpoint's sizes: hidden,
heads, MLP and the model's vocabulary (ids past the tokenizer's are padding), optionally
fewer `layers`, for benchmarks where the model step must weigh what it weighs on a slice.

Must not import tunix or sgl_jax: both read the directory through their own loaders.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from sgl_jax_rollout.tiny_model import gemma4_replica
from sgl_jax_rollout.tiny_model.tokenizer import (
    GEMMA,
    GEMMA4,
    QWEN_STYLE,
    THINK_END,
    THINK_START,
    Vocabulary,
    train_tokenizer,
)

log = logging.getLogger(__name__)

ARCHITECTURES = {
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "llama": ("LlamaForCausalLM", "llama"),
    "gemma2": ("Gemma2ForCausalLM", "gemma2"),
}
# The tokenizer vocabulary of each architecture (the built-in one unless listed).
VOCABULARIES: dict[str, Vocabulary] = {"gemma2": GEMMA, "gemma4": GEMMA4}
# Architectures only a `--like` replica writes (their checkpoints' layout is their own).
LIKE_ONLY = {"gemma4": gemma4_replica.ARCHITECTURE, "qwen3_moe": "Qwen3MoeForCausalLM"}
# The replica's mixture of experts: Qwen3-30B-A3B's 128 experts, 8 per token (where routing
# flips come from: the eighth and ninth are often close), 96 wide (768 there).
MOE_EXPERTS, MOE_TOP_K, MOE_INTERMEDIATE = 128, 8, 96
MIN_VOCAB = 300
DEFAULT_VOCAB = 1024
DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class TinyShape:
    hidden: int = 64
    intermediate: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 128  # `--like` replicas take their checkpoint's (LikePreset.head_dim)
    max_positions: int = 2048
    # Std of the output projection: with unit-RMS hidden states, logits std ~ 0.3 * sqrt(64).
    lm_head_std: float = 0.3


@dataclasses.dataclass(frozen=True)
class LikePreset:
    """The config features of a real checkpoint that a tiny model copies (not its sizes).

    - config: config.json values of the checkpoint (RoPE, norm epsilon, tying, dtype, ...),
      written over the tiny sizes.
    - generation: generation_config.json sampling defaults of the checkpoint.
    - eos_with_bos: generation_config's `eos_token_id` is `[eos, bos]` as Qwen's
      `[<|im_end|>, <|endoftext|>]` (Qwen's pad id is its bos id too), else a single eos id
      and no pad id, as Llama 3 base checkpoints ship.
    - max_positions: a floor on max_position_embeddings above the tiny shape's (llama3 RoPE
      scaling wants it above its original_max_position_embeddings, 8192, or HF warns).
    - head_dim: the checkpoint's attention head size (its config's `head_dim`, else hidden /
      heads), kept at every size: it sets the RoPE frequencies and the KV pool's padding.
    - real, real_vocab: the checkpoint's sizes and model vocabulary (`real_size=True`).
    """

    arch: str
    hf_repo: str
    config: dict[str, Any]
    generation: dict[str, Any]
    eos_with_bos: bool
    head_dim: int
    max_positions: int | None = None
    real: TinyShape | None = None
    real_vocab: int | None = None


_QWEN_BASE = {"rms_norm_eps": 1e-06, "torch_dtype": "bfloat16"}
_QWEN3_GENERATION = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}
_LLAMA_BASE = {"rms_norm_eps": 1e-05, "rope_theta": 500000.0, "torch_dtype": "bfloat16"}
_LLAMA_GENERATION = {"do_sample": True, "temperature": 0.6, "top_p": 0.9}


def _llama3_rope_scaling(factor: float) -> dict[str, Any]:
    return {
        "factor": factor,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    }


LIKE_PRESETS: dict[str, LikePreset] = {
    "qwen3-0.6b": LikePreset(
        arch="qwen3",
        hf_repo="Qwen/Qwen3-0.6B",
        config={**_QWEN_BASE, "rope_theta": 1000000, "tie_word_embeddings": True},
        generation=_QWEN3_GENERATION,
        eos_with_bos=True,
        head_dim=128,
        # Qwen/Qwen3-0.6B config.json; weights as the tiny model's (random, seeded).
        real=TinyShape(
            hidden=1024,
            intermediate=3072,
            layers=28,
            heads=16,
            kv_heads=8,
            head_dim=128,
            max_positions=40960,
            lm_head_std=0.3 * (64 / 1024) ** 0.5,  # the tiny model's logit scale
        ),
        real_vocab=151936,
    ),
    "qwen3-8b": LikePreset(
        arch="qwen3",
        hf_repo="Qwen/Qwen3-8B",
        config={**_QWEN_BASE, "rope_theta": 1000000, "tie_word_embeddings": False},
        generation=_QWEN3_GENERATION,
        eos_with_bos=True,
        head_dim=128,
    ),
    "qwen2.5-1.5b-instruct": LikePreset(
        arch="qwen2",
        hf_repo="Qwen/Qwen2.5-1.5B-Instruct",
        config={**_QWEN_BASE, "rope_theta": 1000000.0, "tie_word_embeddings": True},
        generation={
            "do_sample": True,
            "repetition_penalty": 1.1,
            "temperature": 0.7,
            "top_k": 20,
            "top_p": 0.8,
        },
        eos_with_bos=True,
        head_dim=128,
    ),
    "llama-3.1-8b": LikePreset(
        arch="llama",
        hf_repo="meta-llama/Llama-3.1-8B",
        config={
            **_LLAMA_BASE,
            "rope_scaling": _llama3_rope_scaling(8.0),
            "tie_word_embeddings": False,
        },
        generation=_LLAMA_GENERATION,
        eos_with_bos=False,
        head_dim=128,
        max_positions=16384,
    ),
    "llama-3.2-1b": LikePreset(
        arch="llama",
        hf_repo="meta-llama/Llama-3.2-1B",
        config={
            **_LLAMA_BASE,
            "rope_scaling": _llama3_rope_scaling(32.0),
            "tie_word_embeddings": True,
        },
        generation=_LLAMA_GENERATION,
        eos_with_bos=False,
        head_dim=64,
        max_positions=16384,
    ),
    "gemma-2-2b-it": LikePreset(
        arch="gemma2",
        hf_repo="google/gemma-2-2b-it",
        config={
            "rms_norm_eps": 1e-06,
            "rope_theta": 10000.0,
            "tie_word_embeddings": True,
            "torch_dtype": "float32",
            "attention_bias": False,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "query_pre_attn_scalar": 256,
            # 4096 in the checkpoint: the replica's window is shorter than the tests' prompts
            # (1,024 tokens), so the alternate layers' window is exercised.
            "sliding_window": 256,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh",
            "cache_implementation": "hybrid",
        },
        generation={"cache_implementation": "hybrid"},
        eos_with_bos=False,
        head_dim=256,
        max_positions=8192,
    ),
    "qwen3-30b-a3b": LikePreset(
        arch="qwen3_moe",
        hf_repo="Qwen/Qwen3-30B-A3B",
        # Qwen/Qwen3-30B-A3B config.json: every layer sparse, top-k renormalised, no shared
        # expert, 128 experts, 8 per token; 96 wide at the tiny size.
        config={
            **_QWEN_BASE,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": False,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "norm_topk_prob": True,
            "num_experts": MOE_EXPERTS,
            "num_experts_per_tok": MOE_TOP_K,
            "moe_intermediate_size": MOE_INTERMEDIATE,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
        },
        generation=_QWEN3_GENERATION,
        eos_with_bos=True,
        head_dim=128,
    ),
    "gemma-4-31b-it": LikePreset(
        arch="gemma4",
        hf_repo="google/gemma-4-31B-it",
        config={"torch_dtype": "bfloat16"},  # the rest: gemma4_replica.config
        generation={},
        eos_with_bos=False,
        head_dim=gemma4_replica.HEAD_DIM,
        max_positions=8192,
    ),
}


def like_preset(name: str) -> LikePreset:
    """The preset called `name`; ValueError naming the known ones otherwise."""
    if name not in LIKE_PRESETS:
        raise ValueError(f"like must be one of {sorted(LIKE_PRESETS)}, got {name!r}")
    return LIKE_PRESETS[name]


def make_tiny_model(
    out_dir: str | Path,
    arch: str | None = None,
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB,
    shape: TinyShape = TinyShape(),
    like: str | None = None,
    dtype: str | None = None,
    real_size: bool = False,
    layers: int | None = None,
) -> Path:
    """Writes the model directory and returns its path. Overwrites our own files only.

    `arch` (default qwen3) picks the architecture of the plain tiny model; `like` instead
    copies a real checkpoint's config features (`LIKE_PRESETS`; the two exclude each other).
    `dtype` (float32 or bfloat16) is the weights' and config's dtype: by default the preset's
    (bfloat16), or float32 for the plain model. `real_size` (with `like`) takes the
    checkpoint's sizes and model vocabulary; `layers` then sets the depth (default: the
    checkpoint's).
    """
    preset = None
    if like is not None:
        if arch is not None:
            raise ValueError(f"give arch or like, not both (got arch={arch!r}, like={like!r})")
        preset = like_preset(like)
        arch = preset.arch
    elif arch is None:
        arch = "qwen3"
    if arch not in ARCHITECTURES and (preset is None or arch not in LIKE_ONLY):
        raise ValueError(f"arch must be one of {sorted(ARCHITECTURES)}, got {arch!r}")
    if dtype is None:
        dtype = preset.config["torch_dtype"] if preset else "float32"
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB:
        raise ValueError(f"vocab_size must be an integer >= {MIN_VOCAB}, got {vocab_size!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    model_vocab = None
    if real_size:
        if preset is None or preset.real is None:
            sized = sorted(name for name, p in LIKE_PRESETS.items() if p.real is not None)
            raise ValueError(f"real_size needs like= one of {sized}, got like={like!r}")
        shape = preset.real
        model_vocab = preset.real_vocab
        if layers is not None:
            if not isinstance(layers, int) or not 1 <= layers <= preset.real.layers:
                raise ValueError(
                    f"layers must be an integer in [1, {preset.real.layers}], got {layers!r}"
                )
            shape = dataclasses.replace(shape, layers=layers)
    elif layers is not None:
        raise ValueError("layers is for real_size models only")
    elif preset is not None:
        shape = dataclasses.replace(shape, head_dim=preset.head_dim)
        if arch == "gemma4" and shape.layers < gemma4_replica.PERIOD:  # one full layer at least
            shape = dataclasses.replace(shape, layers=gemma4_replica.PERIOD)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    vocabulary = VOCABULARIES.get(arch, QWEN_STYLE)
    tokenizer = train_tokenizer(vocab_size, seed, vocabulary)
    vocab = max(tokenizer.get_vocab_size(), model_vocab or 0)
    roles = {"pad": vocabulary.pad, "bos": vocabulary.bos, "eos": vocabulary.eos}
    roles.update(think_start=THINK_START, think_end=THINK_END, end_of_turn=vocabulary.end_of_turn)
    ids = {role: tokenizer.token_to_id(name) if name else None for role, name in roles.items()}
    _save_tokenizer(tokenizer, vocabulary, out)

    if preset is None:
        config = _hf_config(arch, vocab, shape, ids)
        generation = {
            "bos_token_id": ids["bos"],
            "eos_token_id": [ids["eos"]],
            "pad_token_id": ids["pad"],
            "do_sample": True,
            "temperature": 1.0,
            "top_k": -1,
            "top_p": 1.0,
        }
    elif arch == "gemma4":
        max_positions = max(preset.max_positions or 0, shape.max_positions)
        config = gemma4_replica.config(shape, vocab, ids, max_positions)
        config["text_config"]["torch_dtype"] = dtype
        generation = gemma4_replica.generation(ids, tokenizer.token_to_id("<|tool_response>"))
    else:
        config = _like_config(preset, vocab, shape, ids)
        generation = _like_generation(preset, ids)
    config["torch_dtype"] = dtype
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", generation)
    tied = bool(config["tie_word_embeddings"])
    if arch == "gemma4":
        rng = np.random.default_rng(seed)
        tensors = gemma4_replica.weights(config["text_config"], rng, shape.lm_head_std)
    else:
        tensors = _random_weights(arch, vocab, shape, seed, tied=tied)
    if dtype == "bfloat16":
        import ml_dtypes  # a jax dependency

        tensors = {name: t.astype(ml_dtypes.bfloat16) for name, t in tensors.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    log.info(
        "%s %s model%s (vocab %d, %d tensors, %s) written to %s",
        "real-size" if real_size else "tiny",
        arch,
        f" like {like}" if like else "",
        vocab,
        len(tensors),
        dtype,
        out,
    )
    return out


def _hf_config(arch: str, vocab: int, s: TinyShape, ids: dict[str, int]) -> dict:
    architecture, model_type = ARCHITECTURES[arch]
    config = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": s.max_positions,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["pad"],
        "think_start_token_id": ids["think_start"],
        "think_end_token_id": ids["think_end"],
    }
    if arch == "qwen3":
        config["attention_bias"] = False
    if arch == "qwen2":
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=s.layers)
    if arch == "llama":
        config.update(attention_bias=False, mlp_bias=False, rope_scaling=None)
    return config


def _like_config(preset: LikePreset, vocab: int, s: TinyShape, ids: dict[str, int]) -> dict:
    """The key set of the real checkpoint's config.json, at the tiny sizes."""
    if preset.arch in ARCHITECTURES:
        architecture, model_type = ARCHITECTURES[preset.arch]
    else:  # a replica-only architecture: HF's model_type is its name
        architecture, model_type = LIKE_ONLY[preset.arch], preset.arch
    max_positions = max(preset.max_positions or 0, s.max_positions)
    config: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        # Real Llama 3.1 8B and Qwen2.5 omit it (hidden / heads); the tiny shape differs.
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions,
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
    }
    if preset.arch in ("qwen3", "qwen3_moe"):  # q/k RMSNorm (tensors), no biases
        config.update(
            attention_bias=False,
            rope_scaling=None,
            sliding_window=None,
            use_sliding_window=False,
            max_window_layers=s.layers,
        )
    if preset.arch == "qwen2":  # q/k/v biases (tensors; Qwen2 has no attention_bias key)
        config.update(
            sliding_window=max_positions, use_sliding_window=False, max_window_layers=s.layers
        )
    if preset.arch == "llama":
        config.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    if preset.arch == "gemma2":  # <eos> and <end_of_turn> stop, <pad> 0 (gemma-2-2b-it's)
        config.update(eos_token_id=[ids["eos"], ids["end_of_turn"]], pad_token_id=ids["pad"])
    config.update(json.loads(json.dumps(preset.config)))  # a deep copy
    return config


def _like_generation(preset: LikePreset, ids: dict[str, int]) -> dict:
    generation: dict[str, Any] = {"bos_token_id": ids["bos"]}
    if preset.eos_with_bos:
        generation.update(eos_token_id=[ids["eos"], ids["bos"]], pad_token_id=ids["pad"])
    elif ids["end_of_turn"] is not None:  # Gemma: <eos> and <end_of_turn>, and a pad id
        generation.update(eos_token_id=[ids["eos"], ids["end_of_turn"]], pad_token_id=ids["pad"])
    else:
        generation["eos_token_id"] = ids["eos"]
    generation.update(preset.generation)
    return generation


def _random_weights(
    arch: str, vocab: int, s: TinyShape, seed: int, tied: bool = False
) -> dict[str, np.ndarray]:
    """Seeded weights. Tied: no lm_head tensor, and the embedding takes the output
    projection's std (the logits are the final hidden states times the embedding)."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm_weight(size: int, gain: float = 1.0) -> np.ndarray:
        # Gemma's RMSNorm scales by (1 + w): its weights sit around gain - 1, the others'
        # around gain.
        center = gain - 1.0 if arch == "gemma2" else gain
        return (center + rng.standard_normal(size) * 0.1).astype(np.float32)

    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    embed_std = s.lm_head_std if tied else 1.0
    tensors = {"model.embed_tokens.weight": normal(vocab, s.hidden, std=embed_std)}
    for i in range(s.layers):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = norm_weight(s.hidden)
        # Gemma scales the input embedding by sqrt(hidden) and normalises each block's output
        # (post norms): gains of 4 keep the blocks from being drowned by the embedding, which
        # the tied output would otherwise copy (the next token = the current one).
        post_gain = 4.0 if arch == "gemma2" else 1.0
        tensors[p + "post_attention_layernorm.weight"] = norm_weight(s.hidden, post_gain)
        tensors[p + "self_attn.q_proj.weight"] = normal(q, s.hidden, std=s.hidden**-0.5)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv, s.hidden, std=s.hidden**-0.5)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv, s.hidden, std=s.hidden**-0.5)
        tensors[p + "self_attn.o_proj.weight"] = normal(s.hidden, q, std=q**-0.5)
        if arch == "qwen2":
            tensors[p + "self_attn.q_proj.bias"] = normal(q, std=0.1)
            tensors[p + "self_attn.k_proj.bias"] = normal(kv, std=0.1)
            tensors[p + "self_attn.v_proj.bias"] = normal(kv, std=0.1)
        if arch in ("qwen3", "qwen3_moe"):
            tensors[p + "self_attn.q_norm.weight"] = norm_weight(s.head_dim)
            tensors[p + "self_attn.k_norm.weight"] = norm_weight(s.head_dim)
        if arch == "gemma2":  # norms around the feed-forward block too
            tensors[p + "pre_feedforward_layernorm.weight"] = norm_weight(s.hidden)
            tensors[p + "post_feedforward_layernorm.weight"] = norm_weight(s.hidden, post_gain)
        if arch == "qwen3_moe":
            tensors.update(_experts(p + "mlp.", s.hidden, normal))
            continue
        tensors[p + "mlp.gate_proj.weight"] = normal(s.intermediate, s.hidden, std=s.hidden**-0.5)
        tensors[p + "mlp.up_proj.weight"] = normal(s.intermediate, s.hidden, std=s.hidden**-0.5)
        tensors[p + "mlp.down_proj.weight"] = normal(
            s.hidden, s.intermediate, std=s.intermediate**-0.5
        )
    tensors["model.norm.weight"] = norm_weight(s.hidden)
    if not tied:
        tensors["lm_head.weight"] = normal(vocab, s.hidden, std=s.lm_head_std)
    return tensors


def _experts(prefix: str, hidden: int, normal) -> dict[str, np.ndarray]:
    """A Qwen3-MoE block's tensors: the router (`gate`, `[experts, hidden]`) and each expert's
    SwiGLU MLP, HF's names and `[out, in]` layout. Router logits have a std of ~0.2, flat as a
    load-balanced router's are, so a token's eighth and ninth experts are often close; the
    experts' outputs are three times an MLP's, so which expert serves a token matters: the
    replica shows what a flipped expert does (bfloat16, routing replay) while float32 sides
    still agree on every choice."""
    f = MOE_INTERMEDIATE
    tensors = {prefix + "gate.weight": normal(MOE_EXPERTS, hidden, std=0.2 * hidden**-0.5)}
    for e in range(MOE_EXPERTS):
        q = f"{prefix}experts.{e}."
        tensors[q + "gate_proj.weight"] = normal(f, hidden, std=hidden**-0.5)
        tensors[q + "up_proj.weight"] = normal(f, hidden, std=hidden**-0.5)
        tensors[q + "down_proj.weight"] = normal(hidden, f, std=3.0 * f**-0.5)
    return tensors


def _save_tokenizer(tokenizer, vocabulary: Vocabulary, out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=vocabulary.bos,
        eos_token=vocabulary.eos,
        pad_token=vocabulary.pad,
        additional_special_tokens=list(vocabulary.additional),
        chat_template=vocabulary.chat_template,
        model_max_length=TinyShape().max_positions,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out))


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def default_model_dir() -> Path:
    """The built-in qwen3 tiny model (seed 0), built on first use in the user cache.

    `$SGL_JAX_ROLLOUT_CACHE` overrides the cache root (default `~/.cache/sgl-jax-rollout`).
    The files are deterministic, so an existing complete directory is reused as is.
    """
    return cached_dir("tiny-qwen3-seed0", make_tiny_model)


def real_size_model_dir(layers: int) -> Path:
    """A Qwen3-0.6B-sized model with `layers` layers (float32, random weights, seed 0), for
    benchmarks; built on first use in the same cache as `default_model_dir` (620 MB of
    embedding plus 63 MB per layer)."""
    return cached_dir(
        f"qwen3-0.6b-size-{layers}-layers-seed0",
        lambda out: make_tiny_model(
            out, like="qwen3-0.6b", real_size=True, layers=layers, dtype="float32"
        ),
    )


def cached_dir(name: str, build) -> Path:
    """`name` under the cache root (`$SGL_JAX_ROLLOUT_CACHE`, default
    `~/.cache/sgl-jax-rollout`), built by `build(staging_dir)` when absent: built in a staging
    directory and renamed into place, so a directory that exists is complete."""
    root = Path(os.environ.get("SGL_JAX_ROLLOUT_CACHE", Path.home() / ".cache" / "sgl-jax-rollout"))
    out = root / name
    if not (out / "model.safetensors").is_file():
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="tiny-", dir=root))
        build(staging)
        try:
            staging.rename(out)
        except OSError:  # another process finished first: its files are identical
            shutil.rmtree(staging, ignore_errors=True)
    return out
