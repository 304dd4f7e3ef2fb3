"""What a family module of the tiny model fills in: `TinyShape`, `LikePreset` and `Family`.

Owns the three records that `builder` reads and each module under `families/` writes: the
sizes of a model, the config features of a real checkpoint, and an architecture family (its
config.json names, its `--like` presets, its tokenizer vocabulary and the hooks by which it
departs from the shared HF decoder layout that `builder` writes).

Must not import `builder` or a family module (they import this one), tunix or sgl_jax.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from sgl_jax_rollout.tiny_model.tokenizer import Vocabulary

# normal(*shape, std=...) and norm_weight(size, gain=1.0): `builder`'s seeded draws, which a
# family's tensor hooks call in the order its checkpoints list their tensors.
Normal = Callable[..., np.ndarray]
NormWeight = Callable[..., np.ndarray]


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
    - kv_heads: the checkpoint's KV head count where the replica keeps it (Gemma 3 1B: one),
      else the tiny shape's.
    - real, real_vocab: the checkpoint's sizes and model vocabulary (`real_size=True`).
    - tokenizer_size: the checkpoint tokenizer's length, which the replica keeps at every size
      (Gemma 3: 262,144; `tokenizer.filled`), and so the model's vocabulary.
    """

    arch: str
    hf_repo: str
    config: dict[str, Any]
    generation: dict[str, Any]
    eos_with_bos: bool
    head_dim: int
    max_positions: int | None = None
    kv_heads: int | None = None
    real: TinyShape | None = None
    real_vocab: int | None = None
    tokenizer_size: int | None = None


@dataclasses.dataclass(frozen=True)
class Family:
    """An architecture family of the tiny model; `families.FAMILIES` lists them.

    - arch: its name (`--arch`, `LikePreset.arch`); architecture, model_type: config.json's.
    - presets: its `--like` presets by name.
    - vocabulary: its tokenizer's special tokens (None: the built-in Qwen-style ones).
    - like_only: only a `--like` replica writes it, not `--arch`.
    - tiny_config(shape): config.json keys of the plain tiny model beyond the shared ones.
    - like_config(shape, max_positions, ids): a replica's config.json keys beyond the shared
      ones (the preset's own values are written over both).
    - layer_tensors(prefix, shape, normal, norm_weight): each decoder layer's tensors beyond
      the shared ones, drawn after the attention projections (biases, q / k norms, ...).
    - mlp(prefix, shape, normal): each layer's MLP tensors under `prefix` (`...mlp.`), in
      place of the shared dense SwiGLU MLP.
    - norm_plus_one: RMSNorm scales by (1 + w) (Gemma 2), so norm weights sit around gain - 1.
    - post_norm_gain: the gain of the norms on each block's output.
    - min_layers: a replica has at least this many layers.
    - own_layout(shape, vocab, ids, max_positions, dtype, tokenizer, seed): config.json,
      generation_config.json and weights of a family whose checkpoints' layout is its own
      (Gemma 4), written instead of the shared layout.
    - nest(config, tensors, seed): config.json and weights of a multimodal checkpoint around
      the language model that the shared layout wrote (`config`, `tensors`): Gemma 3 4B's.
    """

    arch: str
    architecture: str
    model_type: str
    presets: dict[str, LikePreset]
    vocabulary: Vocabulary | None = None
    like_only: bool = False
    tiny_config: Callable[[TinyShape], dict[str, Any]] | None = None
    like_config: Callable[[TinyShape, int, dict[str, Any]], dict[str, Any]] | None = None
    layer_tensors: Callable[[str, TinyShape, Normal, NormWeight], dict] | None = None
    mlp: Callable[[str, TinyShape, Normal], dict] | None = None
    norm_plus_one: bool = False
    post_norm_gain: float = 1.0
    min_layers: int = 0
    own_layout: Callable[..., tuple[dict, dict, dict]] | None = None
    nest: Callable[[dict, dict, int], tuple[dict, dict]] | None = None
