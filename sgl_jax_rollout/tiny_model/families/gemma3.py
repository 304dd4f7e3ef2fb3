"""The Gemma 3 text family (`--like gemma-3-1b-it`): the replica of google/gemma-3-1b-it.

Owns its preset, its config keys (the layer kinds by depth) and the tensors Gemma 3 adds to
Gemma 2's layout: the q / k norms (over head_dim) and the norms around each block's
feed-forward. Its RMSNorm scales by (1 + w).

What google/gemma-3-1b-it's config.json sets, kept at tiny sizes: `Gemma3ForCausalLM`
(model_type `gemma3_text`), head_dim 256, four query heads to one KV head, five windowed
layers to one full (`layer_types`, `sliding_window_pattern` 6: six layers at least, so one
is full), RoPE base 10,000 on the windowed layers and 1,000,000 on the full ones, no RoPE
scaling (4B and up scale linearly), query scale 256 ** -0.5, no soft-caps, tanh GeLU, tied
embeddings, `<eos>` and `<end_of_turn>` (1, 106) stopping, `<pad>` 0. The window is 256 (512
in the checkpoint), shorter than the tests' prompts. The vocabulary is the checkpoint's 262,144
ids: the trained tokenizer filled with `<unusedK>` entries (`tokenizer.filled`), so the
embedding, the logits and the sampler are as wide as the real model's.

Must not import tunix or sgl_jax.
"""

from __future__ import annotations

from typing import Any

from sgl_jax_rollout.tiny_model.families import gemma2
from sgl_jax_rollout.tiny_model.family import Family, LikePreset, Normal, NormWeight, TinyShape
from sgl_jax_rollout.tiny_model.tokenizer import GEMMA3

PERIOD = 6  # five windowed layers, then a full one

PRESETS = {
    "gemma-3-1b-it": LikePreset(
        arch="gemma3",
        hf_repo="google/gemma-3-1b-it",
        config={
            "attention_bias": False,
            "attn_logit_softcapping": None,
            "cache_implementation": "hybrid",
            "final_logit_softcapping": None,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": 256,
            "rms_norm_eps": 1e-06,
            "rope_local_base_freq": 10000,
            "rope_scaling": None,
            "rope_theta": 1000000,
            # 512 in the checkpoint: shorter than the tests' prompts (1,024 tokens; 600 for
            # LoRA, past twice the window), so the windowed layers' window is exercised.
            "sliding_window": 256,
            "sliding_window_pattern": PERIOD,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
        },
        generation={
            "cache_implementation": "hybrid",
            "do_sample": True,
            "top_k": 64,
            "top_p": 0.95,
        },
        eos_with_bos=False,
        head_dim=256,
        max_positions=32768,
        kv_heads=1,
        tokenizer_size=262144,
    ),
}


def layer_types(layers: int) -> list[str]:
    return [
        "full_attention" if (i + 1) % PERIOD == 0 else "sliding_attention" for i in range(layers)
    ]


def like_config(s: TinyShape, max_positions: int, ids: dict[str, Any]) -> dict[str, Any]:
    """Gemma 2's stops and pad (<eos> and <end_of_turn>, <pad> 0) and the layer kinds at the
    replica's depth."""
    return {**gemma2.like_config(s, max_positions, ids), "layer_types": layer_types(s.layers)}


def layer_norms(prefix: str, s: TinyShape, normal: Normal, norm_weight: NormWeight) -> dict:
    """The q / k norms (over head_dim), then Gemma 2's norms around the feed-forward block."""
    return {
        prefix + "self_attn.q_norm.weight": norm_weight(s.head_dim),
        prefix + "self_attn.k_norm.weight": norm_weight(s.head_dim),
        **gemma2.feedforward_norms(prefix, s, normal, norm_weight),
    }


FAMILY = Family(
    arch="gemma3",
    architecture="Gemma3ForCausalLM",
    model_type="gemma3_text",
    presets=PRESETS,
    vocabulary=GEMMA3,
    like_only=True,
    like_config=like_config,
    layer_tensors=layer_norms,
    norm_plus_one=True,
    post_norm_gain=gemma2.POST_NORM_GAIN,  # as Gemma 2's replica, whose norms these are
    min_layers=PERIOD,  # one full layer at least
)
