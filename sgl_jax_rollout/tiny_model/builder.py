"""`make_tiny_model`: writes the built-in tiny model directory, offline and deterministically.

Owns the files of docs/design.md section 6: `config.json` (the shared HF decoder layout, with
each family's own keys and tensors from its module under `families/`; a Gemma 4 replica's
config and weights come whole from `families/gemma4.py`),
`model.safetensors` with seeded random float32 weights scaled so next-token distributions
have varied, clearly non-uniform entropy, `generation_config.json`, and the tokenizer files
(from `tokenizer.py`). The same seed gives the same bytes. The model's `vocab_size` equals the
tokenizer's length, so no padded id exists (except in `real_size` models); a preset with a
`tokenizer_size` (Gemma 3's 262,144) has its tokenizer filled to that length.

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

from sgl_jax_rollout.tiny_model.families import FAMILIES
from sgl_jax_rollout.tiny_model.families.qwen3_moe import (  # noqa: F401 (importable from here)
    MOE_EXPERTS,
    MOE_INTERMEDIATE,
    MOE_TOP_K,
)
from sgl_jax_rollout.tiny_model.family import Family, LikePreset, Normal, TinyShape
from sgl_jax_rollout.tiny_model.tokenizer import (
    QWEN_STYLE,
    THINK_END,
    THINK_START,
    Vocabulary,
    filled,
    train_tokenizer,
)

log = logging.getLogger(__name__)

ARCHITECTURES = {
    f.arch: (f.architecture, f.model_type) for f in FAMILIES.values() if not f.like_only
}
# The tokenizer vocabulary of each architecture (the built-in one unless listed).
VOCABULARIES: dict[str, Vocabulary] = {
    f.arch: f.vocabulary for f in FAMILIES.values() if f.vocabulary is not None
}
# Architectures only a `--like` replica writes (their checkpoints' layout is their own).
LIKE_ONLY = {f.arch: f.architecture for f in FAMILIES.values() if f.like_only}
LIKE_PRESETS: dict[str, LikePreset] = {
    name: preset for f in FAMILIES.values() for name, preset in f.presets.items()
}
MIN_VOCAB = 300
DEFAULT_VOCAB = 1024
DTYPES = ("float32", "bfloat16")


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
    shape: TinyShape = TinyShape(),  # noqa: B008 (a frozen dataclass)
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
    family = FAMILIES[arch]
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
        kv_heads = preset.kv_heads or shape.kv_heads
        shape = dataclasses.replace(shape, head_dim=preset.head_dim, kv_heads=kv_heads)
        if shape.layers < family.min_layers:
            shape = dataclasses.replace(shape, layers=family.min_layers)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    vocabulary = family.vocabulary or QWEN_STYLE
    tokenizer = train_tokenizer(vocab_size, seed, vocabulary)
    if preset is not None and preset.tokenizer_size is not None:
        tokenizer = filled(tokenizer, preset.tokenizer_size)
    vocab = max(tokenizer.get_vocab_size(), model_vocab or 0)
    roles = {"pad": vocabulary.pad, "bos": vocabulary.bos, "eos": vocabulary.eos}
    roles.update(think_start=THINK_START, think_end=THINK_END, end_of_turn=vocabulary.end_of_turn)
    ids = {role: tokenizer.token_to_id(name) if name else None for role, name in roles.items()}
    _save_tokenizer(tokenizer, vocabulary, out)

    if family.own_layout is not None:  # its checkpoints' layout is its own (Gemma 4)
        config, generation, tensors = family.own_layout(
            shape, vocab, ids, _max_positions(preset, shape), dtype, tokenizer, seed
        )
    else:
        if preset is None:
            config, generation = _hf_config(family, vocab, shape, ids), _plain_generation(ids)
        else:
            config = _like_config(family, preset, vocab, shape, ids)
            generation = _like_generation(preset, ids)
        tied = bool(config["tie_word_embeddings"])
        tensors = _random_weights(family, vocab, shape, seed, tied=tied)
        if family.nest is not None:  # a multimodal checkpoint around it (Gemma 3 4B)
            config, tensors = family.nest(config, tensors, seed)
    config["torch_dtype"] = dtype
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", generation)
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


def _hf_config(family: Family, vocab: int, s: TinyShape, ids: dict[str, int]) -> dict:
    config = {
        "architectures": [family.architecture],
        "model_type": family.model_type,
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
    if family.tiny_config is not None:
        config.update(family.tiny_config(s))
    return config


def _plain_generation(ids: dict[str, int]) -> dict:
    return {
        "bos_token_id": ids["bos"],
        "eos_token_id": [ids["eos"]],
        "pad_token_id": ids["pad"],
        "do_sample": True,
        "temperature": 1.0,
        "top_k": -1,
        "top_p": 1.0,
    }


def _max_positions(preset: LikePreset, s: TinyShape) -> int:
    return max(preset.max_positions or 0, s.max_positions)


def _like_config(
    family: Family, preset: LikePreset, vocab: int, s: TinyShape, ids: dict[str, int]
) -> dict:
    """The key set of the real checkpoint's config.json, at the tiny sizes."""
    max_positions = _max_positions(preset, s)
    config: dict[str, Any] = {
        "architectures": [family.architecture],
        "model_type": family.model_type,
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
    if family.like_config is not None:
        config.update(family.like_config(s, max_positions, ids))
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
    family: Family, vocab: int, s: TinyShape, seed: int, tied: bool = False
) -> dict[str, np.ndarray]:
    """Seeded weights. Tied: no lm_head tensor, and the embedding takes the output
    projection's std (the logits are the final hidden states times the embedding)."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm_weight(size: int, gain: float = 1.0) -> np.ndarray:
        # Gemma's RMSNorm scales by (1 + w): its weights sit around gain - 1, the others'
        # around gain.
        center = gain - 1.0 if family.norm_plus_one else gain
        return (center + rng.standard_normal(size) * 0.1).astype(np.float32)

    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    embed_std = s.lm_head_std if tied else 1.0
    tensors = {"model.embed_tokens.weight": normal(vocab, s.hidden, std=embed_std)}
    for i in range(s.layers):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = norm_weight(s.hidden)
        tensors[p + "post_attention_layernorm.weight"] = norm_weight(
            s.hidden, family.post_norm_gain
        )
        tensors[p + "self_attn.q_proj.weight"] = normal(q, s.hidden, std=s.hidden**-0.5)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv, s.hidden, std=s.hidden**-0.5)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv, s.hidden, std=s.hidden**-0.5)
        tensors[p + "self_attn.o_proj.weight"] = normal(s.hidden, q, std=q**-0.5)
        if family.layer_tensors is not None:
            tensors.update(family.layer_tensors(p, s, normal, norm_weight))
        tensors.update((family.mlp or _dense_mlp)(p + "mlp.", s, normal))
    tensors["model.norm.weight"] = norm_weight(s.hidden)
    if not tied:
        tensors["lm_head.weight"] = normal(vocab, s.hidden, std=s.lm_head_std)
    return tensors


def _dense_mlp(prefix: str, s: TinyShape, normal: Normal) -> dict[str, np.ndarray]:
    """The SwiGLU MLP of one layer, HF's names and `[out, in]` layout."""
    return {
        prefix + "gate_proj.weight": normal(s.intermediate, s.hidden, std=s.hidden**-0.5),
        prefix + "up_proj.weight": normal(s.intermediate, s.hidden, std=s.hidden**-0.5),
        prefix + "down_proj.weight": normal(s.hidden, s.intermediate, std=s.intermediate**-0.5),
    }


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
